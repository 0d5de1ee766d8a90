#!/usr/bin/env python3
"""Which self-check tells a wrong RAG answer: the AUROC of -log p(yes)/p(no) for a wrong answer,
per judge, over the questions every run answered whose answer was checked (a decline is not),
by kind of question, beside the mean entropy's on the same answers (RESULTS, issue 22 sixth
pass).

Each RUN is a `triage eval --systems rag` output directory recorded with `self_check = true`
and the judge named by `self_check_model`; the runs must hold the same RAG answers (the judge
changes nothing else), which is checked.

Usage: self_check_judges.py NAME=RUN [NAME=RUN ...]
"""
import json
import math
import sys


def load(run):
    with open(f"{run}/results.jsonl") as f:
        rows = (json.loads(line) for line in f if line.strip())
        return {r["example"]: r for r in rows if r["system"] == "rag"}


def auroc(scores, wrong):
    """P(a wrong answer scores above a right one), ties half; None without both kinds."""
    pos = [s for s, w in zip(scores, wrong) if w]
    neg = [s for s, w in zip(scores, wrong) if not w]
    if not pos or not neg:
        return None
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def signal(row, name):
    value = row["decision"]["monitor"]["signals"].get(name)
    return math.nan if value is None else value


def charged(row, stage):
    return sum(s["prompt"] + s["completion"] for s in row["stages"] if s["stage"] == stage)


def main(args):
    runs = [(a.split("=", 1)[0], load(a.split("=", 1)[1])) for a in args]
    common = set.intersection(*(set(r) for _, r in runs))
    first = runs[0][1]
    for name, rows in runs[1:]:
        differ = [e for e in common if rows[e]["answer"] != first[e]["answer"]]
        if differ:
            sys.exit(f"{name} answers {len(differ)} questions differently: not the same answers")
    checked = sorted(
        e for e in common if all(not math.isnan(signal(r[e], "self_check")) for _, r in runs)
    )
    print(f"{len(common)} questions in every run, {len(checked)} answers self-checked\n")
    judges = " | ".join(f"{n} self-check" for n, _ in runs)
    print(f"| answers | n (wrong) | {judges} | mean entropy |")
    print("|---|---|" + "---|" * (len(runs) + 1))
    kinds = sorted({str(first[e].get("kind")) for e in checked})
    for kind in ["all"] + kinds:
        subset = [e for e in checked if kind == "all" or str(first[e].get("kind")) == kind]
        wrong = [not first[e]["score"]["correct"] for e in subset]
        cells = []
        for _, rows in runs + [("entropy", None)]:
            if rows is None:
                scores = [signal(first[e], "mean_entropy") for e in subset]
            else:
                scores = [-signal(rows[e], "self_check") for e in subset]
            a = auroc(scores, wrong)
            cells.append("–" if a is None else f"{a:.3f}")
        print(f"| {kind} | {len(subset)} ({sum(wrong)}) | " + " | ".join(cells) + " |")
    print()
    for name, rows in runs:
        tokens = [charged(rows[e], "self_check") for e in checked]
        ms = [s["ms"] for e in checked for s in rows[e]["stages"] if s["stage"] == "self_check"]
        print(f"{name}: {sum(tokens) / len(tokens):.0f} charged tokens and "
              f"{sum(ms) / len(ms):.0f} ms per self-check")


if __name__ == "__main__":
    main(sys.argv[1:])
