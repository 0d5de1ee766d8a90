#!/usr/bin/env python3
"""A dev-frozen τ replayed offline on a run's forced rag and lc answers.

A run under a combined score routes its `auto` system by P(wrong); this prints, from the same
run's `rag` and `lc` rows, what the monitor statistic's frozen τ (`triage calibrate`'s
`[routing.monitor] tau`, chosen on dev) would have done to the same questions, as
`sweep::point` counts it: an answer escalates when it declined ("unanswerable"), has no
statistic, or its statistic is above τ; the RAG answer is charged whole, then long context's.
Also the run's systems side by side, so the two routings compare on one set of questions.

    python3 benches/eval/frozen_point.py --run RUN_DIR --tau 2.049207866191864
"""

import argparse
import json
import os
import string

UNANSWERABLE = "unanswerable"  # triage_router's UNANSWERABLE


def normalize_answer(text):
    """`scoring::normalize_answer`: lower case, ASCII punctuation out, articles out."""
    text = "".join(c for c in text.lower() if c not in string.punctuation)
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


def abstains(answer):
    """`scoring::abstains`: the answer is the abstention, or starts with it."""
    p = normalize_answer(answer)
    return p == UNANSWERABLE or p.startswith(UNANSWERABLE + " ")


def tokens(r):
    return r["prompt_tokens"] + r["completion_tokens"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", required=True)
    ap.add_argument("--tau", type=float, required=True)
    args = ap.parse_args()
    by = {}
    with open(os.path.join(args.run, "results.jsonl")) as f:
        for r in map(json.loads, f):
            by.setdefault(r["example"], {})[r["system"]] = r
    rows = [s for s in by.values() if {"rag", "lc"} <= s.keys()]
    systems = [x for x in ("rag", "lc", "auto") if all(x in s for s in rows)]
    n = len(rows)
    lc_acc = sum(s["lc"]["score"]["value"] for s in rows) / n
    lc_tok = sum(tokens(s["lc"]) for s in rows) / n
    print(f"{n} questions answered by {', '.join(systems)}")
    for name in systems:
        acc = sum(s[name]["score"]["value"] for s in rows) / n
        tok = sum(tokens(s[name]) for s in rows) / n
        esc = sum(s[name]["escalated"] for s in rows) / n
        print(
            f"  {name}: accuracy {acc:.3f} ({100 * acc / lc_acc:.1f}% of lc) at {tok:.0f} "
            f"tokens ({100 * tok / lc_tok:.1f}% of lc), {100 * esc:.1f}% escalated"
        )
    acc = tok = esc = 0.0
    for s in rows:
        rag, lc = s["rag"], s["lc"]
        stat = rag["rag_statistic"]
        up = abstains(rag["answer"]) or stat is None or stat > args.tau
        esc += up
        acc += lc["score"]["value"] if up else rag["score"]["value"]
        tok += tokens(rag) + (tokens(lc) if up else 0)
    acc, tok, esc = acc / n, tok / n, esc / n
    print(
        f"  τ = {args.tau} offline: accuracy {acc:.3f} ({100 * acc / lc_acc:.1f}% of lc) at "
        f"{tok:.0f} tokens ({100 * tok / lc_tok:.1f}% of lc), {100 * esc:.1f}% escalated"
    )


if __name__ == "__main__":
    main()
