"""Helpers of scripts/device-check: compare two `triage generate --json` outputs (device vs CPU),
pull numbers out of the benchmarks' JSON, and print the summary table. Every row goes to
summary.jsonl as {"step", "result", "ok"}; `table` prints them as Markdown.

    report.py parity NAME DEVICE.json CPU.json SUMMARY --min-equal N --logprob-tol X
    report.py ops NAME TEST.log SUMMARY
    report.py bench BENCH.log SUMMARY
    report.py profile NAME NCU.txt SUMMARY
    report.py e2e DECODE.json GRAPHS.json LAYERS PREFIX2K.json PREFIX32K.json HF.json SUMMARY
    report.py table SUMMARY
"""
import json
import re
import sys


def add(summary, step, result, ok):
    with open(summary, "a") as f:
        f.write(json.dumps({"step": step, "result": result, "ok": ok}) + "\n")
    print(f"device-check: {step}: {result} [{'ok' if ok else 'FAIL'}]")


def load(path):
    with open(path) as f:
        text = f.read().strip()
    return json.loads(text.splitlines()[-1]) if text else {}


def parity(name, dev_path, cpu_path, summary, min_equal, logprob_tol):
    dev, cpu = load(dev_path), load(cpu_path)
    a = [t["id"] for t in dev.get("tokens", [])]
    b = [t["id"] for t in cpu.get("tokens", [])]
    equal = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    lp = [abs(x["logprob"] - y["logprob"]) for x, y in zip(dev["tokens"][:equal], cpu["tokens"][:equal])]
    ent = [abs(x["entropy"] - y["entropy"]) for x, y in zip(dev["tokens"][:equal], cpu["tokens"][:equal])]
    worst_lp = max(lp, default=0.0)
    worst_ent = max(ent, default=0.0)
    ok = len(a) == len(b) and len(a) > 0 and equal >= min(min_equal, len(a)) and worst_lp <= logprob_tol
    result = (f"{equal}/{len(b)} greedy tokens equal before the first difference; "
              f"largest logprob difference {worst_lp:.2e}, entropy difference {worst_ent:.2e} over them")
    add(summary, name, result, ok)


def ops(name, log, summary):
    text = open(log).read()
    passed = sum(int(m) for m in re.findall(r"(\d+) passed", text))
    failed = sum(int(m) for m in re.findall(r"(\d+) failed", text))
    ok = failed == 0 and passed > 0 and "test result: ok" in text
    add(summary, f"tests: {name}", f"{passed} passed, {failed} failed", ok)


def bench(log, summary):
    rows = [json.loads(l) for l in open(log) if l.startswith("{")]
    for r in rows:
        if "fused_ms" in r:
            # "ok" says the benchmark ran; whether it met the goals is in the text.
            met = r["fraction_of_copy_bandwidth"] >= 0.5 and r["speedup_over_unfused"] >= 3.0
            add(summary, r["case"],
                f"{r['fused_ms']:.3f} ms, {100 * r['fraction_of_copy_bandwidth']:.0f} % of copy "
                f"bandwidth ({r['copy_gbps']:.0f} GB/s; goal >= 50 %), "
                f"{r['speedup_over_unfused']:.1f}x over the unfused chain (goal >= 3x): "
                f"goals {'met' if met else 'missed'}",
                True)
        else:
            goal = ""
            if "32768" in r["case"]:
                met = r["fraction_of_copy_bandwidth"] >= 0.5
                goal = f" (goal at 32k >= 50 %: {'met' if met else 'missed'})"
            add(summary, r["case"],
                f"{r['ms']:.3f} ms, {r['kv_gbps']:.0f} GB/s of KV, "
                f"{100 * r['fraction_of_copy_bandwidth']:.0f} % of copy bandwidth{goal}", True)
    if not rows:
        add(summary, "microbenchmarks", "no output", False)


