#!/usr/bin/env python3
"""Where a SQuAD v2 run's signals stop: its forced-RAG answers split into abstentions and answers.

A wrong RAG answer to an unanswerable question is an answer (the model read something into the
question's words); a wrong one to an answerable question is a wrong span or an abstention. The
recorded question_support and monitor statistic point opposite ways on the two kinds, so this
prints, from a dev run and a test run (`triage eval --systems rag`, e.g. the `-dev-rag` and
`-test-rag` runs of `STAGES=signals benches/eval/run_at_length.sh squad-v2`):
- per kind, the AUROC for "wrong" of 1 - question_support and of the monitor statistic;
- abstentions and answers, how many were wrong, and 1 - question_support on the answers alone;
- the AUROC on test of a lookup fitted on dev: an abstention scores dev's error rate of
  abstentions, an answer its question_support quintile's dev error rate.

    python3 benches/eval/abstentions.py --dev DEV_RUN --test TEST_RUN
"""

import argparse
import bisect
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rag_errors import auroc  # noqa: E402  (one AUROC for the bench scripts)

ABSTAIN = "unanswerable"  # triage_router's UNANSWERABLE


def rows(run):
    with open(os.path.join(run, "results.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["system"] == "rag"]


def abstained(r):
    return r["answer"].strip().lower() == ABSTAIN


def support(r):
    return r["decision"]["monitor"]["grounding"]["question_support"] or 0.0


def wrong(r):
    return not r["score"]["correct"]


def split_auroc(rs, score):
    return auroc([score(r) for r in rs if wrong(r)], [score(r) for r in rs if not wrong(r)])


def describe(name, rs):
    for kind in ("answerable", "unanswerable"):
        own = [r for r in rs if r["kind"] == kind]
        print(
            f"{name} {kind}: {len(own)} answers, {sum(map(wrong, own))} wrong; AUROC "
            f"1 - question_support {split_auroc(own, lambda r: -support(r)):.3f}, monitor "
            f"{split_auroc(own, lambda r: r['decision']['monitor']['mean'] or 0.0):.3f}"
        )
    said = [r for r in rs if abstained(r)]
    answers = [r for r in rs if not abstained(r)]
    print(
        f"{name}: {len(said)} abstentions ({sum(map(wrong, said))} wrong), {len(answers)} answers "
        f"({sum(map(wrong, answers))} wrong; 1 - question_support on them "
        f"{split_auroc(answers, lambda r: -support(r)):.3f})"
    )


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dev", required=True)
    p.add_argument("--test", required=True)
    args = p.parse_args()
    dev, test = rows(args.dev), rows(args.test)
    describe("dev", dev)
    describe("test", test)
    said = [r for r in dev if abstained(r)]
    said_rate = sum(map(wrong, said)) / len(said)
    answers = sorted((r for r in dev if not abstained(r)), key=support)
    edges = [support(answers[len(answers) * i // 5]) for i in range(1, 5)]
    rates = []
    for b in range(5):
        members = [r for r in answers if bisect.bisect_right(edges, support(r)) == b]
        rates.append(sum(map(wrong, members)) / max(1, len(members)))

    def score(r):
        return said_rate if abstained(r) else rates[bisect.bisect_right(edges, support(r))]

    print(
        f"lookup fitted on dev (abstentions {said_rate:.3f}; answers by question_support quintile "
        f"{', '.join(f'{x:.2f}' for x in rates)}): AUROC on test {split_auroc(test, score):.3f}"
    )


if __name__ == "__main__":
    main()
