"""Helpers of scripts/device-check: compare two `triage generate --json` outputs (device vs CPU),
pull numbers out of the benchmarks' JSON, and print the summary table. Every row goes to
summary.jsonl as {"step", "result", "ok"}; `table` prints them as Markdown.

    report.py parity NAME DEVICE.json CPU.json SUMMARY --min-equal N --logprob-tol X
    report.py ops NAME TEST.log SUMMARY
    report.py bench BENCH.log SUMMARY [--sdpa SDPA.json]
    report.py profile NAME NCU.txt SUMMARY
    report.py sdpa SDPA.json SUMMARY [--allow-skip]
    report.py decode DECODE.json GRAPHS.json LAYERS HF.json SUMMARY
    report.py prefill SHAPE PEER.json SUMMARY PREFIX.json... [--gpu GPU.txt] [--allow-skip]
    report.py escalate ESCALATE.json SUMMARY [--gpu GPU.txt]
    report.py skipped STEP WHY SUMMARY
    report.py table SUMMARY

"ok" says a step ran and, where it checks something (tests, parity, an escalation's bookkeeping),
that it held; speed goals are stated in the text as met or missed. The goals are issue 49's, for
an H200 and the 1.5B shape; on an H100 (`--gpu` names the card) the absolute figures scale by 0.7
(throughputs times 0.7, latencies divided by it). `--allow-skip` (the dry run) lets a peer that
found no torch here pass.
"""
import json
import re
import sys

# bf16 logits: within 10 % of the logits' scale (benches/RESULTS.md, the first H200 run: triage's
# bf16 7.0 % and transformers' own bf16 8.7 % from f64 on the 0.5B shape).
BF16_LOGITS_BOUND = 0.10


def add(summary, step, result, ok):
    with open(summary, "a") as f:
        f.write(json.dumps({"step": step, "result": result, "ok": ok}) + "\n")
    print(f"device-check: {step}: {result} [{'ok' if ok else 'FAIL'}]")


def load(path):
    """The last JSON line of a step's output; {} where the step left none (it timed out, failed
    or never ran)."""
    try:
        with open(path) as f:
            text = f.read().strip()
        return json.loads(text.splitlines()[-1]) if text else {}
    except (OSError, ValueError):
        return {}


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


def model_size(shape):
    """'0.5b' of "qwen2.5-0.5b" or "0.5B": how device_bench and the peer name a shape alike."""
    return str(shape).lower().rsplit("-", 1)[-1]


# prefill_attention against the row kernel on the same bf16 inputs (device_bench: standard normal
# Q, K, V): P rounded to bf16 moves an output (a mean of values up to ~4) by up to ~4 · 2^-8.
ROW_KERNEL_PARITY = 0.05


def prefill_vs_sdpa(r, sdpa_path, summary):
    """The hook for device_bench's prefill-attention rows: a row {"case": "prefill attention ...",
    "shape": "1.5B" (or "qwen2.5-1.5b"), "tokens": N, "ms": M} timing one layer's causal
    attention over N tokens for all heads is held to the same run's flash SDPA on that shape and
    length (sdpa_peer.py's JSON, step 3). Goal at 32k: >= 50 % of SDPA's throughput."""
    peer = load(sdpa_path) if sdpa_path else {}
    match = [p for p in peer.get("results", [])
             if model_size(p.get("shape")) == model_size(r.get("shape"))
             and p.get("tokens") == r.get("tokens") and "ms" in p]
    # Up to 8k the same run also times the row kernel on the same inputs: the new kernel must
    # agree with it within the bf16 rounding of P (judged), and the speedup is reported.
    ok, rows = True, ""
    if "max_abs_diff_vs_row_kernel" in r:
        diff = r["max_abs_diff_vs_row_kernel"]
        ok = diff <= ROW_KERNEL_PARITY
        rows = (f"; row kernel {r['row_kernel_ms']:.3f} ms ({r['speedup_over_row_kernel']:.1f}x "
                f"slower), max difference {diff:.2e} (bound {ROW_KERNEL_PARITY})")
    if not match:
        why = peer.get("skipped") or "no SDPA result at this shape and length"
        add(summary, r["case"], f"{r['ms']:.3f} ms; SDPA: {why}{rows}", ok)
        return
    ratio = match[0]["ms"] / r["ms"]
    goal = ""
    if r["tokens"] >= 32000:
        goal = f" (goal at 32k >= 50 %: {'met' if ratio >= 0.5 else 'missed'})"
    add(summary, r["case"],
        f"{r['ms']:.3f} ms vs SDPA ({peer['backend']}) {match[0]['ms']:.3f} ms = "
        f"{100 * ratio:.0f} % of its throughput ({match[0]['tflops']:.3g} TFLOP/s){goal}{rows}", ok)


