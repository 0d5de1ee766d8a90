#!/usr/bin/env python3
"""Soak benchmark: many loopback clients against one `triage serve` for minutes.

The clients mix plain chat completions, streamed ones that hang up at a random point, questions
to the routing pipeline over a corpus the script creates, and hostile requests (malformed bodies,
out-of-range parameters, forged headers). At the end the server must have answered no request
with a 5xx, leaked no KV block (blocks in use at idle == pinned corpus prefix blocks) and kept its
resident memory flat (last sample within 5 % of the first one after warm-up).

Standard library only. Usage:
    benches/soak.py --triage target/release/triage --clients 64 --duration 600
Prints one JSON object (and a Markdown row for benches/RESULTS.md) on stdout.
"""

import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HOSTILE = [
    # (body, content type, extra headers): each must get a 4xx.
    ("{", "application/json", {}),
    ('{"model": "nope", "messages": [{"role": "user", "content": "x"}]}', "application/json", {}),
    ('{"model": "MODEL", "messages": "hi"}', "application/json", {}),
    ('{"model": "MODEL", "messages": [{"role": "user", "content": "x"}], "temperature": -1}',
     "application/json", {}),
    ('{"model": "MODEL", "messages": [{"role": "user", "content": "x"}], "repetition_penalty": 1e-45}',
     "application/json", {}),
    ('{"model": "MODEL", "messages": [{"role": "user", "content": "x"}], "max_tokens": 10000000}',
     "application/json", {}),
    ('{"model": "MODEL", "messages": [{"role": "user", "content": "x"}]}', "text/plain", {}),
    ('{"model": "MODEL", "messages": [{"role": "user", "content": "x"}]}', "application/json",
     {"Host": "evil.example"}),
    ('{"model": "triage", "messages": [{"role": "user", "content": "x"}], "triage": {"corpus": "nope"}}',
     "application/json", {}),
    ('{"model": "triage", "messages": [{"role": "user", "content": "x"}], "n": 3, "triage": {"corpus": "CORPUS"}}',
     "application/json", {}),
    ("[" * 4000 + "]" * 4000, "application/json", {}),
]

QUESTIONS = [
    "What erupts from a volcano?", "What pulls the tides?", "What makes bread rise?",
    "Where does the Seine flow?", "What shades the forest floor?", "What moves the dunes?",
]

DOCUMENTS = [
    {"id": "volcano", "text": "Magma rises through the crust and erupts from the volcano as lava."},
    {"id": "tides", "text": "The moon pulls the oceans, and the tides rise and fall twice a day."},
    {"id": "bread", "text": "Yeast ferments the dough, which rises before the bread is baked."},
    {"id": "seine", "text": "The Seine flows through Paris to the English Channel at Le Havre."},
    {"id": "forest", "text": "Old trees shade the forest floor, where ferns grow in the cool air."},
    {"id": "desert", "text": "The wind moves the dunes across the desert a few metres a year."},
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, body=None, content_type="application/json", headers=None,
            timeout=600):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"Content-Type": content_type} if body is not None else {}
    h.update(headers or {})
    conn.request(method, path, body=body, headers=h)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data


def metrics(port):
    status, data = request(port, "GET", "/metrics", timeout=30)
    out = {}
    for line in data.decode().splitlines():
        m = re.match(r'^(triage_\w+)\{model="([^"]+)"\} (\S+)$', line)
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.latency = {}
        self.status = {}
        self.unexpected = []

    def record(self, kind, status, seconds=None, expected=None):
        with self.lock:
            self.status.setdefault(kind, {}).setdefault(status, 0)
            self.status[kind][status] += 1
            if seconds is not None:
                self.latency.setdefault(kind, []).append(seconds)
            if status >= 500 or (expected and not expected(status)):
                if len(self.unexpected) < 20:
                    self.unexpected.append((kind, status))


def chat_body(model, stream, max_tokens):
    return json.dumps({
        "model": model,
        "messages": [{"role": "user", "content": random.choice(QUESTIONS)}],
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "stream": stream,
    })


def do_chat(port, model, stats):
    t = time.monotonic()
    status, _ = request(port, "POST", "/v1/chat/completions", chat_body(model, False, 16))
    stats.record("chat", status, time.monotonic() - t if status == 200 else None,
                 lambda s: s in (200, 429))


def do_stream(port, model, stats):
    """Stream an answer and hang up after a random number of events (or read it all)."""
    t = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/chat/completions", body=chat_body(model, True, 64),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        r.read()
        conn.close()
        stats.record("stream", r.status, expected=lambda s: s == 429)
        return
    hang_up = random.random() < 0.5
    events = random.randint(1, 6)
    seen = 0
    while True:
        line = r.readline()
        if not line or line.strip() == b"data: [DONE]":
            break
        if line.startswith(b"data:"):
            if b'"error"' in line:
                stats.record("stream", 599)
                break
            seen += 1
            if hang_up and seen >= events:
                # Close the socket under the response: the server sees a disconnect.
                conn.sock.shutdown(socket.SHUT_RDWR)
                break
    conn.close()
    stats.record("stream_hangup" if hang_up else "stream", 200,
                 None if hang_up else time.monotonic() - t)


def do_routed(port, corpus, stats):
    body = json.dumps({
        "model": "triage",
        "messages": [{"role": "user", "content": random.choice(QUESTIONS)}],
        "max_tokens": 16,
        "triage": {"corpus": corpus},
    })
    t = time.monotonic()
    status, _ = request(port, "POST", "/v1/chat/completions", body)
    stats.record("routed", status, time.monotonic() - t if status == 200 else None,
                 lambda s: s in (200, 429))


