"""Writes a random-weight checkpoint of a real model's config, cut to a few layers and a small
vocabulary, as transformers saves it (bf16 safetensors shards with their index), and the logits
transformers computes for it (in f32 from those bf16 weights), for `hf_parity.rs` to compare.

usage: hf_parity.py CONFIG_JSON OUT_DIR NUM_LAYERS VOCAB START_POSITION NUM_TOKENS SEED
Run by the test with the venv `scripts/test` installs (torch, transformers pinned there).
"""

import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main() -> None:
    config_path, out, layers, vocab, start, num_tokens, seed = sys.argv[1:8]
    out = Path(out)
    layers, vocab, start, num_tokens = int(layers), int(vocab), int(start), int(num_tokens)
    torch.manual_seed(int(seed))

    cut = json.loads(Path(config_path).read_text())
    cut["num_hidden_layers"] = layers
    cut["vocab_size"] = vocab
    out.mkdir(parents=True, exist_ok=True)
    # The cut config in the Hub's (transformers v4) layout, beside what v5 writes.
    (out / "config.v4.json").write_text(json.dumps(cut, indent=2))

    config_dir = out / "config-src"
    config_dir.mkdir(exist_ok=True)
    (config_dir / "config.json").write_text(json.dumps(cut))
    config = AutoConfig.from_pretrained(config_dir)
    shutil.rmtree(config_dir)
    model = AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, attn_implementation="eager"
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                # Norm weights far from 1, so that a norm applied to the wrong tensor shows.
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.normal_(0.0, 0.5)
            else:
                p.normal_(0.0, 0.03)
    model = model.to(torch.bfloat16)
    # Small shards, so that even one layer spans several and the index is exercised.
    model.save_pretrained(out, max_shard_size="20MB")
    # The shards as written, computed in f32: what triage's CPU path does. Reloaded rather than
    # cast back in memory, where `to(bfloat16)` also rounds the rotary frequencies.
    model = AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager"
    ).eval()

    gen = torch.Generator().manual_seed(int(seed) + 1)
    tokens = torch.randint(0, vocab, (1, num_tokens), generator=gen)
    positions = torch.arange(start, start + num_tokens).unsqueeze(0)
    with torch.no_grad():
        logits = model(input_ids=tokens, position_ids=positions).logits[0]
    (out / "expected.json").write_text(
        json.dumps(
            {
                "tokens": tokens[0].tolist(),
                "positions": positions[0].tolist(),
                "logits": logits.tolist(),
            }
        )
    )


if __name__ == "__main__":
    main()