def bench(log, summary, sdpa_path=None):
    rows = [json.loads(l) for l in open(log) if l.startswith("{")]
    for r in rows:
        if r.get("case", "").startswith("prefill attention"):
            prefill_vs_sdpa(r, sdpa_path, summary)
        elif "fused_ms" in r:
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


def decode(decode_path, graphs_path, layers, hf_path, summary):
    hf = load(hf_path)
    decode_rows("eager", load(decode_path).get("results", []), hf, summary)
    graphed = load(graphs_path).get("results", [])
    decode_rows("graphed", graphed, hf, summary)
    graph_nodes(graphed, int(layers), summary)


def card_scale(gpu_path):
    """How the issue's H200 goals scale on this card: 1 on an H200, 0.7 on an H100, None where
    no GPU is named (the dry run: no goal is judged)."""
    try:
        text = open(gpu_path).read() if gpu_path else ""
    except OSError:
        text = ""
    if "H200" in text:
        return 1.0, "H200"
    if "H100" in text:
        return 0.7, "H100, goals x0.7"
    return None, None


def goal_text(value, goal, scale, higher_is_better, unit):
    """' (goal ...: met|missed)' for a goal stated for an H200, or '' off a named GPU."""
    factor, card = scale
    if factor is None:
        return ""
    target = goal * factor if higher_is_better else goal / factor
    met = value >= target if higher_is_better else value <= target
    sign = ">=" if higher_is_better else "<="
    return f" (goal {sign} {target:,.0f} {unit} on the {card}: {'met' if met else 'missed'})"


# Issue 49's goals on the 1.5B shape, by prefix length: cold prefill tokens/s, cached TTFT ms.
PREFILL_GOALS = {2048: 50_000, 32000: 30_000}
CACHED_TTFT_GOAL = {32000: 25.0}
HANDOFF_GOAL_MS = 50.0


def prefill_row(shape, p, scale, longest, summary):
    """Cold prefill rate; for the longest prefix also the cached-prefix TTFT."""
    n = p["prefix_tokens"] + p["question_tokens"]
    tps = n / (p["cold_ttft_ms"] / 1e3)
    judged = shape == "qwen2.5-1.5b"
    goal = PREFILL_GOALS.get(p["prefix_tokens"]) if judged else None
    add(summary, f"prefill {shape}, {n:,} tokens",
        f"{tps:,.0f} tokens/s cold ({p['cold_ttft_ms']:.1f} ms)"
        + (goal_text(tps, goal, scale, True, "tokens/s") if goal else ""), True)
    ttft_goal = CACHED_TTFT_GOAL.get(p["prefix_tokens"]) if judged else None
    if longest:
        add(summary, f"cached-prefix TTFT {shape}, {p['prefix_tokens']:,}-token prefix",
            f"{p['cached_ttft_ms']:.1f} ms ({p['speedup']:.0f}x the cold TTFT)"
            + (goal_text(p["cached_ttft_ms"], ttft_goal, scale, False, "ms") if ttft_goal else ""),
            True)
    return n, tps


