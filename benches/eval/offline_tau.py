#!/usr/bin/env python3
"""Accuracy, tokens and escalation of "RAG, escalating to LC above tau" at one tau, offline, from a
`triage eval` run's results.jsonl: the same rule as the report's tau sweep (crates/triage-eval/src/
sweep.rs; an abstaining or token-less RAG answer always escalates), at a tau the sweep's 0.25 grid
skips. Usage: offline_tau.py RESULTS_JSONL TAU [LIMIT]"""
import json
import string
import sys


def abstains(answer):
    # scoring::abstains: SQuAD's normalisation (lower case, punctuation dropped, articles dropped),
    # then the first word is the abstention string.
    words = "".join(c for c in answer.lower() if c not in string.punctuation).split()
    words = [w for w in words if w not in ("a", "an", "the")]
    return words[:1] == ["unanswerable"]


def main():
    path, tau = sys.argv[1], float(sys.argv[2])
    limit = int(sys.argv[3]) if len(sys.argv) > 3 else None
    rows = [json.loads(line) for line in open(path)]
    lc = {r["example"]: r for r in rows if r["system"] == "lc"}
    rag = [r for r in rows if r["system"] == "rag" and r["example"] in lc][:limit]
    esc = acc = tokens = 0.0
    for r in rag:
        l = lc[r["example"]]
        stat = r["rag_statistic"]
        up = abstains(r["answer"]) or stat is None or stat > tau
        esc += up
        acc += l["score"]["value"] if up else r["score"]["value"]
        tokens += r["prompt_tokens"] + r["completion_tokens"]
        if up:
            tokens += l["prompt_tokens"] + l["completion_tokens"]
    n = len(rag)
    lc_acc = sum(lc[r["example"]]["score"]["value"] for r in rag) / n
    lc_tok = sum(lc[r["example"]]["prompt_tokens"] + lc[r["example"]]["completion_tokens"] for r in rag) / n
    print(f"n={n} tau={tau}: escalated {esc / n:.3f}, accuracy {acc / n:.3f}, tokens {tokens / n:.0f}; "
          f"lc accuracy {lc_acc:.3f}, tokens {lc_tok:.0f}; retained {acc / n / lc_acc:.3f} at {tokens / n / lc_tok:.3f} of lc's tokens")


if __name__ == "__main__":
    main()
