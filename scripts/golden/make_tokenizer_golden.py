#!/usr/bin/env python3
"""Writes tests/golden/tokenizer_<model>.json: llama.cpp's token ids and jinja2's chat renders.

Peer: llama.cpp through PyPI llama-cpp-python 0.3.36 (`Llama(path, vocab_only=True)`,
`tokenize(text, add_bos=False, special=...)`), and jinja2 3.1 (installed with it) configured the
way Hugging Face transformers renders chat templates. crates/triage-models/tests/tokenizer_golden.rs
checks our tokenizer and chat templates against these files.

Setup (about 10 minutes on 2 cores; the CPU flags avoid AVX-512/AMX code that some hosts lack):
    python3 -m venv /tmp/venv-ref
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
      -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \
      /tmp/venv-ref/bin/pip install --no-cache-dir llama-cpp-python==0.3.36
Run from the repository root, after `triage models fetch`:
    /tmp/venv-ref/bin/python scripts/golden/make_tokenizer_golden.py
"""

import argparse
import json
import os
import sys
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.sandbox
import llama_cpp
from llama_cpp import Llama

MODELS = ["qwen2.5-coder-0.5b", "smollm2-135m"]

# Varied on purpose: each line exercises a different part of the pre-tokenizer regexes.
TEXTS = [
    "Hello, world!",
    "",
    " leading space",
    "  two leading spaces",
    "trailing spaces   ",
    "I'M sure you'RE right, don't they'll we've I'd",
    "DON'T SHOUT, IT'S FINE. We'Ll See",
    " 's 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D",
    "12345",
    "3.14159 and 2,718,281 and -0.5e-10",
    "1234567890123 items cost $1,000,000.99",
    "fn main() {\n    println!(\"Hello, {}!\", 42);\n}\n",
    "def f(x):\n\treturn x ** 2  # square\n",
    "\n\n\n",
    "\t\t\ttabs\tand\nnewlines\r\n",
    "    \n    \n        x\n",
    "a  b   c    d",
    "你好，世界！这是一个测试。",
    "日本語のテキストとカタカナ、ひらがな",
    "한국어 문장입니다",
    "Emoji: 😀🎉👍🏽 👨‍👩‍👧‍👦 ❤️",
    "Ünïcödé façade naïve café — “quotes” ‘single’ …",
    "Привет, мир! Ελληνικά γράμματα",
    "मराठी हिन्दी भाषा",
    "١٢٣ ٤٥٦ Arabic-Indic digits, ½ ² ③ Ⅻ",
    "no\u00a0break\u3000ideographic\u2003em space",
    "zero\u200bwidth\u200djoiner",
    "x = [1, 2, 3]; y = {'a': 0x1F, 'b': 1e-9}",
    "https://example.com/path?query=1&b=2#frag",
    "mixed CASE WoRdS and ALLCAPS and camelCaseName snake_case_name",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    "<|endoftext|>",
    "text<|im_end|>more text",
    "<|im_start|",
    '<tool_call>{"name": "f", "arguments": {}}</tool_call>',
    "!!! ??? ... --- ***",
]

CHATS = [
    {
        "messages": [
            {"role": "system", "content": "You are a careful assistant."},
            {"role": "user", "content": "What is 2 + 2?"},
        ],
        "add_generation_prompt": True,
    },
    {
        "messages": [{"role": "user", "content": "Write a haiku about Rust."}],
        "add_generation_prompt": True,
    },
    {
        "messages": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello. How can I help?"},
            {"role": "user", "content": "Say 'bye' in French: \u00e0 bient\u00f4t?"},
        ],
        "add_generation_prompt": False,
    },
]


def hf_environment():
    """jinja2 as transformers' chat-template renderer sets it up."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def token_text(llm, key):
    token_id = llm.metadata.get(key)
    if token_id is None:
        return ""
    return llm.detokenize([int(token_id)], special=True).decode("utf-8")


def golden_for(name, models_dir):
    path = models_dir / name / "model.gguf"
    if not path.exists():
        sys.exit(f"{path} not found: run `triage models fetch` first")
    llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
    cases = []
    for text in TEXTS:
        data = text.encode("utf-8")
        cases.append(
            {
                "text": text,
                "ids": llm.tokenize(data, add_bos=False, special=True),
                "ids_plain": llm.tokenize(data, add_bos=False, special=False),
            }
        )
    template = llm.metadata["tokenizer.chat_template"]
    bos, eos = token_text(llm, "tokenizer.ggml.bos_token_id"), token_text(llm, "tokenizer.ggml.eos_token_id")
    compiled = hf_environment().from_string(template)
    chats = []
    for chat in CHATS:
        rendered = compiled.render(bos_token=bos, eos_token=eos, tools=None, **chat)
        chats.append({**chat, "expected": rendered})
    return {
        "producer": f"llama.cpp via llama-cpp-python {llama_cpp.__version__} (vocab_only); "
        f"chat renders by jinja2 {jinja2.__version__} with Hugging Face's settings",
        "script": "scripts/golden/make_tokenizer_golden.py",
        "model": name,
        "general.name": llm.metadata.get("general.name"),
        "tokenizer.ggml.pre": llm.metadata.get("tokenizer.ggml.pre"),
        "n_vocab": llm.n_vocab(),
        "tokenize": "add_bos=False; ids: special=True, ids_plain: special=False",
        "cases": cases,
        "chat_bos_token": bos,
        "chat_eos_token": eos,
        "chats": chats,
    }


def main():
    home = Path(os.environ.get("TRIAGE_HOME", Path.home() / ".cache" / "triage"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models-dir", type=Path, default=home / "models")
    parser.add_argument("--out-dir", type=Path, default=Path("tests/golden"))
    parser.add_argument("models", nargs="*", default=MODELS)
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name in args.models:
        golden = golden_for(name, args.models_dir)
        out = args.out_dir / f"tokenizer_{name}.json"
        out.write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {out}: {len(golden['cases'])} texts, {len(golden['chats'])} chats")


if __name__ == "__main__":
    main()