def logits_row(shape, n, p, peer_row, summary):
    """triage's greedy first token against transformers' last-position distribution on the same
    ids: the logprob each gives that token, within the bf16 bound of the logits' scale."""
    step = f"logits vs transformers (sdpa) {shape}, {n:,} tokens"
    last = peer_row.get("last")
    if last is None:
        add(summary, step, f"transformers: {peer_row.get('error', 'no result')}", False)
        return
    t = p["cold_first_token"]
    theirs = dict((i, lp) for i, lp in last["top"])
    bound = BF16_LOGITS_BOUND * last["scale"]
    if t["id"] not in theirs:
        add(summary, step, f"triage's token {t['id']} is not in transformers' top "
            f"{len(theirs)} (its argmax {last['argmax']})", False)
        return
    diff = abs(t["logprob"] - theirs[t["id"]])
    same = "the same" if t["id"] == last["argmax"] else f"transformers' argmax {last['argmax']}"
    add(summary, step,
        f"token {t['id']} ({same}): logprob {t['logprob']:.3f} vs {theirs[t['id']]:.3f}, "
        f"difference {diff:.2e} (bound {bound:.2f}: 10 % of the logits' scale "
        f"{last['scale']:.1f}); entropy {t['entropy']:.3f} vs {last['entropy']:.3f}",
        diff <= bound)


def prefill(shape, peer_path, summary, prefix_paths, gpu=None, allow_skip=False):
    """Cold prefill rate and cached-prefix TTFT per `bench prefix` run, then transformers' prefill
    of the same prompt ids: its rate, and triage's first token held to its logits."""
    scale = card_scale(gpu)
    peer = load(peer_path)
    by_tokens = {r["tokens"]: r for r in peer.get("results", [])}
    for i, path in enumerate(prefix_paths):
        p = load(path)
        if "cold_ttft_ms" not in p:
            add(summary, f"prefill {shape} ({path.rsplit('/', 1)[-1]})",
                "no result (timed out or failed: see its .err)", False)
            continue
        n, tps = prefill_row(shape, p, scale, i == len(prefix_paths) - 1, summary)
        if "skipped" in peer:
            add(summary, f"transformers prefill (sdpa) {shape}, {n:,} tokens",
                f"skipped: {peer['skipped']}", allow_skip)
            continue
        row = by_tokens.get(n, {"error": "no run at this length"})
        if "tokens_per_s" in row:
            add(summary, f"transformers prefill (sdpa) {shape}, {n:,} tokens",
                f"{row['tokens_per_s']:,.0f} tokens/s ({row['ms']:.1f} ms); triage "
                f"{tps / row['tokens_per_s']:.2f}x of it", True)
        logits_row(shape, n, p, row, summary)


# The first token's logprob through the tensor-core kernel against the row kernel, the same model
# and prompt: P's bf16 rounding moves the attention outputs, and through 24-28 layers the logits
# move by a few bf16 steps of a logit's magnitude (~10), as for the device-vs-CPU parity rows.
ROW_KERNEL_LOGPROB_TOL = 0.1


def rows_parity(shape, kernel_path, rows_path, summary):
    """The same cold prefill with TRIAGE_PREFILL_ATTENTION=rows: the first token must be the same
    and its logprob within ROW_KERNEL_LOGPROB_TOL (judged)."""
    a, b = load(kernel_path), load(rows_path)
    step = f"logits parity {shape}: tensor-core prefill vs the row kernel"
    if "cold_first_token" not in a or "cold_first_token" not in b:
        add(summary, step, "no result (see the .err files)", False)
        return
    ta, tb = a["cold_first_token"], b["cold_first_token"]
    diff = abs(ta["logprob"] - tb["logprob"])
    ok = ta["id"] == tb["id"] and diff <= ROW_KERNEL_LOGPROB_TOL
    n = a["prefix_tokens"] + a["question_tokens"]
    add(summary, step,
        f"{n:,} tokens: first token {ta['id']} vs {tb['id']}, logprob difference {diff:.3g} "
        f"(bound {ROW_KERNEL_LOGPROB_TOL}); row kernel cold {b['cold_ttft_ms']:.1f} ms vs "
        f"{a['cold_ttft_ms']:.1f} ms", ok)


