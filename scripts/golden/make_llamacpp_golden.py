#!/usr/bin/env python3
"""Writes tests/golden/llamacpp_<name>.json: llama.cpp's prompt ids, greedy tokens and logits.

Peer: llama.cpp through PyPI llama-cpp-python 0.3.36 (CPU build; see make_tokenizer_golden.py for
the venv at /tmp/venv-ref). For each fixed prompt (raw text, no chat template) it records
  - the prompt ids, tokenized as llama.cpp does by default: BOS only if the GGUF asks for it
    (`tokenizer.ggml.add_bos_token`), special-token texts parsed;
  - 32 greedily decoded ids: argmax over the raw logits after each step (ties: lowest id), with no
    sampler at all, so no repeat penalty, temperature or top-k. End-of-generation tokens do not stop
    decoding, so every prompt has exactly 32 ids to compare;
  - the logits after the prompt (first generated position): the top 20 ids with their values and
    the values at 256 fixed ids (a seeded random subset of the vocabulary) for a max-abs-diff check.
K/V cache: f32 (type_k=type_v=GGML_TYPE_F32), as triage's. Threads: 2; context: 2048; one sequence, evaluated in one batch per prompt then one token a step.

The committed files were made 2026-12-05 from the models as `triage models fetch` installs them
(as shipped), with llama-cpp-python built for AVX-512/VNNI/BF16 as benches/e2e_vs_llamacpp.py
describes.

Usage, from the repository root:
    /tmp/venv-ref/bin/python scripts/golden/make_llamacpp_golden.py PATH/TO/model.gguf NAME
writes tests/golden/llamacpp_NAME.json (`--out` to write elsewhere).
"""

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp import Llama

PROMPTS = [
    "The capital of France is",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Translate to French: I would like a cup of coffee, please.\nFrench:",
    "List the first ten prime numbers: 2, 3, 5,",
    "Once upon a time, in a small village by the sea 🌊, there lived",
]
NUM_GENERATED = 32
NUM_TOP = 20
NUM_SAMPLED_IDS = 256
SAMPLE_SEED = 20240611
N_CTX = 2048
N_THREADS = 2


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def last_logits(llm):
    """Logits of the last evaluated position, copied out of llama.cpp's buffer."""
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    if not ptr:
        raise RuntimeError("llama.cpp returned no logits")
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).astype(np.float32).copy()


def greedy(logits):
    return int(np.argmax(logits))  # first index of the maximum: the lowest id on ties


def run_prompt(llm, prompt, sampled_ids):
    ids = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
    llm.reset()
    llm.eval(ids)
    first = last_logits(llm)
    order = sorted(range(len(first)), key=lambda i: (-float(first[i]), i))[:NUM_TOP]
    generated = []
    logits = first
    for _ in range(NUM_GENERATED):
        token = greedy(logits)
        generated.append(token)
        llm.eval([token])
        logits = last_logits(llm)
    return {
        "prompt": prompt,
        "prompt_ids": ids,
        "generated_ids": generated,
        "generated_text": llm.detokenize(generated, special=True).decode("utf-8", "replace"),
        "first_logits": {
            "top": [[i, float(first[i])] for i in order],
            "sampled": [float(first[i]) for i in sampled_ids],
        },
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", type=Path)
    parser.add_argument("name")
    parser.add_argument("--out", type=Path, help="default: tests/golden/llamacpp_NAME.json")
    args = parser.parse_args()
    if not args.gguf.exists():
        sys.exit(f"{args.gguf} not found")
    out = args.out or Path("tests/golden") / f"llamacpp_{args.name}.json"

    llm = Llama(
        model_path=str(args.gguf),
        n_ctx=N_CTX,
        n_batch=512,
        n_threads=N_THREADS,
        n_threads_batch=N_THREADS,
        n_gpu_layers=0,
        # f32 K/V like triage's cache: llama.cpp's default f16 cache alone moves SmolLM2's
        # first-step logits by up to 1.3 and changes greedy continuations (measured 2026-11-29).
        type_k=0,  # GGML_TYPE_F32
        type_v=0,
        logits_all=False,
        seed=0,
        verbose=False,
    )
    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    n_vocab = llm.n_vocab()
    sampled_ids = sorted(random.Random(SAMPLE_SEED).sample(range(n_vocab), NUM_SAMPLED_IDS))
    golden = {
        "producer": f"llama.cpp via llama-cpp-python {llama_cpp.__version__} (CPU, greedy argmax, "
        f"no sampler)",
        "script": "scripts/golden/make_llamacpp_golden.py",
        "llama_cpp_python_version": llama_cpp.__version__,
        "model": args.name,
        "kv_cache_type": "f32",
        "gguf_file": args.gguf.name,
        "gguf_sha256": sha256(args.gguf),
        "general.name": llm.metadata.get("general.name"),
        "general.file_type": int(llm.metadata.get("general.file_type", -1)),
        "n_vocab": n_vocab,
        "n_ctx": N_CTX,
        "n_threads": N_THREADS,
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "num_generated": NUM_GENERATED,
        "stops_at_eog": False,
        "sample_seed": SAMPLE_SEED,
        "sampled_ids": sampled_ids,
        "prompts": [run_prompt(llm, p, sampled_ids) for p in PROMPTS],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}: {len(PROMPTS)} prompts, {NUM_GENERATED} greedy tokens each")


if __name__ == "__main__":
    main()
