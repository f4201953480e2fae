"""Drives inferq's Batch API with the official `openai` Python SDK, as a user would.

Run by crates/batch/tests/api/sdk.rs, which starts Redis, the simulator, an `inferq run` processor
and two `inferq batch-api` replicas with API keys, and passes them in the environment:
INFERQ_BATCH_URLS (two base URLs), INFERQ_KEY_A / INFERQ_KEY_B (keys of tenants a and b).
Every check is an assert; the first failure ends the run with a non-zero exit.
"""

import io
import json
import os
import sys
import time

import openai

URLS = os.environ["INFERQ_BATCH_URLS"].split(",")
A = openai.OpenAI(base_url=URLS[0], api_key=os.environ["INFERQ_KEY_A"], max_retries=0)
A2 = openai.OpenAI(base_url=URLS[1], api_key=os.environ["INFERQ_KEY_A"], max_retries=0)
B = openai.OpenAI(base_url=URLS[1], api_key=os.environ["INFERQ_KEY_B"], max_retries=0)
NOBODY = openai.OpenAI(base_url=URLS[0], api_key="sk-wrong-wrong-wrong", max_retries=0)


def line(i, body=None, url="/v1/chat/completions"):
    body = body or {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 4}
    return json.dumps({"custom_id": f"c{i}", "method": "POST", "url": url, "body": body})


def jsonl(lines):
    return io.BytesIO(("\n".join(lines) + "\n").encode())


def wait(client, batch_id, within=60):
    end = time.time() + within
    while time.time() < end:
        b = client.batches.retrieve(batch_id)
        if b.status in ("completed", "failed", "expired", "cancelled"):
            return b
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} did not end within {within}s: {b}")


def expect(error, call):
    try:
        call()
    except error as e:
        return e
    raise AssertionError(f"expected {error.__name__}")


def happy_path():
    n = 40
    f = A.files.create(file=("in.jsonl", jsonl([line(i) for i in range(n)])), purpose="batch")
    assert f.object == "file" and f.purpose == "batch" and f.bytes > 0, f
    assert A2.files.retrieve(f.id).id == f.id, "another replica serves the same file"
    assert A.files.content(f.id).text.count("\n") == n
    b = A.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                         completion_window="24h", metadata={"job": "sdk"})
    assert b.status == "validating" and b.metadata == {"job": "sdk"} and b.expires_at == b.created_at + 86400, b
    b = wait(A2, b.id)
    assert b.status == "completed", b
    assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == (n, n, 0), b
    assert b.in_progress_at and b.finalizing_at and b.completed_at and b.error_file_id is None, b
    out = [json.loads(l) for l in A.files.content(b.output_file_id).text.splitlines()]
    assert sorted(o["custom_id"] for o in out) == sorted(f"c{i}" for i in range(n)), "one line per custom_id"
    for o in out:
        assert o["id"].startswith("batch_req_") and o["error"] is None, o
        assert o["response"]["status_code"] == 200 and o["response"]["body"]["object"] == "chat.completion", o
    meta = A.files.retrieve(b.output_file_id)
    assert meta.purpose == "batch_output" and meta.bytes == len(A.files.content(b.output_file_id).content), meta
    # Lists: newest first, paged with `after`.
    b2 = A.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    page = A.batches.list(limit=1)
    assert [x.id for x in page.data] == [b2.id] and page.has_more, page
    page2 = A.batches.list(limit=1, after=b2.id)
    assert [x.id for x in page2.data] == [b.id], page2
    ids = [x.id for x in A.files.list()]
    assert f.id in ids and b.output_file_id in ids, ids
    wait(A, b2.id)
    # Cancelling an ended batch is refused; deleting files works once batches ended.
    expect(openai.ConflictError, lambda: A.batches.cancel(b.id))
    d = A.files.delete(f.id)
    assert d.deleted and d.id == f.id, d
    expect(openai.NotFoundError, lambda: A.files.retrieve(f.id))
    print("happy path: ok", flush=True)
    return b


def tenants(b):
    expect(openai.AuthenticationError, lambda: NOBODY.batches.list())
    expect(openai.NotFoundError, lambda: B.batches.retrieve(b.id))
    expect(openai.NotFoundError, lambda: B.batches.cancel(b.id))
    expect(openai.NotFoundError, lambda: B.files.content(b.output_file_id))
    expect(openai.NotFoundError, lambda: B.files.delete(b.output_file_id))
    assert B.batches.list().data == [], "tenant b sees none of a's batches"
    assert all(x.id != b.output_file_id for x in B.files.list()), "nor its files"
    print("tenants: ok", flush=True)


def bad_requests():
    e = expect(openai.BadRequestError, lambda: A.files.create(file=("x.jsonl", io.BytesIO(b"not json\n")), purpose="batch"))
    assert e.code == "invalid_file_format", e
    e = expect(openai.BadRequestError, lambda: A.files.create(file=("x.jsonl", jsonl([line(0)])), purpose="fine-tune"))
    assert e.param == "purpose", e
    e = expect(openai.BadRequestError, lambda: A.files.create(file=("x.jsonl", io.BytesIO(b'{"a":"\xff"}\n')), purpose="batch"))
    f = A.files.create(file=("in.jsonl", jsonl([line(0)])), purpose="batch")
    e = expect(openai.BadRequestError, lambda: A.batches.create(input_file_id=f.id, endpoint="/v1/images/generations", completion_window="24h"))
    assert e.param == "endpoint", e
    e = expect(openai.BadRequestError, lambda: A.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="48h"))
    assert e.param == "completion_window", e
    e = expect(openai.BadRequestError, lambda: A.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                                                                 metadata={f"k{i}": "v" for i in range(17)}))
    assert e.param == "metadata", e
    expect(openai.NotFoundError, lambda: A.batches.create(input_file_id="file-doesnotexist", endpoint="/v1/chat/completions", completion_window="24h"))
    expect(openai.NotFoundError, lambda: A.batches.retrieve("batch_nope"))
    expect(openai.NotFoundError, lambda: A.files.retrieve("../../etc/passwd"))
    print("bad requests: ok", flush=True)


def failed_validation():
    lines = [line(0), line(1, url="/v1/embeddings"), line(0), '{"custom_id": "x", "method": "GET", "url": "/v1/chat/completions", "body": {}}', line(4)]
    f = A.files.create(file=("bad.jsonl", jsonl(lines)), purpose="batch")
    b = wait(A, A.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h").id)
    assert b.status == "failed" and b.failed_at and b.output_file_id is None, b
    named = sorted((e.line, e.code) for e in b.errors.data)
    assert named == [(2, "mismatched_endpoint"), (3, "duplicate_custom_id"), (4, "invalid_method")], named
    print("failed validation: ok", flush=True)


def non_2xx_answers():
    bad_body = {"model": "m", "messages": [], "stream": True}  # the simulator answers 400
    f = A.files.create(file=("mixed.jsonl", jsonl([line(0), line(1, body=bad_body)])), purpose="batch")
    b = wait(A, A.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h").id)
    assert b.status == "completed" and (b.request_counts.completed, b.request_counts.failed) == (1, 1), b
    err = [json.loads(l) for l in A.files.content(b.error_file_id).text.splitlines()]
    assert len(err) == 1 and err[0]["custom_id"] == "c1", err
    assert err[0]["response"]["status_code"] == 400 and err[0]["error"] is None, err
    print("non-2xx answers: ok", flush=True)


happy = happy_path()
tenants(happy)
bad_requests()
failed_validation()
non_2xx_answers()
print("all SDK checks passed")
