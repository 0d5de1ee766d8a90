#!/usr/bin/env python3
"""Where the Self-Route decline offer goes in the RAG prompt: right answers and declines of
forced-RAG runs over the same questions, by kind of question (RESULTS, issue 22 fifth pass).

Each RUN is a `triage eval --systems rag` output directory; the variants were asked with the
shipped binary (offer after the question, or `self_route = false`) and with builds patched by
`decline-in-system-turn.patch` or `decline-before-question.patch` (`git apply`, then
`cargo build --release`). Only the questions every run answered are compared.

Usage: decline_placement.py NAME=RUN [NAME=RUN ...]
"""
import json
import sys
from collections import defaultdict


def load(run):
    with open(f"{run}/results.jsonl") as f:
        rows = (json.loads(line) for line in f if line.strip())
        return {r["example"]: r for r in rows if r["system"] == "rag"}


def main(args):
    if not args or any("=" not in a for a in args):
        sys.exit(__doc__)
    runs = {name: load(run) for name, run in (a.split("=", 1) for a in args)}
    common = [e for e in next(iter(runs.values())) if all(e in r for r in runs.values())]
    print(f"{len(common)} questions every run answered")
    for name, rows in runs.items():
        kinds = defaultdict(lambda: [0, 0, 0])
        for e in common:
            r = rows[e]
            k = kinds[r.get("kind") or "all"]
            k[0] += 1
            k[1] += r["score"]["correct"]
            k[2] += r["answer"].strip().lower().startswith("unanswerable")
        cells = ", ".join(f"{k}: {right} / {n} right, {dec} declines" for k, (n, right, dec) in kinds.items())
        print(f"{name}: {cells}")


if __name__ == "__main__":
    main(sys.argv[1:])
