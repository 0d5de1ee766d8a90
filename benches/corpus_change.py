#!/usr/bin/env python3
"""Corpus-change latency against the default `triage serve` (issue 52).

Starts the server (default models unless `--config`), creates a corpus of `--documents`
paragraphs, waits for its long-context prefix to be pinned, then replays the case of issue 52: a
document with a 10 KB id (must be a 400), then two small changes, an append and an update of the
first document (which re-pins the whole prefix). For each change it prints the change's own
latency, how long after it returned its prefix was pinned in the background (`GET
/v1/corpora/{name}` polled every 50 ms), and a question asked right after it (auto routing: it
answers by RAG with the reason recorded while the prefix is being pinned).

Standard library only. Usage:
    benches/corpus_change.py --triage target/release/triage [--documents 40]
Prints one JSON object (and Markdown rows for benches/RESULTS.md) on stdout.
"""

import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time


def request(port, method, path, body=None, timeout=600):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = None if body is None else json.dumps(body)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    started = time.monotonic()
    conn.request(method, path, body=data, headers=headers)
    response = conn.getresponse()
    text = response.read().decode()
    elapsed = time.monotonic() - started
    conn.close()
    return response.status, json.loads(text) if text else None, elapsed


def paragraph(i):
    return (f"Record {i}. The harbour master logged vessel {i * 7 % 97} arriving at berth {i % 13} "
            f"with {i * 31 % 500} tonnes of grain; the tide that morning stood at {i % 5}.{i % 10} "
            f"metres and the pilot was relieved at {8 + i % 9} o'clock.")


def wait_pinned(port, name, deadline_s):
    start = time.monotonic()
    while True:
        status, corpus, _ = request(port, "GET", f"/v1/corpora/{name}")
        assert status == 200, corpus
        if corpus["pin"]["state"] != "pinning":
            return corpus, time.monotonic() - start
        if time.monotonic() - start > deadline_s:
            raise SystemExit(f"still pinning after {deadline_s} s: {corpus}")
        time.sleep(0.05)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--triage", default="target/release/triage")
    ap.add_argument("--config")
    ap.add_argument("--documents", type=int, default=40)
    args = ap.parse_args()
    home = tempfile.mkdtemp(prefix="corpus-change-")
    env = dict(os.environ)
    # Models stay where `models fetch` put them; corpora and prefixes go to a scratch folder.
    config = os.path.join(home, "serve.toml")
    with open(config, "w") as f:
        if args.config:
            f.write(open(args.config).read())
        f.write(f'\n[pipeline]\ndata_dir = "{home}"\nprefix_dir = "{home}/prefixes"\n'
                if not args.config else "")
    cmd = [args.triage, "serve", "--config", config, "--port", "0"]
    server = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    port = None
    for line in server.stderr:
        m = re.search(r"addr=\S*:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        raise SystemExit("the server did not start")
    try:
        docs = [{"id": f"r{i}", "title": f"record {i}", "text": paragraph(i)}
                for i in range(args.documents)]
        status, created, create_s = request(port, "POST", "/v1/corpora",
                                            {"name": "docs", "documents": docs})
        assert status == 201, created
        corpus, first_pin_s = wait_pinned(port, "docs", 3600)
        rows = [{"change": f"create ({args.documents} documents)", "status": status,
                 "change_s": create_s, "pin_s": first_pin_s,
                 "prefix_tokens": corpus["prefix_tokens"], "pin": corpus["pin"]}]
        status, refused, refused_s = request(port, "POST", "/v1/corpora/docs/documents",
                                             {"documents": [{"id": "x" * 10_000, "text": "a"}]})
        assert status == 400, refused
        rows.append({"change": "10 KB id", "status": status, "change_s": refused_s,
                     "error": refused["error"]["message"][:80]})
        changes = [
            ("append one document", [{"id": "new", "text": paragraph(10_001)}]),
            ("update the first document", [{"id": "r0", "title": "record 0",
                                            "text": paragraph(10_002)}]),
        ]
        for name, documents in changes:
            status, changed, change_s = request(port, "POST", "/v1/corpora/docs/documents",
                                                {"documents": documents})
            assert status == 200, changed
            returned = time.monotonic()
            pin_at_return = changed["result"]["corpus"]["pin"]
            status, answer, ask_s = request(port, "POST", "/v1/chat/completions", {
                "model": "triage", "max_tokens": 16,
                "messages": [{"role": "user", "content": "Which berth did vessel 7 use?"}],
                "triage": {"corpus": "docs"}})
            assert status == 200, answer
            record = answer["triage"]["route"]
            corpus, _ = wait_pinned(port, "docs", 3600)
            pin_s = time.monotonic() - returned  # from the change's answer to the pin's end
            rows.append({"change": name, "status": status, "change_s": change_s,
                         "pin_at_return": pin_at_return, "pin_s": pin_s, "pin": corpus["pin"],
                         "reused_tokens": corpus.get("reused_tokens"),
                         "question_during_pin": {"path": record["path"], "seconds": ask_s,
                                                 "lc_unavailable": record.get("long_context_unavailable")}})
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    print(json.dumps({"rows": rows}, indent=1))
    print()
    print("| change | status | change returned | prefix pinned after | pin |")
    print("|---|---|---|---|---|")
    for r in rows:
        pin = r.get("pin", {})
        pinned = (f"{pin.get('tokens')} tokens from {pin.get('from')}"
                  + (f", {r['reused_tokens']} reused" if r.get("reused_tokens") else "")) if pin else "—"
        pin_s = f"{r['pin_s']:.1f} s" if "pin_s" in r else "—"
        print(f"| {r['change']} | {r['status']} | {r['change_s'] * 1000:.0f} ms | {pin_s} | {pinned} |")


if __name__ == "__main__":
    sys.exit(main())
