#!/usr/bin/env python3
"""llama.cpp against its own golden run: how far its f16 K/V cache moves the first-step logits and
where its greedy continuations leave the f32-cache run in tests/golden/llamacpp_NAME.json.

tests/llamacpp_parity.rs allows triage the spread this measures (its tolerances cite it).
2026-12-05, SmolLM2's shipped Q4_1 file: max logit difference 0.862; continuations agree on
5, 6, 32, 32 and 32 of 32 tokens, the two splits at gaps of 0.330 and 0.093.

Usage, from the repository root, with the venv make_llamacpp_golden.py uses:
    PYTHON scripts/golden/llamacpp_spread.py PATH/TO/model.gguf tests/golden/llamacpp_NAME.json
"""
import json
import sys

import llama_cpp
import numpy as np
from llama_cpp import Llama


def last_logits(llm):
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).astype(np.float32).copy()


def main():
    path, golden = sys.argv[1], json.load(open(sys.argv[2]))
    llm = Llama(model_path=path, n_ctx=2048, n_batch=512, n_threads=2, n_threads_batch=2,
                n_gpu_layers=0, type_k=1, type_v=1, seed=0, verbose=False)  # f16 K/V
    sampled = golden["sampled_ids"]
    worst, agreed = 0.0, []
    for case in golden["prompts"]:
        llm.reset()
        llm.eval(case["prompt_ids"])
        logits = last_logits(llm)
        first = case["first_logits"]
        reference = [tuple(p) for p in first["top"]] + list(zip(sampled, first["sampled"]))
        worst = max(worst, max(abs(float(logits[i]) - v) for i, v in reference))
        same = 0
        for token in case["generated_ids"]:
            if int(np.argmax(logits)) != token:
                print(f"split after {same} tokens at a gap of {logits.max() - logits[token]:.3f}")
                break
            same += 1
            llm.eval([token])
            logits = last_logits(llm)
        agreed.append(same)
    print(f"f16 K/V against the f32 golden run: max logit difference {worst:.3f}, "
          f"continuations agree on {agreed} of {len(golden['prompts'][0]['generated_ids'])}")


if __name__ == "__main__":
    main()
