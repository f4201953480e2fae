"""Fair share across tenants through the official `openai` Python SDK (issue 34).

Run by crates/batch/tests/api/tenants.rs against a deployment whose replicas give each tenant a
queue of its own (--queue-per-tenant) and whose processor runs the `fair-share` merge policy
with a few slow workers. Tenant a posts a large batch; once it is running, tenant b posts a
small one. b's batch must end first, while a's is still in progress: on one shared queue it
would wait behind every line of a's. Environment: INFERQ_BATCH_URLS, INFERQ_KEY_A,
INFERQ_KEY_B, INFERQ_LARGE (a's lines), INFERQ_SMALL (b's lines).
"""

import io
import json
import os
import time

import openai

URLS = os.environ["INFERQ_BATCH_URLS"].split(",")
A = openai.OpenAI(base_url=URLS[0], api_key=os.environ["INFERQ_KEY_A"], max_retries=0)
B = openai.OpenAI(base_url=URLS[1], api_key=os.environ["INFERQ_KEY_B"], max_retries=0)
LARGE = int(os.environ["INFERQ_LARGE"])
SMALL = int(os.environ["INFERQ_SMALL"])


def batch_of(client, n, tag):
    lines = [
        json.dumps({"custom_id": f"{tag}{i}", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"model": "m", "max_tokens": 4,
                             "messages": [{"role": "user", "content": f"{tag} {i}"}]}})
        for i in range(n)
    ]
    f = client.files.create(file=io.BytesIO(("\n".join(lines) + "\n").encode()), purpose="batch")
    return client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                 completion_window="24h")


large = batch_of(A, LARGE, "a")
# b posts once a's lines are running.
end = time.time() + 60
while time.time() < end:
    a_now = A.batches.retrieve(large.id)
    if a_now.status == "in_progress" and a_now.request_counts.completed >= 10:
        break
    time.sleep(0.1)
else:
    raise AssertionError(f"a's batch never ran: {a_now}")
small = batch_of(B, SMALL, "b")
posted = time.time()
end = posted + 120
while time.time() < end:
    b_now = B.batches.retrieve(small.id)
    if b_now.status in ("completed", "failed", "expired", "cancelled"):
        break
    time.sleep(0.1)
b_took = time.time() - posted
a_then = A.batches.retrieve(large.id)
assert b_now.status == "completed", b_now
assert b_now.request_counts.completed == SMALL, b_now
# The small batch posted later ended first: a's is still running, far from done.
assert a_then.status == "in_progress", a_then
assert a_then.request_counts.completed < LARGE * 3 // 4, a_then
out = B.files.content(b_now.output_file_id).text.splitlines()
assert sorted(json.loads(l)["custom_id"] for l in out) == sorted(f"b{i}" for i in range(SMALL))
print(f"b's {SMALL} lines took {b_took:.1f} s; a had {a_then.request_counts.completed} of {LARGE} done")
A.batches.cancel(large.id)
print("all SDK checks passed")
