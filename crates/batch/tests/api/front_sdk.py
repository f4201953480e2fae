"""Drives inferq's front door (single requests) with the official `openai` Python SDK, as a user
would: base_url pointed at inferq, nothing else changed.

Run by crates/batch/tests/api/front_sdk.rs, which starts Redis, the simulator, an `inferq run`
processor and two `inferq batch-api` replicas with API keys, and passes them in the environment:
INFERQ_BATCH_URLS (two base URLs) and INFERQ_KEY_A (a tenant's key). Every check is an assert;
the first failure ends the run with a non-zero exit.
"""

import json
import os
import urllib.request

import openai

URLS = os.environ["INFERQ_BATCH_URLS"].split(",")
KEY = os.environ["INFERQ_KEY_A"]
A = openai.OpenAI(base_url=URLS[0], api_key=KEY, max_retries=0)
A2 = openai.OpenAI(base_url=URLS[1], api_key=KEY, max_retries=0)
MSG = [{"role": "user", "content": "Say hi"}]

# wait (the default): a typed ChatCompletion, as from the gateway itself.
c = A.chat.completions.create(model="m", messages=MSG, max_tokens=4)
assert c.object == "chat.completion", c
assert c.choices[0].message.role == "assistant", c
assert c.choices[0].message.content, c
assert c.usage is not None and c.usage.total_tokens > 0, c
print("wait: chat ok")

t = A2.completions.create(model="m", prompt="p", max_tokens=3, extra_headers={"x-llm-d-async-timeout": "30s"})
assert t.object == "text_completion" and t.choices[0].text, t
print("wait: completions ok")

flex = A.chat.completions.create(model="m", messages=MSG, max_tokens=4, service_tier="flex")
assert flex.choices[0].message.content, flex
print("wait: service_tier flex ok")

# stream: true: the SDK's own stream parser reads the chunks (keepalive comments skipped).
chunks = list(A.chat.completions.create(model="m", messages=MSG, max_tokens=4, stream=True))
text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
assert text == c.choices[0].message.content or text, chunks
assert any(ch.choices and ch.choices[0].finish_reason for ch in chunks), chunks
assert all(ch.object == "chat.completion.chunk" for ch in chunks), chunks
print("stream: chat ok,", len(chunks), "chunks")

tchunks = list(A2.completions.create(model="m", prompt="p", max_tokens=3, stream=True))
assert "".join(ch.choices[0].text for ch in tchunks if ch.choices), tchunks
print("stream: completions ok")

# enqueue + GET: the raw answer is the request object; GET long-polls it on the other replica.
raw = A.chat.completions.with_raw_response.create(
    model="m", messages=MSG, max_tokens=4, extra_headers={"X-AP-Mode": "enqueue", "Idempotency-Key": "sdk-1"}
)
assert raw.status_code == 202, raw.status_code
obj = raw.http_response.json()
assert obj["object"] == "async.request" and obj["status"] in ("queued", "in_progress", "completed"), obj
# The SDK's own low-level GET reads it (cast_to=object gives the JSON as it is) ...
got = A2.get(f"/requests/{obj['id']}", cast_to=object, options={"params": {"wait": 30}, "timeout": 60})
assert isinstance(got, dict), got
# ... and so does any HTTP client.
req = urllib.request.Request(f"{URLS[0]}/requests/{obj['id']}", headers={"Authorization": f"Bearer {KEY}"})
assert json.load(urllib.request.urlopen(req, timeout=30))["status"] == got["status"]
assert got["status"] == "completed", got
assert got["response"]["status_code"] == 200, got
body = openai.types.chat.ChatCompletion.model_validate(got["response"]["body"])
assert body.choices[0].message.content, body
print("enqueue + GET ok")

# The same Idempotency-Key and body, waiting this time: the same request's answer.
again = A2.chat.completions.with_raw_response.create(
    model="m", messages=MSG, max_tokens=4, extra_headers={"Idempotency-Key": "sdk-1"}
)
assert again.headers["x-inferq-request-id"] == obj["id"], again.headers
assert again.parse().id == body.id
print("idempotent wait ok")

# Errors as the SDK's exceptions: a reused key with another body is a ConflictError, a bad
# timeout a BadRequestError, an expired deadline an InternalServerError (504).
try:
    A.chat.completions.create(model="m", messages=[{"role": "user", "content": "other"}], max_tokens=4,
                              extra_headers={"Idempotency-Key": "sdk-1"})
    raise AssertionError("expected ConflictError")
except openai.ConflictError as e:
    assert "sdk-1" in str(e), e
try:
    A.chat.completions.create(model="m", messages=MSG, max_tokens=4, extra_headers={"x-llm-d-async-timeout": "ten"})
    raise AssertionError("expected BadRequestError")
except openai.BadRequestError as e:
    assert e.body["param"] == "x-llm-d-async-timeout", e.body
print("errors ok")
print("all SDK checks passed")