def escalate(path, summary, gpu=None):
    """The escalation end to end: it happened on τ within the first tokens, the pinned blocks
    were reused and only the question was prefilled (judged); the handoff against the goal."""
    r = load(path)
    step = "escalation over a pinned prefix"
    if "handoff_ms" not in r:
        add(summary, step, "no result (timed out or failed: see escalate.err)", False)
        return
    lc = r["lc_model"].rstrip("/").rsplit("/", 1)[-1]
    base = r["model"].rstrip("/").rsplit("/", 1)[-1]
    step = f"escalation {base} -> {lc}, {r['prefix_tokens']:,}-token pinned prefix"
    ok = (r["escalated"] and r["handoff_ms"] is not None and r["prefix_blocks_reused"] > 0
          and r["tokens_prefilled_on_escalation"] < r["prefix_tokens"]
          and "exceeded" in r["reason"])
    handoff = ("no handoff" if r["handoff_ms"] is None else f"handoff {r['handoff_ms']:.1f} ms"
               + goal_text(r["handoff_ms"], HANDOFF_GOAL_MS, card_scale(gpu), False, "ms"))
    add(summary, step,
        f"{handoff}; {r['prefix_blocks_reused']} pinned blocks ({r['block_size']} tokens each) "
        f"reused, {r['tokens_prefilled_on_escalation']} of {r['lc_prompt_tokens']:,} prompt "
        f"tokens prefilled; {r['reason']} (τ {r['tau']}, mean entropy {r['mean_entropy']:.3f} "
        f"over the first tokens); pinning took {r['pin_ms']:.0f} ms", ok)


def sdpa(path, summary, allow_skip=False):
    """The peer's flash attention per shape and length."""
    peer = load(path)
    if "results" not in peer:
        why = peer.get("skipped", "no result (see sdpa.err)")
        add(summary, "SDPA peer", f"skipped: {why}" if "skipped" in peer else why,
            allow_skip and "skipped" in peer)
        return
    for r in peer["results"]:
        step = (f"SDPA {peer['backend']} {r['shape']} ({r['heads']}/{r['kv_heads']} heads x "
                f"{r['head_dim']}), {r['tokens']:,} tokens causal")
        if "ms" not in r:
            add(summary, step, r.get("error", "no result"), False)
            continue
        add(summary, step, f"{r['ms']:.3f} ms, {r['tflops']:.3g} TFLOP/s ({r['gqa']}, "
            f"{peer['dtype'].replace('torch.', '')})", True)


def skipped(step, why, summary):
    add(summary, step, f"skipped: {why}", True)


def table(summary):
    rows = [json.loads(l) for l in open(summary)]
    print("\n| step | result | ok |\n|---|---|---|")
    for r in rows:
        print(f"| {r['step']} | {r['result']} | {'yes' if r['ok'] else '**no**'} |")
    failed = [r for r in rows if not r["ok"]]
    print(f"\n{len(rows) - len(failed)}/{len(rows)} rows ok")
    return 1 if failed else 0


def split_options(rest, flags=("--allow-skip",)):
    """Positional arguments, and `--name value` options (`--allow-skip` takes no value)."""
    args, opts, i = [], {}, 0
    while i < len(rest):
        if rest[i] in flags:
            opts[rest[i]] = True
            i += 1
        elif rest[i].startswith("--"):
            opts[rest[i]] = rest[i + 1]
            i += 2
        else:
            args.append(rest[i])
            i += 1
    return args, opts


def main(argv):
    cmd, rest = argv[1], argv[2:]
    args, opts = split_options(rest)
    allow_skip = opts.get("--allow-skip", False)
    if cmd == "parity":
        name, dev, cpu, summary = rest[:4]
        opts = dict(zip(rest[4::2], rest[5::2]))
        parity(name, dev, cpu, summary, int(opts.get("--min-equal", 16)),
               float(opts.get("--logprob-tol", 0.05)))
    elif cmd == "ops":
        ops(*rest)
    elif cmd == "bench":
        bench(*args, sdpa_path=opts.get("--sdpa"))
    elif cmd == "profile":
        profile(*rest)
    elif cmd == "sdpa":
        sdpa(*args, allow_skip=allow_skip)
    elif cmd == "decode":
        decode(*args)
    elif cmd == "prefill":
        prefill(args[0], args[1], args[2], args[3:], gpu=opts.get("--gpu"), allow_skip=allow_skip)
    elif cmd == "rows_parity":
        rows_parity(*args)
    elif cmd == "escalate":
        escalate(*args, gpu=opts.get("--gpu"))
    elif cmd == "skipped":
        skipped(*args)
    elif cmd == "table":
        return table(*rest)
    else:
        raise SystemExit(f"unknown command {cmd}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
