"""What the official `openai` SDK's retries do at a passed deadline (issue 44), with its default
max_retries=2: the front door answers 504, which the SDK retries. With an X-Request-Id each
retry joins the same request (its 504 is kept for the fetch grace), so the work runs once;
without one, each retry is a new request.

Run by crates/batch/tests/api/front_sdk.rs against a simulator slower than the deadline, with
INFERQ_BATCH_URLS and INFERQ_KEY_A; INFERQ_CASE is "keyed" or "unkeyed". The test counts the
runs at the simulator.
"""

import os

import openai

URLS = os.environ["INFERQ_BATCH_URLS"].split(",")
KEY = os.environ["INFERQ_KEY_A"]
client = openai.OpenAI(base_url=URLS[0], api_key=KEY)
assert client.max_retries == 2, client.max_retries
headers = {"X-AP-Mode": "wait", "X-Request-Timeout-Seconds": "1"}
if os.environ["INFERQ_CASE"] == "keyed":
    headers["X-Request-Id"] = "retry-1"
try:
    client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "slow"}], max_tokens=4, extra_headers=headers
    )
    raise AssertionError("expected the deadline to pass")
except openai.InternalServerError as e:
    assert e.status_code == 504, e
print("all SDK checks passed")
