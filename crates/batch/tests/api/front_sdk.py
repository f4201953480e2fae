"""Drives inferq's front door, the router's async-broker contract, with the official `openai`
Python SDK, as a client written for the router would: base_url pointed at inferq, the mode and
id as extra headers, nothing else changed.

Run by crates/batch/tests/api/front_sdk.rs, which starts Redis, the simulator, an `inferq run`
processor and two `inferq batch-api` replicas with API keys (on a standalone Redis, a Cluster or
behind Sentinel), and passes them in the environment: INFERQ_BATCH_URLS (two base URLs) and
INFERQ_KEY_A (a tenant's key). Every check is an assert; the first failure ends the run with a
non-zero exit.
"""

import os
import urllib.request
import uuid

import openai
from openai.types.chat import ChatCompletion

URLS = os.environ["INFERQ_BATCH_URLS"].split(",")
KEY = os.environ["INFERQ_KEY_A"]
A = openai.OpenAI(base_url=URLS[0], api_key=KEY, max_retries=0)
A2 = openai.OpenAI(base_url=URLS[1], api_key=KEY, max_retries=0)
MSG = [{"role": "user", "content": "Say hi"}]
RUN = uuid.uuid4().hex[:8]

# No X-AP-Mode: served live, the gateway's own answer.
live = A.chat.completions.create(model="m", messages=MSG, max_tokens=4)
assert live.object == "chat.completion" and live.choices[0].message.content, live
print("live ok")

# passthrough: live too, classified.
p = A2.completions.create(model="m", prompt="p", max_tokens=3, extra_headers={"X-AP-Mode": "passthrough"})
assert p.object == "text_completion" and p.choices[0].text, p
print("passthrough ok")

# wait: a typed ChatCompletion on the held connection, its id echoed in x-request-id.
raw = A.chat.completions.with_raw_response.create(
    model="m", messages=MSG, max_tokens=4, extra_headers={"X-AP-Mode": "wait", "X-Request-Timeout-Seconds": "30"}
)
c = raw.parse()
assert raw.status_code == 200 and c.object == "chat.completion", c
assert c.usage is not None and c.usage.total_tokens > 0, c
assert len(raw.headers["x-request-id"]) == 36, raw.headers
print("wait ok")

# stream: true in wait mode: the SDK's own stream parser reads the chunks.
chunks = list(A.chat.completions.create(model="m", messages=MSG, max_tokens=4, stream=True,
                                        extra_headers={"X-AP-Mode": "wait"}))
assert any(ch.choices and ch.choices[0].delta.content for ch in chunks), chunks
assert any(ch.choices and ch.choices[0].finish_reason for ch in chunks), chunks
assert all(ch.object == "chat.completion.chunk" for ch in chunks), chunks
print("wait stream ok,", len(chunks), "chunks")

# enqueue: 202 {"id","status":"pending"} with the client's id.
job = f"sdk-{RUN}"
raw = A.chat.completions.with_raw_response.create(
    model="m", messages=MSG, max_tokens=4, extra_headers={"X-AP-Mode": "enqueue", "X-Request-Id": job}
)
assert raw.status_code == 202, raw.status_code
assert raw.http_response.json() == {"id": job, "status": "pending"}, raw.http_response.text
assert raw.headers["x-request-id"] == job, raw.headers

# The same id and body, waiting on the other replica: joins that request.
joined = A2.chat.completions.create(model="m", messages=MSG, max_tokens=4,
                                    extra_headers={"X-AP-Mode": "wait", "X-Request-Id": job})
# Another body under the id: a ConflictError.
try:
    A.chat.completions.create(model="m", messages=[{"role": "user", "content": "other"}], max_tokens=4,
                              extra_headers={"X-AP-Mode": "enqueue", "X-Request-Id": job})
    raise AssertionError("expected ConflictError")
except openai.ConflictError as e:
    assert e.body["code"] == "REQUEST_ID_CONFLICT", e.body

# GET answers the model's own body: the SDK casts it to a ChatCompletion.
got = A2.get(f"/requests/{job}", cast_to=ChatCompletion, options={"params": {"wait": 30}, "timeout": 60})
assert isinstance(got, ChatCompletion) and got.id == joined.id, (got, joined)
print("enqueue, join, conflict and GET ok")

# DELETE: 204, then the id is unknown (410).
req = urllib.request.Request(f"{URLS[0]}/requests/{job}", method="DELETE",
                             headers={"Authorization": f"Bearer {KEY}"})
assert urllib.request.urlopen(req, timeout=30).status == 204
try:
    A.get(f"/requests/{job}", cast_to=object)
    raise AssertionError("expected 410")
except openai.APIStatusError as e:
    assert e.status_code == 410 and e.body["code"] == "UNKNOWN_REQUEST", e.body
print("delete ok")

# Errors as the SDK's exceptions, in the step's codes.
for headers, param in [({"X-AP-Mode": "later"}, "X-AP-Mode"),
                       ({"X-AP-Mode": "wait", "X-Request-Timeout-Seconds": "ten"}, "X-Request-Timeout-Seconds")]:
    try:
        A.chat.completions.create(model="m", messages=MSG, max_tokens=4, extra_headers=headers)
        raise AssertionError("expected BadRequestError")
    except openai.BadRequestError as e:
        assert e.body["code"] == "INVALID_REQUEST" and e.body["param"] == param, e.body
try:
    A.chat.completions.create(model="m", messages=MSG, max_tokens=4, extra_headers={"X-AP-Mode": "wait", "X-Team": "b"})
    raise AssertionError("expected PermissionDeniedError")
except openai.PermissionDeniedError as e:
    assert e.status_code == 403, e
# /v1/embeddings in wait mode: the gateway's own 404 (the simulator has no embeddings).
try:
    A.embeddings.create(model="m", input="x", extra_headers={"X-AP-Mode": "wait"})
    raise AssertionError("expected NotFoundError")
except openai.NotFoundError as e:
    assert e.status_code == 404, e
# The routes' models.
assert [m.id for m in A.models.list()] == ["m"], list(A.models.list())
print("errors and models ok")
print("all SDK checks passed")
