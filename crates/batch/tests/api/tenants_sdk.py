"""Per-tenant limits, the Batch object's `usage` and metadata limits, through the official
`openai` SDK, as a tenant would meet them.

Run by crates/batch/tests/api/tenants.rs in two phases (INFERQ_PHASE), against two replicas
(INFERQ_BATCH_URLS) with API keys: tenant a's key (INFERQ_KEY_A) bounds it at 30 lines not yet
finished, tenant b's (INFERQ_KEY_B) has the deployment's --max-enqueued-lines 50.
- "refuse": no processor runs, so nothing finishes: creates past each bound are refused 429
  (`rate_limit_error`) and leave nothing behind; metadata past OpenAI's limits is refused 400.
- "accept": a processor runs: once the work finishes the refused batches are accepted; every
  read of a running batch shows `usage` in step with its counts, and each ended batch's `usage`
  is the sum of its output lines' usage.
Every check is an assert; the first failure ends the run with a non-zero exit.
"""

import io
import json
import os
import time

import openai

URLS = os.environ["INFERQ_BATCH_URLS"].split(",")
A = openai.OpenAI(base_url=URLS[0], api_key=os.environ["INFERQ_KEY_A"], max_retries=0)
B = openai.OpenAI(base_url=URLS[1], api_key=os.environ["INFERQ_KEY_B"], max_retries=0)


def upload(client, n, tag):
    lines = [json.dumps({"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "m", "messages": [{"role": "user", "content": f"{tag} line {i} " * (i % 5 + 1)}],
                                  "max_tokens": 4}}) for i in range(n)]
    return client.files.create(file=(f"{tag}.jsonl", io.BytesIO(("\n".join(lines) + "\n").encode())), purpose="batch")


def create(client, f, **kw):
    return client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h", **kw)


def expect(error, call):
    try:
        call()
    except error as e:
        return e
    raise AssertionError(f"expected {error.__name__}")


def refused(client, f, bound):
    e = expect(openai.RateLimitError, lambda: create(client, f))
    assert e.status_code == 429, e
    body = e.body
    assert body["type"] == "rate_limit_error" and body["code"] == "rate_limit_exceeded", body
    assert f"Limit: {bound} enqueued lines" in body["message"], body
    return e


def wait(client, batch_id, within=60, check=None):
    end = time.time() + within
    while time.time() < end:
        b = client.batches.retrieve(batch_id)
        if check:
            check(b)
        if b.status in ("completed", "failed", "expired", "cancelled"):
            return b
        time.sleep(0.05)
    raise AssertionError(f"batch {batch_id} did not end within {within}s")


def refuse():
    a25, a10, a1 = upload(A, 25, "a25"), upload(A, 10, "a10"), upload(A, 1, "a1")
    first = create(A, a25)
    assert first.status == "validating", first
    refused(A, a10, 30)
    refused(A, a10, 30)
    # Nothing was left behind: the refused creates are not batches, and 5 more lines fit.
    assert [b.id for b in A.batches.list().data] == [first.id]
    b40, b20 = upload(B, 40, "b40"), upload(B, 20, "b20")
    create(B, b40)
    refused(B, b20, 50)
    # Metadata past OpenAI's limits: 400 naming it; at the limits: taken.
    for meta, param, code in [
        ({f"k{i}": "v" for i in range(17)}, "metadata", "object_above_max_properties"),
        ({"k" * 65: "v"}, "metadata", "string_above_max_length"),
        ({"k": "v" * 513}, "metadata.k", "string_above_max_length"),
    ]:
        e = expect(openai.BadRequestError, lambda: create(A, a1, metadata=meta))
        assert (e.param, e.code, e.body["type"]) == (param, code, "invalid_request_error"), e.body
    full = {f"{i:0>64}": "é" * 512 for i in range(16)}
    kept = create(A, a1, metadata=full)
    assert kept.metadata == full, kept
    assert len(A.batches.list().data) == 2
    print("refuse: ok", flush=True)


def usage_of_lines(client, b):
    total = {"input": 0, "output": 0, "total": 0}
    for line in client.files.content(b.output_file_id).text.splitlines():
        u = json.loads(line)["response"]["body"]["usage"]
        total["input"] += u["prompt_tokens"]
        total["output"] += u["completion_tokens"]
        total["total"] += u["total_tokens"]
    return total


def same_usage(client, b):
    u = b.usage
    assert u is not None and u.input_tokens_details.cached_tokens == 0 and u.output_tokens_details.reasoning_tokens == 0, b
    lines = usage_of_lines(client, b)
    assert (u.input_tokens, u.output_tokens, u.total_tokens) == (lines["input"], lines["output"], lines["total"]), (u, lines)
    assert u.input_tokens > 0 and u.total_tokens == u.input_tokens + u.output_tokens, u


def accept():
    for client in (A, B):
        for b in client.batches.list().data:
            ended = wait(client, b.id)
            assert ended.status == "completed", ended
            same_usage(client, ended)
    a10 = [f for f in A.files.list() if f.filename == "a10.jsonl"][0]
    b20 = [f for f in B.files.list() if f.filename == "b20.jsonl"][0]
    create(B, b20)
    ten = create(A, a10)
    # Read while it runs: usage moves with the counts (every line answers 4 tokens).
    seen = []

    def in_step(b):
        c = b.request_counts
        assert b.usage.output_tokens == 4 * (c.completed + c.failed), b
        if b.status == "in_progress" and 0 < c.completed < c.total:
            seen.append(c.completed)

    ended = wait(A, ten.id, check=in_step)
    assert ended.status == "completed" and seen, (ended, seen)
    same_usage(A, ended)
    # Its lines finished: a whole bound's worth fits again.
    thirty = create(A, upload(A, 30, "a30"))
    refused(A, upload(A, 1, "one-more"), 30)
    ended = wait(A, thirty.id)
    assert ended.status == "completed" and ended.request_counts.completed == 30, ended
    same_usage(A, ended)
    print(f"accept: ok (usage read live at {seen})", flush=True)


{"refuse": refuse, "accept": accept}[os.environ["INFERQ_PHASE"]]()
print("all SDK checks passed")