def do_hostile(port, model, corpus, stats):
    body, content_type, headers = random.choice(HOSTILE)
    body = body.replace("MODEL", model).replace("CORPUS", corpus)
    status, _ = request(port, "POST", "/v1/chat/completions", body, content_type, headers)
    stats.record("hostile", status, expected=lambda s: 400 <= s < 500 and s != 429)


def client(port, model, corpus, deadline, stats, seed, only=None):
    random.seed(seed)
    start = {"chat": 0.0, "stream": 0.35, "routed": 0.60, "hostile": 0.80}
    while time.monotonic() < deadline:
        roll = start[only] + 0.01 if only else random.random()
        try:
            if roll < 0.35:
                do_chat(port, model, stats)
            elif roll < 0.60:
                do_stream(port, model, stats)
            elif roll < 0.80:
                do_routed(port, corpus, stats)
            else:
                do_hostile(port, model, corpus, stats)
        except (OSError, http.client.HTTPException) as e:
            stats.record("transport_error", 0, expected=lambda s: False)
            print(f"client {seed}: {e!r}", file=sys.stderr)


def percentile(values, q):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def wait_idle(port, timeout=300):
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        m = metrics(port)
        busy = sum(v for (name, _), v in m.items()
                   if name in ("triage_requests_running", "triage_requests_waiting"))
        if busy == 0:
            return m
        time.sleep(1)
    raise SystemExit("the server never went idle")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--triage", default="target/release/triage")
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration", type=float, default=600, help="seconds of load")
    ap.add_argument("--warmup", type=float, default=60,
                    help="seconds after which the first memory sample is taken")
    ap.add_argument("--kv-budget", default="1GiB")
    ap.add_argument("--only", choices=["chat", "stream", "routed", "hostile"],
                    help="send one kind of request only (to find what memory growth follows)")
    args = ap.parse_args()

    port = free_port()
    work = tempfile.mkdtemp(prefix="triage-soak-")
    config = os.path.join(work, "soak.toml")
    with open(config, "w") as f:
        f.write(f'port = {port}\nmax_pending_requests = 1024\n\n'
                f'[[models]]\nname = "{args.model}"\nrole = "base"\n'
                f'kv_budget = "{args.kv_budget}"\nmax_num_seqs = 64\n')
    log = open(os.path.join(work, "server.log"), "w")
    server = subprocess.Popen([args.triage, "serve", "--config", config], stdout=log,
                              stderr=subprocess.STDOUT)
    try:
        start = time.monotonic()
        while True:
            try:
                if request(port, "GET", "/health", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() - start > 600:
                raise SystemExit(f"the server did not start; see {log.name}")
            time.sleep(0.5)
        corpus = f"soak-{os.getpid()}"
        status, body = request(port, "POST", "/v1/corpora",
                               json.dumps({"name": corpus, "documents": DOCUMENTS}))
        if status != 201:
            raise SystemExit(f"creating the corpus: {status} {body[:300]!r}")

        stats = Stats()
        deadline = time.monotonic() + args.duration
        threads = [threading.Thread(target=client,
                                    args=(port, args.model, corpus, deadline, stats, i, args.only))
                   for i in range(args.clients)]
        for t in threads:
            t.start()
        samples = []
        load_start = time.monotonic()
        while any(t.is_alive() for t in threads):
            samples.append((time.monotonic() - load_start, rss_kib(server.pid)))
            time.sleep(5)
        for t in threads:
            t.join()
        idle = wait_idle(port)
        samples.append((time.monotonic() - load_start, rss_kib(server.pid)))
        used = idle.get(("triage_kv_blocks_used", args.model), -1)
        pinned = idle.get(("triage_kv_blocks_pinned", args.model), -1)
        warm = [kib for t, kib in samples if t >= args.warmup] or [samples[-1][1]]
        rss_start, rss_end = warm[0], samples[-1][1]
        request(port, "DELETE", f"/v1/corpora/{corpus}")
        all_latency = [x for v in stats.latency.values() for x in v]
        n_requests = sum(sum(v.values()) for v in stats.status.values())
        n_5xx = sum(n for v in stats.status.values() for s, n in v.items() if s >= 500)
        result = {
            "clients": args.clients,
            "duration_s": args.duration,
            "model": args.model,
            "requests": n_requests,
            "status_by_kind": {k: {str(s): n for s, n in sorted(v.items())}
                               for k, v in sorted(stats.status.items())},
            "p50_s": percentile(all_latency, 0.50),
            "p99_s": percentile(all_latency, 0.99),
            "p50_s_by_kind": {k: percentile(v, 0.5) for k, v in sorted(stats.latency.items())},
            "p99_s_by_kind": {k: percentile(v, 0.99) for k, v in sorted(stats.latency.items())},
            "count_5xx": n_5xx,
            "unexpected": stats.unexpected,
            "kv_blocks_used_idle": used,
            "kv_blocks_pinned_idle": pinned,
            "leaked_blocks": used - pinned,
            "rss_mib_after_warmup": round(rss_start / 1024, 1),
            "rss_mib_end": round(rss_end / 1024, 1),
            "rss_change": round((rss_end - rss_start) / max(rss_start, 1), 4),
            "rss_mib_every_30_s": [round(kib / 1024) for t, kib in samples[::6]],
        }
        print(json.dumps(result, indent=2))
        print(f"| {args.clients} | {args.duration:.0f} s | {n_requests} | "
              f"{result['p50_s']:.2f} s | {result['p99_s']:.2f} s | {n_5xx} | "
              f"{result['leaked_blocks']:.0f} | {result['rss_mib_after_warmup']} → "
              f"{result['rss_mib_end']} MiB ({100 * result['rss_change']:+.1f} %) |")
        ok = n_5xx == 0 and result["leaked_blocks"] == 0 and abs(result["rss_change"]) <= 0.05
        sys.exit(0 if ok and not stats.unexpected else 1)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    main()
