"""Measures the logits the engine's 0.5B-shape GPU test dumped (TRIAGE_DEVICE_DUMP) against
transformers on the same weights: f64 on the CPU as the truth, f32 on the GPU as a peer. Prints
one JSON line: each set's max abs error against the truth and the logits' scale.

    python3 hf_logits.py DUMP_DIR
"""
import json
import os
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM


def logits(model_dir, tokens, dtype, device):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    with torch.inference_mode():
        out = model(torch.tensor([tokens], device=device)).logits[0]
    return out.double().cpu().numpy()


def main() -> int:
    d = sys.argv[1]
    tokens = json.load(open(os.path.join(d, "tokens.json")))
    truth = logits(d, tokens, torch.float64, "cpu")
    report = {"scale": float(np.abs(truth).max())}
    for name in ("cpu_f32", "gpu_f32", "gpu_bf16"):
        got = np.fromfile(os.path.join(d, f"logits_{name}.bin"), dtype="<f4").reshape(truth.shape)
        report[f"triage_{name}"] = float(np.abs(got - truth).max())
    if torch.cuda.is_available():
        for name, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
            report[f"torch_gpu_{name}"] = float(np.abs(logits(d, tokens, dtype, "cuda") - truth).max())
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
