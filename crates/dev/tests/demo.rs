//! End-to-end test of `inferq-dev demo`, the README's first command: the built binary starts a real
//! redis-server, the simulator (with its default injected 5xx and 429 answers) and `inferq run`
//! as a child process, pushes 200 requests through, and must report every result and exit 0.
//!
//! Needs `redis-server` on `PATH` (or `$INFERQ_REDIS_SERVER`), like the other end-to-end tests.

use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn demo_delivers_a_result_for_every_request() {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_inferq-dev"))
        .args(["demo", "--requests", "200", "--timeout-s", "20"])
        .output()
        .expect("inferq-dev demo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "inferq-dev demo failed ({})\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains("no loss: 200 submitted, 200 results, 0 missing"),
        "no no-loss line\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    for row in [
        "throughput",
        "latency p99",
        "outcomes",
        "retries",
        "duplicate executions",
    ] {
        assert!(stdout.contains(row), "summary lacks {row:?}\n{stdout}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the demo took {:?}",
        started.elapsed()
    );
}
