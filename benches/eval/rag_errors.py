#!/usr/bin/env python3
"""Why a run's forced-RAG answers are wrong, from its rows and the chunks they were shown.

For each `rag` (or `hybrid`) row of a `triage eval` run: was a gold answer in the chunks put in
the prompt, was the answer right given that, and is a wrong answer a string of the corpus at all
(another value read) or found nowhere in it (miscopied or made up). Also the AUROC for "the
answer is wrong" of the signals the rows recorded and of `1 - question_support`, recomputed from the rows and the chunk texts by a
transcription of `grounding::question_support` (the whole answer text stands for the answer
span), for rows written before the engine recorded it; overall and per kind of question.

The chunk texts come from the corpora re-ingested from the suite's export (chunk ids hash the
document id, kind and text, so the run's ids are found again):

    triage eval --suite kv-retrieval --context-tokens 16384 --limit 100 --split dev --export suite.jsonl
    python3 -c 'import json,sys; [print(json.dumps(d)) for l in open("suite.jsonl") for d in json.loads(l)["documents"]]' \
        | sort -u > docs.jsonl
    triage ingest --corpus rag-errors docs.jsonl
    python3 benches/eval/rag_errors.py --suite suite.jsonl --run RUN_DIR \
        --manifest ~/.cache/triage/corpora/rag-errors/gen-000001/manifest.json [--system hybrid]
"""

import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lc_peer_llamacpp import whole_word  # noqa: E402  (scoring::whole_word_match, once)


def norm(text):
    """`grounding::normalise`: lower case, runs of non-alphanumerics one space."""
    return " ".join(re.findall(r"[^\W_]+", text.lower()))


def units(text):
    """`grounding::units`: lines, each cut after a sentence end followed by whitespace."""
    out = []
    for line in text.split("\n"):
        out += re.split(r"(?<=[.!?])(?=\s)", line)
    return out


def question_support(question, answer, chunks):
    """`grounding::question_support` of `answer` to `question` against the chunk texts."""
    a = norm(answer)
    if not a:
        return float("nan")
    asked_words = set(norm(question).split())
    if all(w in asked_words for w in a.split()):
        return 0.0
    vocabulary = {w for c in chunks for w in norm(c).split()}
    asked = [w for w in asked_words if w in vocabulary]
    if not asked:
        return 0.0
    best = 0.0
    for c in chunks:
        for u in units(c):
            u = f" {norm(u)} "
            if f" {a} " in u:
                best = max(best, sum(f" {w} " in u for w in asked) / len(asked))
    return best


def auroc(wrong, right):
    if not wrong or not right:
        return float("nan")
    return sum((a > b) + 0.5 * (a == b) for a in wrong for b in right) / (len(wrong) * len(right))


def _recorded(section, key, sign=1.0):
    """A signal the row's monitor record holds, oriented so larger means more likely wrong."""
    def score(row, _support):
        value = (row["decision"]["monitor"] or {}).get(section, {}) or {}
        value = value.get(key)
        return None if value is None else sign * float(value)
    return score


SIGNALS = [
    ("monitor statistic", lambda r, s: r["rag_statistic"]),
    ("mean NLL", _recorded("signals", "mean_nll")),
    ("1 - min token probability", _recorded("signals", "min_token_prob", -1.0)),
    ("1 - sample agreement", _recorded("signals", "sample_agreement", -1.0)),
    ("1 - verbatim in a chunk", _recorded("grounding", "verbatim", -1.0)),
    ("unsupported words", _recorded("grounding", "unsupported_words")),
    ("chunk rank of the verbatim span", _recorded("grounding", "chunk_rank")),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", required=True, help="a `triage eval --export` file")
    ap.add_argument("--run", required=True, help="the run directory")
    ap.add_argument("--manifest", required=True, help="the re-ingested corpus's manifest.json")
    ap.add_argument("--system", default="rag", help="rag or hybrid")
    args = ap.parse_args()

    chunks = {c["id"]: c["text"] for c in json.load(open(args.manifest))["chunks"]}
    corpus = {}
    for line in open(args.suite):
        group = json.loads(line)
        corpus[group["id"]] = "\n".join(d["text"] for d in group["documents"])
    rows = [json.loads(l) for l in open(f"{args.run}/results.jsonl")]
    rows = [r for r in rows if r["system"] == args.system]
    missing = sum(
        any(i not in chunks for i in r["decision"]["retrieval"]["chunk_ids"]) for r in rows
    )
    if missing:
        raise SystemExit(f"{missing} rows name chunks the manifest lacks: re-ingest the export")

    shown = right_shown = right_not = 0
    elsewhere = nowhere = 0
    support = {}
    for r in rows:
        texts = [chunks[i] for i in r["decision"]["retrieval"]["chunk_ids"]]
        prompt = "\n".join(texts)
        in_prompt = any(whole_word(prompt, g) or g in prompt for g in r["golds"])
        right = r["score"]["correct"]
        shown += in_prompt
        right_shown += right and in_prompt
        right_not += right and not in_prompt
        if not right and r["golds"]:
            answer = r["answer"].strip().strip('".')
            if answer and answer in corpus[r["group"]]:
                elsewhere += 1
            else:
                nowhere += 1
        kind = r.get("kind") or "all"
        support.setdefault(kind, []).append((r, question_support(r["question"], r["answer"], texts)))

    n = len(rows)
    print(f"{n} {args.system} rows, {sum(not r['score']['correct'] for r in rows)} wrong")
    print(f"a gold answer in the prompt's chunks: {shown} / {n}; right when it is: "
          f"{right_shown} / {shown}; right when it is not: {right_not} / {n - shown}")
    print(f"wrong answers with a gold: {elsewhere} are a string of the corpus, "
          f"{nowhere} are found nowhere in it")
    everything = [v for vs in support.values() for v in vs]
    print("\nAUROC for a wrong answer, pooled (larger means more likely wrong):")
    for kind, values in [("all", everything)] + (
        sorted(support.items()) if len(support) > 1 else []
    ):
        wrong_count = sum(not r["score"]["correct"] for r, _ in values)
        print(f"{kind}, {len(values)} rows, {wrong_count} wrong:")
        for name, score in SIGNALS + [("1 - question_support (recomputed)", lambda r, s: 1 - s)]:
            scored = [(score(r, s), not r["score"]["correct"]) for r, s in values]
            scored = [(x, w) for x, w in scored if x is not None and x == x]
            print(f"  {name:<36} "
                  f"{auroc([x for x, w in scored if w], [x for x, w in scored if not w]):.3f}")


if __name__ == "__main__":
    main()
