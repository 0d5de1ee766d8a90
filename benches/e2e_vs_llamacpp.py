#!/usr/bin/env python3
"""Prefill and decode speed of triage next to llama.cpp (llama-cpp-python) on the same GGUF file
and thread count, in one run; prints each ratio triage/llama.cpp.

Usage: benches/e2e_vs_llamacpp.py --triage target/release/triage [--models qwen2.5-coder-0.5b ...]
Needs llama-cpp-python 0.3.36 built as scripts/golden/make_tokenizer_golden.py describes
(GGML_NATIVE=OFF, AVX2/FMA/F16C on, AVX-512 and AMX off: this CPU has no AVX-512).
"""
import argparse, json, os, subprocess, sys, time

HOME = os.environ.get("TRIAGE_HOME", os.path.expanduser("~/.cache/triage"))
TEXT = ("The history of computing is a story of abstractions layered on abstractions. "
        "Each generation of engineers builds tools that hide the details the previous one "
        "struggled with, and in doing so frees attention for harder problems. ")


def prompt_of(llm, n):
    ids = []
    while len(ids) < n:
        ids = llm.tokenize((TEXT * (1 + n // 20)).encode(), add_bos=False, special=False)
    return llm.detokenize(ids[:n]).decode("utf-8", errors="ignore")


def run_triage(binary, model_path, prompt, max_tokens, threads):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    out = subprocess.run([binary, "generate", "--model", model_path, "--prompt", prompt,
                          "--max-tokens", str(max_tokens), "--ignore-eos", "--json"],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def last_logits(llm):
    import llama_cpp
    import numpy as np
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))


def llama_prefill_decode(llm, prompt, decode_tokens):
    import numpy as np
    ids = llm.tokenize(prompt.encode(), add_bos=False, special=False)
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(decode_tokens):
        tok = int(np.argmax(last_logits(llm)))
        llm.eval([tok])
    decode_s = time.perf_counter() - t0
    return len(ids), prefill_s, decode_s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--triage", required=True)
    ap.add_argument("--models", nargs="+", default=["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
    ap.add_argument("--prompt-tokens", nargs="+", type=int, default=[512, 2048])
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from llama_cpp import Llama, __version__
    print(f"llama-cpp-python {__version__}, threads={args.threads}")
    rows = []
    for name in args.models:
        path = os.path.join(HOME, "models", name, "model.gguf")
        if not os.path.exists(path):
            print(f"skip {name}: {path} missing (triage models fetch {name})")
            continue
        llm = Llama(model_path=path, n_ctx=4096, n_threads=args.threads,
                    n_threads_batch=args.threads, logits_all=False, verbose=False)
        for n in args.prompt_tokens:
            prompt = prompt_of(llm, n)
            ours = run_triage(args.triage, path, prompt, 1, args.threads)
            n_l, pre_l, _ = llama_prefill_decode(llm, prompt, 0)
            t = ours["prompt_tokens"] / (ours["timings"]["prefill_ms"] / 1e3)
            l = n_l / pre_l
            rows.append((name, f"prefill@{n}", t, l))
        prompt = prompt_of(llm, 32)
        ours = run_triage(args.triage, path, prompt, args.decode_tokens, args.threads)
        t = (ours["completion_tokens"] - 1) / (ours["timings"]["decode_ms"] / 1e3)
        _, _, dec_l = llama_prefill_decode(llm, prompt, args.decode_tokens)
        l = args.decode_tokens / dec_l
        size_gb = os.path.getsize(path) / 1e9
        rows.append((name, "decode", t, l))
        print(f"{name}: decode ceiling at 20 GB/s STREAM = {20 / size_gb:.1f} tok/s; "
              f"triage reaches {t / (20 / size_gb):.2f} of it")
        del llm
    print(f"\n{'model':<22} {'phase':<14} {'triage tok/s':>13} {'llama.cpp tok/s':>16} {'ratio':>7}")
    for name, phase, t, l in rows:
        print(f"{name:<22} {phase:<14} {t:>13.1f} {l:>16.1f} {t / l:>7.2f}")


if __name__ == "__main__":
    sys.exit(main())
