#!/usr/bin/env python3
"""The long-context answers of a `triage eval` run asked again of llama.cpp, on the same GGUF.

Is a long-context score a limit of the model or a fault of the engine? This script takes a suite
exported by `triage eval --export FILE` (the same corpora and questions the run asked) and the run
directory holding triage's `lc` answers, asks llama.cpp every question over the whole corpus with
the long-context prompt triage builds (the same system message, then "Documents:", each document
under a "[id] title" line, then "Question: ..."), greedy, at most 64 tokens, and prints each
engine's accuracy (the gold as a whole word in the answer), how often the two answered alike, and
where they differ. llama.cpp keeps the corpus's KV between the questions of a group (it reuses
the longest common prefix of consecutive prompts), as triage's pinned prefix does.

Usage (llama-cpp-python 0.3.36, as the parity goldens):
    triage eval --suite kv-retrieval --context-tokens 16384 --limit 100 --split dev --export suite.jsonl
    python benches/eval/lc_peer_llamacpp.py --suite suite.jsonl --run RUN_DIR \
        --model ~/.cache/triage/models/qwen2.5-coder-1.5b/model.gguf [--out answers.jsonl]
Answers already in --out are kept (a rerun resumes).
"""

import argparse
import json
import os
import string
import sys
import time

# triage-router's long-context prompt's (pipeline/long_context_prompt.rs) system message, word for word.
SYSTEM = (
    "You answer questions about the documents the user provides. Answer with the answer only, "
    "in a few words, taken from the documents."
)


def corpus_text(documents):
    """The corpus as `long_context::corpus_text` lays it out."""
    return "".join(f"[{d['id']}] {d['title']}\n{d['text']}\n\n" for d in documents)


def whole_word(answer, gold):
    """`scoring::whole_word_match`: a whitespace-separated word, ASCII punctuation trimmed from
    its ends, equals the gold."""
    return any(w.strip(string.punctuation) == gold for w in answer.split())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", required=True, help="a `triage eval --export` file")
    ap.add_argument("--run", required=True, help="the triage run directory (its lc answers)")
    ap.add_argument("--model", required=True, help="the long-context model's GGUF")
    ap.add_argument("--out", help="llama.cpp's answers, JSON lines (resumable)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()

    from llama_cpp import Llama

    groups = [json.loads(line) for line in open(args.suite)]
    ours, our_tokens = {}, {}
    for line in open(os.path.join(args.run, "results.jsonl")):
        row = json.loads(line)
        if row["system"] == "lc":
            ours[row["example"]] = row["answer"]
            our_tokens[row["example"]] = row["prompt_tokens"]
    theirs = {}
    if args.out and os.path.exists(args.out):
        for line in open(args.out):
            row = json.loads(line)
            theirs[row["example"]] = row
    longest = max(len(corpus_text(g["documents"])) for g in groups)
    # Characters overestimate tokens for prose and underestimate them for ids; leave room.
    llm = Llama(
        model_path=args.model,
        n_ctx=min(32768, longest + 4096),
        n_threads=args.threads,
        n_batch=512,
        verbose=False,
    )
    sink = open(args.out, "a") if args.out else None
    for group in groups:
        documents = corpus_text(group["documents"])
        for example in group["examples"]:
            if example["id"] in theirs or example["id"] not in ours:
                continue
            messages = [
                {"role": "system", "content": SYSTEM},
                {
                    "role": "user",
                    "content": f"Documents:\n\n{documents}Question: {example['question'].strip()}",
                },
            ]
            start = time.time()
            out = llm.create_chat_completion(
                messages, temperature=0.0, max_tokens=args.max_tokens
            )
            row = {
                "example": example["id"],
                "answer": out["choices"][0]["message"]["content"],
                "prompt_tokens": out["usage"]["prompt_tokens"],
                "seconds": round(time.time() - start, 2),
            }
            theirs[example["id"]] = row
            if sink:
                sink.write(json.dumps(row) + "\n")
                sink.flush()
            print(f"{example['id']}: {row['seconds']} s", file=sys.stderr)

    asked = [e for g in groups for e in g["examples"] if e["id"] in ours and e["id"] in theirs]
    if not asked:
        sys.exit("no question has answers from both engines")
    right = lambda answer, e: any(whole_word(answer, g) for g in e["golds"])
    ours_right = sum(right(ours[e["id"]], e) for e in asked)
    theirs_right = sum(right(theirs[e["id"]]["answer"], e) for e in asked)
    alike = sum(ours[e["id"]].strip() == theirs[e["id"]]["answer"].strip() for e in asked)
    both = sum(right(ours[e["id"]], e) and right(theirs[e["id"]]["answer"], e) for e in asked)
    n = len(asked)
    # The same text tokenized by both engines: a difference means the prompts differ.
    gap = [theirs[e["id"]]["prompt_tokens"] - our_tokens[e["id"]] for e in asked]
    print(f"{n} questions; llama.cpp's prompt minus triage's, in tokens: {min(gap)} to {max(gap)}")
    print(f"accuracy: triage {ours_right / n:.3f}, llama.cpp {theirs_right / n:.3f}; "
          f"both right {both}; same answer text {alike} of {n}")
    for e in asked:
        a, b = ours[e["id"]].strip(), theirs[e["id"]]["answer"].strip()
        if a != b:
            print(f"  {e['id']} (gold {e['golds'][0]!r}): triage {a[:60]!r} | llama.cpp {b[:60]!r}")


if __name__ == "__main__":
    main()