def profile(name, log, summary):
    """An ncu report: the kernel's duration and its throughput against the memory peak."""
    text = open(log).read()
    duration = re.search(r"^\s*Duration\s+(\S+)\s+(\S+)", text, re.M)
    memory = re.search(r"^\s*Memory Throughput\s+%\s+(\S+)", text, re.M)
    if duration is None:
        add(summary, name, "no profile (see the log)", False)
        return
    result = f"{duration.group(2)} {duration.group(1)}"
    if memory is not None:
        result += f", memory throughput {memory.group(1)} % of peak"
    add(summary, name, result, True)


def decode_rows(label, decode, hf, summary):
    """Aggregate decode tokens/s per concurrency, the single stream against transformers."""
    by_c = {r["concurrency"]: r["tokens_per_s"] for r in decode}
    single = by_c.get(1)
    if single is not None and "tokens_per_s" in hf:
        ratio = single / hf["tokens_per_s"]
        add(summary, f"decode {label}, 1 stream vs transformers",
            f"{single:.1f} vs {hf['tokens_per_s']:.1f} tokens/s = {ratio:.2f}x (goal >= 5x and "
            f">= 400 tokens/s on an H200: {'met' if ratio >= 5.0 and single >= 400 else 'missed'})",
            True)
    elif single is not None:
        add(summary, f"decode {label}, 1 stream",
            f"{single:.1f} tokens/s; transformers: {hf.get('skipped', 'no result')}", True)
    else:
        add(summary, f"decode {label}, 1 stream", "no result", False)
    for c, tps in sorted(by_c.items()):
        if c != 1:
            add(summary, f"decode {label}, {c} streams", f"{tps:.1f} tokens/s aggregate", True)


def graph_nodes(decode, layers, summary):
    """Nodes per captured bucket: the launches, copies and memsets of one graphed step."""
    budget = 12 * layers + 10
    for r in decode:
        for rows, nodes in r.get("graph_nodes", []):
            add(summary, f"graph nodes, {rows}-row bucket",
                f"{nodes} nodes for {layers} layers = {nodes / layers:.1f} a layer "
                f"(goal <= {budget}: {'met' if nodes <= budget else 'missed'})", True)


def e2e(decode_path, graphs_path, layers, p2k_path, p32k_path, hf_path, summary):
    hf = load(hf_path)
    decode_rows("eager", load(decode_path).get("results", []), hf, summary)
    graphed = load(graphs_path).get("results", [])
    decode_rows("graphed", graphed, hf, summary)
    graph_nodes(graphed, int(layers), summary)
    for path in (p2k_path, p32k_path):
        p = load(path)
        if "cold_ttft_ms" not in p:
            add(summary, f"prefill ({path.rsplit('/', 1)[-1]})", "no result", False)
            continue
        n = p["prefix_tokens"] + p["question_tokens"]
        add(summary, f"prefill {p['prefix_tokens']} + {p['question_tokens']} tokens",
            f"{n / (p['cold_ttft_ms'] / 1e3):.0f} tokens/s cold; cached-prefix TTFT "
            f"{p['cached_ttft_ms']:.1f} ms ({p['speedup']:.0f}x)", True)


def table(summary):
    rows = [json.loads(l) for l in open(summary)]
    print("\n| step | result | ok |\n|---|---|---|")
    for r in rows:
        print(f"| {r['step']} | {r['result']} | {'yes' if r['ok'] else '**no**'} |")
    failed = [r for r in rows if not r["ok"]]
    print(f"\n{len(rows) - len(failed)}/{len(rows)} rows ok")
    return 1 if failed else 0


def main(argv):
    cmd, rest = argv[1], argv[2:]
    if cmd == "parity":
        name, dev, cpu, summary = rest[:4]
        opts = dict(zip(rest[4::2], rest[5::2]))
        parity(name, dev, cpu, summary, int(opts.get("--min-equal", 16)),
               float(opts.get("--logprob-tol", 0.05)))
    elif cmd == "ops":
        ops(*rest)
    elif cmd == "bench":
        bench(*rest)
    elif cmd == "profile":
        profile(*rest)
    elif cmd == "e2e":
        e2e(*rest)
    elif cmd == "table":
        return table(*rest)
    else:
        raise SystemExit(f"unknown command {cmd}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
