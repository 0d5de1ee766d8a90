"""The peer of triage's prefill in the device check (issue 49): PyTorch's flash
scaled_dot_product_attention on the causal attention shapes of the Qwen2.5 0.5B and 1.5B, and
transformers' whole-model prefill (attn_implementation="sdpa") on a fixture folder, the random
weights triage loads, with the last position's distribution summarised so that report.py can hold
triage's first token to it. Prints one JSON line; without torch or transformers, one line saying
it skipped.

    python3 sdpa_peer.py sdpa [--device cuda] [--lengths 2048,8192,32768]
    python3 sdpa_peer.py prefill MODEL_DIR IDS.json... [--device cuda]

IDS.json is a prompt's token ids as `triage bench prefix --prompt-ids` wrote them. On the CPU (the
dry run) attention runs in f32 through PyTorch's default backend, at whatever lengths are given.
"""
import argparse
import contextlib
import json
import sys
import time

# (query heads, KV heads, head dim) of each model's attention.
SHAPES = {"qwen2.5-0.5b": (14, 2, 64), "qwen2.5-1.5b": (12, 2, 128)}
TOP = 20


def sync(torch, device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_ms(torch, device, fn, budget_s=0.2):
    """Mean milliseconds of `fn` over enough back-to-back calls to fill about `budget_s`, after
    two warm-up calls, between two synchronisations."""
    fn()
    sync(torch, device)
    start = time.perf_counter()
    fn()
    sync(torch, device)
    once = time.perf_counter() - start
    reps = max(3, min(100, int(budget_s / max(once, 1e-6))))
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    sync(torch, device)
    return (time.perf_counter() - start) / reps * 1e3


def attention(torch, q, k, v):
    """Causal SDPA over grouped KV heads: enable_gqa where this PyTorch and backend take it, else
    K/V repeated per query group beforehand (outside the clock). Returns the call and how."""
    F = torch.nn.functional
    try:
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                "enable_gqa")
    except (TypeError, RuntimeError):
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                "repeat_interleave")


def backend(torch, device):
    """The flash backend on a GPU (an error if it cannot run, rather than another kernel
    timed under its name); PyTorch's choice on the CPU."""
    if not device.startswith("cuda"):
        return contextlib.nullcontext(), "default (cpu)"
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel(SDPBackend.FLASH_ATTENTION), "flash"


def sdpa(args):
    import torch
    device = args.device
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    lengths = [int(n) for n in args.lengths.split(",")]
    context, name = backend(torch, device)
    results = []
    with context, torch.inference_mode():
        for shape, (heads, kv_heads, head_dim) in SHAPES.items():
            for n in lengths:
                row = {"shape": shape, "heads": heads, "kv_heads": kv_heads,
                       "head_dim": head_dim, "tokens": n}
                try:
                    gen = torch.Generator(device=device).manual_seed(n)
                    q, k, v = (torch.randn(1, h, n, head_dim, device=device, dtype=dtype,
                                           generator=gen)
                               for h in (heads, kv_heads, kv_heads))
                    call, gqa = attention(torch, q, k, v)
                    ms = timed_ms(torch, device, call)
                    # Causal: Q·Kᵀ and P·V, 2·n²·d each per head, half of them masked.
                    flops = 2 * n * n * heads * head_dim
                    row.update(ms=ms, tflops=flops / (ms * 1e-3) / 1e12, gqa=gqa)
                except RuntimeError as e:  # out of memory, or no kernel for this shape
                    row["error"] = str(e).splitlines()[0]
                results.append(row)
    return {"peer": "torch sdpa", "backend": name, "device": device, "dtype": str(dtype),
            "torch": torch.__version__, "results": results}


def last_position(torch, logits):
    """What report.py compares: the top logprobs, the entropy and the logits' scale."""
    logits = logits.float()
    logprobs = torch.log_softmax(logits, dim=-1)
    top = logprobs.topk(TOP)
    return {"argmax": int(top.indices[0]),
            "top": [[int(i), float(p)] for i, p in zip(top.indices, top.values)],
            "entropy": float(-(logprobs.exp() * logprobs).sum()),
            "scale": float(logits.abs().max())}


def prefill(args):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    device = args.device
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=dtype, attn_implementation="sdpa").to(device).eval()
    prompts = [json.load(open(path)) for path in args.ids]

    def forward(ids):
        """The prompt through the model without a cache; logits at the last position only (all
        positions' logits at 32k would be 10 GB)."""
        ids = torch.tensor([ids], device=device)
        hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state[:, -1]
        return model.lm_head(hidden)[0]

    results = []
    with torch.inference_mode():
        forward(prompts[0])  # warm-up: kernels, allocator, cuBLAS
        sync(torch, device)
        for path, ids in zip(args.ids, prompts):
            row = {"ids": path, "tokens": len(ids)}
            try:
                start = time.perf_counter()
                logits = forward(ids)
                sync(torch, device)
                secs = time.perf_counter() - start
                row.update(ms=secs * 1e3, tokens_per_s=len(ids) / secs,
                           last=last_position(torch, logits))
            except RuntimeError as e:
                row["error"] = str(e).splitlines()[0]
            results.append(row)
    return {"peer": "transformers", "model": args.model, "device": device, "dtype": str(dtype),
            "attn_implementation": model.config._attn_implementation,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "results": results}


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("sdpa")
    a.add_argument("--device", default="cuda")
    a.add_argument("--lengths", default="2048,8192,32768")
    p = sub.add_parser("prefill")
    p.add_argument("model")
    p.add_argument("ids", nargs="+")
    p.add_argument("--device", default="cuda")
    args = ap.parse_args()
    try:
        import torch  # noqa: F401
        if args.cmd == "prefill":
            import transformers  # noqa: F401
    except ImportError as e:
        print(json.dumps({"skipped": f"no {e.name} here"}))
        return 0
    print(json.dumps(sdpa(args) if args.cmd == "sdpa" else prefill(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
