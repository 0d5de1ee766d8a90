#!/usr/bin/env python3
"""Writes tests/golden/minilm_embeddings.json: sentence-transformers' embeddings for all-MiniLM-L6-v2.

Peer: PyPI sentence-transformers 6.2.0 on torch 2.15.0 (CPU, float32; transformers 5.24.0 and
tokenizers 0.23.3 came with it). The model is loaded from the triage model directory
(`SentenceTransformer(path, device="cpu")`), so its modules.json pipeline runs as published:
BertModel -> mean pooling over the attention mask -> L2 normalisation, with
max_seq_length from sentence_bert_config.json. For each fixed sentence it records
  - token_ids: the ids the model's own tokenizer feeds it (`model.preprocess`), [CLS] and [SEP]
    included, after truncation to max_seq_length, no padding;
  - embeddings: `model.encode(..., normalize_embeddings=True)`, 384 floats rounded to 6 decimals.
Each sentence is encoded on its own (batch_size=1), so no padding enters the computation.
The sentences are varied on purpose: short, one long sentence of more than 128 (but under 256)
wordpieces, punctuation, digits, accents, CJK, an emoji, mixed case and a code snippet.

Setup (no model download: the files come from `triage models fetch`; the torch wheel from PyPI
pulls in the CUDA libraries, a few GB, but only the CPU is used):
    python3 -m venv /tmp/venv-st
    /tmp/venv-st/bin/pip install --no-cache-dir torch==2.15.0 sentence-transformers==6.2.0
Run from the repository root, after `triage models fetch`:
    /tmp/venv-st/bin/python scripts/golden/make_minilm_golden.py
"""

import argparse
import json
import math
import os
import sys
from pathlib import Path

import sentence_transformers
import torch
from sentence_transformers import SentenceTransformer

MODEL = "minilm-l6"
MODEL_LABEL = "minilm-l6 (sentence-transformers/all-MiniLM-L6-v2)"

SENTENCES = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Wait... what?! No -- really; (seriously) \"quoted\" [brackets] {braces} & more!!!",
    "Order #4521 shipped on 2024-03-15 at 09:30, total $1,299.99 for 3 items (v2.0.1).",
    "Crème brûlée at the café in Zürich was naïve but délicieux.",
    "机器学习很有趣 and 東京 is a city; 😀 emoji too 🚀",
    "MiXeD CaSe WoRdS, ALLCAPS, camelCaseIdentifier and snake_case_name",
    "fn main() { let v: Vec<i32> = (0..10).map(|x| x * 2).collect(); println!(\"{:?}\", v); }",
    "Rust",
    # Longer than 128 wordpieces but shorter than 256 (the model's max_seq_length), so a port that
    # truncates at 128 gets a different embedding.
    "Sentence embeddings map a piece of text to a fixed-size vector so that texts with similar "
    "meanings end up close together, which makes them useful for semantic search, clustering, "
    "deduplication and retrieval-augmented generation. The all-MiniLM-L6-v2 model is a small "
    "six-layer transformer distilled from a larger teacher and then fine-tuned on more than one "
    "billion sentence pairs with a contrastive objective; it produces 384-dimensional vectors and "
    "runs quickly even on a laptop CPU. To compute an embedding, the text is first split into "
    "WordPiece tokens, wrapped with the special classification and separator tokens, passed "
    "through the encoder, and the resulting hidden states are averaged over the non-padding "
    "positions. Finally the averaged vector is scaled to unit length, so that the cosine "
    "similarity of two sentences is simply the dot product of their embeddings, and comparisons "
    "stay cheap when an index holds millions of documents.",
]


def dump(golden):
    """JSON with one line per key, and one line per sentence, id list or embedding."""
    lines = []
    for key, value in golden.items():
        if isinstance(value, list):
            rows = [json.dumps(row, ensure_ascii=False) for row in value]
            body = ",\n  ".join(rows)
            lines.append(f" {json.dumps(key)}: [\n  {body}\n ]")
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main():
    home = Path(os.environ.get("TRIAGE_HOME", Path.home() / ".cache" / "triage"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=home / "models" / MODEL)
    parser.add_argument("--out", type=Path, default=Path("tests/golden/minilm_embeddings.json"))
    args = parser.parse_args()
    if not (args.model_dir / "model.safetensors").exists():
        sys.exit(f"{args.model_dir}/model.safetensors not found: run `triage models fetch` first")

    torch.manual_seed(0)
    model = SentenceTransformer(str(args.model_dir), device="cpu")
    model.eval()
    max_seq_length = model.max_seq_length

    token_ids = []
    for sentence in SENTENCES:
        features = model.preprocess([sentence])
        token_ids.append(features["input_ids"][0].tolist())

    embeddings = []
    for sentence in SENTENCES:
        vec = model.encode(
            [sentence],
            batch_size=1,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )[0]
        embeddings.append([round(float(x), 6) for x in vec])

    for sentence, ids, vec in zip(SENTENCES, token_ids, embeddings):
        norm = math.sqrt(sum(x * x for x in vec))
        if abs(norm - 1.0) > 1e-4:
            sys.exit(f"embedding norm {norm} is not 1 for {sentence!r}")
        if len(ids) > max_seq_length:
            sys.exit(f"{len(ids)} ids exceed max_seq_length {max_seq_length} for {sentence!r}")

    golden = {
        "model": MODEL_LABEL,
        "peer": f"sentence-transformers {sentence_transformers.__version__}, "
        f"torch {torch.__version__}",
        "script": "scripts/golden/make_minilm_golden.py",
        "max_seq_length": max_seq_length,
        "encode": "normalize_embeddings=True, batch_size=1, device=cpu, float32; rounded to 6 decimals",
        "sentences": SENTENCES,
        "token_ids": token_ids,
        "embeddings": embeddings,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(dump(golden), encoding="utf-8")
    lengths = [len(ids) for ids in token_ids]
    print(
        f"wrote {args.out}: {len(SENTENCES)} sentences, dim {len(embeddings[0])}, "
        f"max_seq_length {max_seq_length}, token counts {lengths}"
    )


if __name__ == "__main__":
    main()
