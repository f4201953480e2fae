"""Expiry and retention through the official `openai` SDK: `expires_after` on uploads,
`output_expires_after` on batches, and what the sweeper removes.

Run by crates/batch/tests/api/tenants.rs against two replicas (INFERQ_BATCH_URLS) started with
short retentions: --min-expires-after 1s, --file-retention 6s, --batch-retention 3s,
--sweep-interval 1s. It prints the ids it made (`made: <json>`) for the Rust side, which then
checks the stored objects and Redis keys are gone.
Every check is an assert; the first failure ends the run with a non-zero exit.
"""

import io
import json
import os
import time

import openai

URLS = os.environ["INFERQ_BATCH_URLS"].split(",")
C = openai.OpenAI(base_url=URLS[0], api_key="sk-unused-0123456789", max_retries=0)
C2 = openai.OpenAI(base_url=URLS[1], api_key="sk-unused-0123456789", max_retries=0)


def jsonl(n):
    lines = [json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 4}})
             for i in range(n)]
    return io.BytesIO(("\n".join(lines) + "\n").encode())


def expect(error, call):
    try:
        call()
    except error as e:
        return e
    raise AssertionError(f"expected {error.__name__}")


def gone(client, what, call, within):
    end = time.time() + within
    while time.time() < end:
        try:
            call()
        except openai.NotFoundError:
            return time.time()
        time.sleep(0.1)
    raise AssertionError(f"{what} still there after {within}s")


# expires_after is checked as OpenAI does.
for after, param, code in [
    ({"anchor": "created_at", "seconds": 0}, "expires_after.seconds", "integer_below_min_value"),
    ({"anchor": "created_at", "seconds": 2592001}, "expires_after.seconds", "integer_above_max_value"),
    ({"anchor": "last_active_at", "seconds": 3600}, "expires_after.anchor", "invalid_value"),
]:
    e = expect(openai.BadRequestError, lambda: C.files.create(file=("x.jsonl", jsonl(1)), purpose="batch", expires_after=after))
    assert (e.param, e.code) == (param, code), e.body
assert [f.id for f in C.files.list()] == [], "a refused upload keeps nothing"

short = C.files.create(file=("short.jsonl", jsonl(2)), purpose="batch", expires_after={"anchor": "created_at", "seconds": 2})
assert short.expires_at == short.created_at + 2, short
kept = C.files.create(file=("kept.jsonl", jsonl(5)), purpose="batch")
assert kept.expires_at == kept.created_at + 6, kept
assert C2.files.retrieve(kept.id).expires_at == kept.expires_at

e = expect(openai.BadRequestError, lambda: C.batches.create(input_file_id=kept.id, endpoint="/v1/chat/completions", completion_window="24h",
                                                             output_expires_after={"anchor": "created_at", "seconds": 0}))
assert (e.param, e.code) == ("output_expires_after.seconds", "integer_below_min_value"), e.body
b = C.batches.create(input_file_id=kept.id, endpoint="/v1/chat/completions", completion_window="24h",
                     output_expires_after={"anchor": "created_at", "seconds": 2})
end = time.time() + 30
while C.batches.retrieve(b.id).status != "completed":
    assert time.time() < end, "the batch did not complete"
    time.sleep(0.1)
b = C.batches.retrieve(b.id)
ended_at = time.time()
out = C.files.retrieve(b.output_file_id)
assert out.expires_at == out.created_at + 2, out
assert C.files.content(b.output_file_id).text.count("\n") == 5

gone(C, "the file uploaded with expires_after 2s", lambda: C2.files.retrieve(short.id), 10)
gone(C, "the output file (output_expires_after 2s)", lambda: C.files.content(out.id), 10)
gone(C, "the ended batch (--batch-retention 3s)", lambda: C2.batches.retrieve(b.id), 10)
assert C.batches.list().data == []
# The input file outlived its 6 s while the batch read it only if the batch took that long; it
# goes at its expiry either way.
gone(C, "the input file (--file-retention 6s)", lambda: C.files.retrieve(kept.id), 15)
assert C.files.list().data == []
print("made: " + json.dumps({"files": [short.id, kept.id, out.id], "batch": b.id}), flush=True)
print("all SDK checks passed")
