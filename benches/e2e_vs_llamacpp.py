#!/usr/bin/env python3
"""Prefill and decode speed, resident memory and load time of triage next to llama.cpp
(llama-cpp-python) on the same GGUF file and thread count, in one run; prints each ratio.

Usage: benches/e2e_vs_llamacpp.py --triage target/release/triage [--models qwen2.5-coder-0.5b ...]
       [--prompt-tokens 512 2048 8192 16384] [--decode-tokens 64] [--decode-at-length 16]
       [--llama-flash-attn] [--llama-amx-python PYTHON]

Per model and prompt length N, each engine runs in a process of its own (so its peak resident
memory is its own): load the model, prefill N tokens in one call, then decode --decode-at-length
greedy tokens at that context. Then a short prompt (32 tokens) and --decode-tokens greedy steps.
Columns: prefill@N and decode@N in tokens/s, peak RSS (GB) and model load time (s) of the N run;
TTFT (s) is the short prompt's load plus prefill, a cold start's time to the first token.
triage's times are its own `--json` timings; llama.cpp's are wall-clock around `eval`.

llama-cpp-python 0.3.36 must be importable by the Python running this script. Build it for the
host (about 10 minutes on 2 cores), e.g. with AVX-512, VNNI and BF16 on and AMX off:
    python3 -m venv /tmp/venv-llama
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
      -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF \
      -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \
      /tmp/venv-llama/bin/pip install --no-cache-dir llama-cpp-python==0.3.36 numpy
(AVX2-only hosts: -DGGML_AVX512=OFF and the AVX-512 options off. A second build with the AMX
options on, given as --llama-amx-python, adds a column where the host has AMX.)
triage's AMX kernels are taken only when named: on an AMX host run the script once as it is and
once with TRIAGE_Q8_KERNEL=amx TRIAGE_KQUANT_KERNEL=amx in the environment (the triage processes
inherit it; the second covers the 1.5B's Q4_K).
"""
import argparse, json, os, subprocess, sys, tempfile, time

HOME = os.environ.get("TRIAGE_HOME", os.path.expanduser("~/.cache/triage"))
TEXT = ("The history of computing is a story of abstractions layered on abstractions. "
        "Each generation of engineers builds tools that hide the details the previous one "
        "struggled with, and in doing so frees attention for harder problems. ")


