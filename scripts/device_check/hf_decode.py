"""Single-stream greedy decode with Hugging Face transformers on the same weights triage loads
(a folder written by the write_fixture example): the device check's baseline. Prints one JSON line.

    python3 hf_decode.py MODEL_DIR [--tokens N] [--prompt-tokens N] [--device cuda]
"""
import argparse
import json
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError as e:
        print(json.dumps({"skipped": f"no torch/transformers here ({e.name})"}))
        return 0
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(args.device).eval()
    ids = torch.arange(100, 100 + args.prompt_tokens, device=args.device).unsqueeze(0)
    kwargs = dict(max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False)

    def run():
        with torch.inference_mode():
            out = model.generate(ids, **kwargs)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return out

    run()  # warm-up: kernels, allocator, caches
    start = time.perf_counter()
    out = run()
    secs = time.perf_counter() - start
    new = out.shape[1] - ids.shape[1]
    print(json.dumps({"tokens": new, "seconds": secs, "tokens_per_s": new / secs,
                      "torch": torch.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
