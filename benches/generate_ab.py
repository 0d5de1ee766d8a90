#!/usr/bin/env python3
"""Two triage binaries side by side on `triage generate` (CPU or GPU): prefill and decode speed
from each run's own `--json` timings, the runs alternated so load on the host falls on both, and
the first generated ids compared (the two must give the same greedy tokens).

Usage: benches/generate_ab.py --old OLD_BINARY --new NEW_BINARY [--model qwen2.5-coder-0.5b]
       [--prompt-words 400 1600] [--max-tokens 64] [--runs 3] [--device cpu]

Prints every run, then per prompt length the mean of each and new/old.
"""
import argparse, json, statistics, subprocess

TEXT = ("The history of computing is a story of abstractions layered on abstractions. "
        "Each generation of engineers builds tools that hide the details the previous one "
        "struggled with, and in doing so frees attention for harder problems. ")


def run(binary, model, device, words, max_tokens):
    prompt = " ".join((TEXT * (1 + words // 20)).split()[:words])
    out = subprocess.run([binary, "generate", "--model", model, "--device", device, "--prompt",
                          prompt, "--max-tokens", str(max_tokens), "--ignore-eos", "--json"],
                         capture_output=True, text=True, check=True).stdout
    j = json.loads(out.strip().splitlines()[-1])
    t = j["timings"]
    # The first token comes with the prefill; the decode rate counts the rest.
    return (j["prompt_tokens"], j["prompt_tokens"] / t["prefill_ms"] * 1e3,
            (j["completion_tokens"] - 1) / t["decode_ms"] * 1e3, [x["id"] for x in j["tokens"]])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--old", required=True)
    p.add_argument("--new", required=True)
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--device", default="cpu")
    p.add_argument("--prompt-words", type=int, nargs="+", default=[400, 1600])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    print("| prompt | prefill old → new (tok/s) | decode old → new (tok/s) | same ids |")
    rows = []
    for words in a.prompt_words:
        got = {"old": [], "new": []}
        for _ in range(a.runs):
            for name in ("old", "new"):
                n, prefill, decode, ids = run(getattr(a, name), a.model, a.device, words, a.max_tokens)
                got[name].append((prefill, decode, ids))
                print(f"# {name} prompt {n}: prefill {prefill:.0f} tok/s, decode {decode:.1f} tok/s",
                      flush=True)
        mean = lambda name, i: statistics.mean(r[i] for r in got[name])
        same = all(o[2] == w[2] for o, w in zip(got["old"], got["new"]))
        rows.append(f"| {n} | {mean('old', 0):.0f} → {mean('new', 0):.0f} "
                    f"({mean('new', 0) / mean('old', 0):.2f}x) | {mean('old', 1):.1f} → "
                    f"{mean('new', 1):.1f} ({mean('new', 1) / mean('old', 1):.2f}x) | {same} |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