def prompt_of(vocab, n):
    ids = []
    while len(ids) < n:
        ids = vocab.tokenize((TEXT * (1 + n // 20)).encode(), add_bos=False, special=False)
    return vocab.detokenize(ids[:n]).decode("utf-8", errors="ignore")


def run_measured(cmd, env=None):
    """Run `cmd`; return its stdout, its own peak RSS in GB and its wall time in s."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env)
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            sys.exit(f"{cmd[0]} failed ({proc.returncode}): {err.read().decode()[-2000:]}")
    return out.decode(), usage.ru_maxrss / 1e6, wall


def run_triage(binary, model_path, prompt, max_tokens, threads):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    out, rss, wall = run_measured([binary, "generate", "--model", model_path, "--prompt", prompt,
                                   "--max-tokens", str(max_tokens), "--ignore-eos", "--json"],
                                  env=env)
    result = json.loads(out)
    t = result["timings"]
    load_s = result.get("load_ms", None)
    # Builds before `load_ms` existed: the wall time the phases do not account for.
    load_s = load_s / 1e3 if load_s is not None else wall - (t["prefill_ms"] + t["decode_ms"]) / 1e3
    decode_tokens = result["completion_tokens"] - 1
    return {
        "prompt_tokens": result["prompt_tokens"],
        "prefill_s": t["prefill_ms"] / 1e3,
        "decode_tokens": decode_tokens,
        "decode_s": t["decode_ms"] / 1e3,
        "rss_gb": rss,
        "load_s": load_s,
    }


def run_llama(peer, model_path, prompt, decode_tokens, threads, n_ctx):
    _, python, flash_attn = peer
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(prompt)
    try:
        out, rss, _ = run_measured([python, os.path.abspath(__file__), "--llama-worker",
                                    model_path, f.name, str(decode_tokens), str(threads),
                                    str(n_ctx), str(int(flash_attn))])
    finally:
        os.unlink(f.name)
    result = json.loads(out.strip().splitlines()[-1])
    result["rss_gb"] = rss
    return result


def llama_worker(model_path, prompt_file, decode_tokens, threads, n_ctx, flash_attn):
    """In its own process: load, prefill the prompt in one `eval`, decode greedily."""
    import llama_cpp
    import numpy as np
    from llama_cpp import Llama
    prompt = open(prompt_file).read()
    start = time.perf_counter()
    llm = Llama(model_path=model_path, n_ctx=n_ctx, n_batch=512, n_threads=threads,
                n_threads_batch=threads, logits_all=False, verbose=False,
                flash_attn=bool(flash_attn))
    load_s = time.perf_counter() - start
    ids = llm.tokenize(prompt.encode(), add_bos=False, special=False)
    t0 = time.perf_counter()
    llm.eval(ids)
    prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(decode_tokens):
        ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        tok = int(np.argmax(np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))))
        llm.eval([tok])
    decode_s = time.perf_counter() - t0
    print(json.dumps({"prompt_tokens": len(ids), "prefill_s": prefill_s,
                      "decode_tokens": decode_tokens, "decode_s": decode_s, "load_s": load_s}))


def context_length(vocab):
    """The model's trained context, from its GGUF metadata (`<arch>.context_length`)."""
    meta = vocab.metadata
    arch = meta.get("general.architecture", "")
    return int(meta.get(f"{arch}.context_length", 1 << 20))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--llama-worker":
        return llama_worker(sys.argv[2], sys.argv[3], *map(int, sys.argv[4:8]))
    ap = argparse.ArgumentParser()
    ap.add_argument("--triage", required=True)
    ap.add_argument("--models", nargs="+",
                    default=["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
    ap.add_argument("--prompt-tokens", nargs="+", type=int, default=[512, 2048])
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--decode-at-length", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-amx-python", help="a Python whose llama-cpp-python has AMX on")
    ap.add_argument("--llama-flash-attn", action="store_true",
                    help="add a column for llama.cpp with flash attention on (off by default in "
                         "llama-cpp-python)")
    args = ap.parse_args()
    from llama_cpp import Llama, __version__
    print(f"llama-cpp-python {__version__}, threads={args.threads}", flush=True)
    peers = [("llama.cpp", sys.executable, False)]
    if args.llama_flash_attn:
        peers.append(("llama.cpp+FA", sys.executable, True))
    if args.llama_amx_python:
        peers.append(("llama.cpp+AMX", args.llama_amx_python, False))
    rows = []
    for name in args.models:
        path = os.path.join(HOME, "models", name, "model.gguf")
        if not os.path.exists(path):
            print(f"skip {name}: {path} missing (triage models fetch {name})")
            continue
        # Read the file once so that neither engine's first run pays the disk (the one to go
        # first would read it cold after a build has pushed it out of the page cache).
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass
        vocab = Llama(model_path=path, vocab_only=True, verbose=False)
        limit = context_length(vocab)
        for n in args.prompt_tokens:
            if n + args.decode_at_length + 16 > limit:
                print(f"skip {name} at {n} tokens: its context is {limit}")
                continue
            prompt = prompt_of(vocab, n)
            ours = run_triage(args.triage, path, prompt, 1 + args.decode_at_length, args.threads)
            n_ctx = n + args.decode_at_length + 64
            theirs = [run_llama(peer, path, prompt, args.decode_at_length, args.threads, n_ctx)
                      for peer in peers]
            rows.append((name, f"prefill@{n}", ours["prompt_tokens"] / ours["prefill_s"],
                         [t["prompt_tokens"] / t["prefill_s"] for t in theirs], "tok/s"))
            rows.append((name, f"decode@{n}", ours["decode_tokens"] / ours["decode_s"],
                         [t["decode_tokens"] / t["decode_s"] for t in theirs], "tok/s"))
            rows.append((name, f"RSS@{n}", ours["rss_gb"], [t["rss_gb"] for t in theirs], "GB"))
            rows.append((name, f"load@{n}", ours["load_s"], [t["load_s"] for t in theirs], "s"))
            print(rows[-4:], flush=True)
        prompt = prompt_of(vocab, 32)
        ours = run_triage(args.triage, path, prompt, 1 + args.decode_tokens, args.threads)
        theirs = [run_llama(peer, path, prompt, args.decode_tokens, args.threads,
                            32 + args.decode_tokens + 64)
                  for peer in peers]
        rows.append((name, "decode", ours["decode_tokens"] / ours["decode_s"],
                     [t["decode_tokens"] / t["decode_s"] for t in theirs], "tok/s"))
        # A new process's first token: load, then the 32-token prompt's prefill (llama.cpp maps
        # the file and pays its page faults there, in the first `eval`).
        rows.append((name, "TTFT", ours["load_s"] + ours["prefill_s"],
                     [t["load_s"] + t["prefill_s"] for t in theirs], "s"))
        size_gb = os.path.getsize(path) / 1e9
        print(f"{name}: decode ceiling at 20 GB/s STREAM = {20 / size_gb:.1f} tok/s; "
              f"triage reaches {rows[-2][2] / (20 / size_gb):.2f} of it", flush=True)
        del vocab
    header = f"\n| model | phase | unit | triage | " + " | ".join(
        f"{p} | ratio" for p, _, _ in peers) + " |"
    print(header)
    print("|" + "---|" * (4 + 2 * len(peers)))
    for name, phase, ours, theirs, unit in rows:
        # Ratios read "better than the peer" above 1: speed ours/theirs, memory and time theirs/ours.
        better = (lambda o, t: o / t) if unit == "tok/s" else (lambda o, t: t / o)
        cells = " | ".join(f"{t:.2f} | {better(ours, t):.2f}" for t in theirs)
        print(f"| {name} | {phase} | {unit} | {ours:.2f} | {cells} |")


if __name__ == "__main__":
    sys.exit(main())
