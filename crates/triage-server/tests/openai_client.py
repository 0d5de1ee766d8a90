"""Drive a running `triage serve` with the official `openai` Python client, unchanged, and check
the shapes of its answers: chat, streaming chat (with usage), completions, logprobs, models, and
an error. Usage: openai_client.py BASE_URL API_KEY MODEL. Run by tests/server.rs."""
import sys

import openai

base_url, api_key, model = sys.argv[1:4]
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)

models = client.models.list()
assert [m.id for m in models.data] == [model], models
assert models.data[0].object == "model"

chat = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=5, temperature=0,
    seed=1, extra_body={"ignore_eos": True},
)
assert chat.object == "chat.completion", chat
assert chat.choices[0].message.role == "assistant"
assert isinstance(chat.choices[0].message.content, str)
assert chat.choices[0].finish_reason == "length"
assert chat.usage.completion_tokens == 5
assert chat.usage.total_tokens == chat.usage.prompt_tokens + 5
assert chat.usage.prompt_tokens_details.cached_tokens >= 0
entropies = chat.choices[0].model_extra["triage"]["entropies"]
assert len(entropies) == 5 and all(e >= 0 for e in entropies), entropies

stream = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=5, temperature=0,
    stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
)
pieces, usage, finish = [], None, None
for chunk in stream:
    assert chunk.object == "chat.completion.chunk"
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        if c.delta.content:
            pieces.append(c.delta.content)
        finish = c.finish_reason or finish
assert "".join(pieces) == chat.choices[0].message.content, (pieces, chat)
assert usage is not None and usage.completion_tokens == 5
assert finish == "length"

with_logprobs = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=3, temperature=0,
    logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True},
)
content = with_logprobs.choices[0].logprobs.content
assert len(content) == 3
assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content), content

completion = client.completions.create(
    model=model, prompt="the sun", max_tokens=4, temperature=0, logprobs=2,
    extra_body={"ignore_eos": True},
)
assert completion.object == "text_completion"
assert isinstance(completion.choices[0].text, str)
assert len(completion.choices[0].logprobs.tokens) == 4
assert completion.usage.completion_tokens == 4

try:
    client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    raise SystemExit("an unknown model was accepted")
except openai.NotFoundError as e:
    assert e.status_code == 404

try:
    openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list()
    raise SystemExit("a wrong key was accepted")
except openai.AuthenticationError as e:
    assert e.status_code == 401

print("all checks passed")
