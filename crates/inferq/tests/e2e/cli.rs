//! End-to-end tests of the producer-side subcommands (`submit`, `cancel`, `results`) run as
//! the built binary against a real Redis.

use crate::common;

use std::process::Output;

use inferq_client::wire::{Envelope, ResultMessage};
use inferq_testkit::RedisServer;
use redis::AsyncCommands;

fn inferq(redis: &RedisServer, args: &[&str], stdin: &str) -> Output {
    common::cli(args, &[("REDIS_URL", &redis.url())], stdin)
}

/// Sends `sig` (`-STOP`, `-CONT`) to the process `pid`.
fn signal(pid: &str, sig: &str) {
    assert!(std::process::Command::new("kill")
        .args([sig, pid])
        .status()
        .unwrap()
        .success());
}

/// `inferq results` with `args` on `redis`, its standard error piped for [`exit_within`].
fn spawn_results(redis: &RedisServer, args: &[&str]) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_inferq"))
        .args(args)
        .env("REDIS_URL", redis.url())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits up to `limit` for `child` to exit: its status and standard error, or `None` (and the
/// child killed) when it did not exit in time.
async fn exit_within(
    child: &mut std::process::Child,
    limit: std::time::Duration,
) -> Option<(std::process::ExitStatus, String)> {
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            return None;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    Some((status, err))
}

/// `submit` said it submitted nothing, and the queue is indeed empty.
async fn assert_nothing_submitted(redis: &RedisServer, err: &str) {
    assert!(err.contains("nothing was submitted"), "{err}");
    let mut con = common::con(redis).await;
    let pending: u64 = con.zcard("request-sortedset").await.unwrap();
    assert_eq!(pending, 0);
}

/// A bad line is named with its number and reason, and nothing at all is submitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_refuses_a_file_with_a_bad_line_and_names_it() {
    let redis = RedisServer::start().unwrap();
    let input = "{\"id\":\"a\",\"timeout_s\":60,\"payload\":{}}\n\n{\"id\":\"b\",\"payload\":{},\"timeout_s\":0}\n";
    let out = inferq(&redis, &["submit"], input);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 3: timeout_s 0 must be at least 1 second"),
        "{err}"
    );
    assert_nothing_submitted(&redis, &err).await;
}

/// Lines that used to pass the first check and fail later, or not be named: a line that is
/// not UTF-8 and an absurd `timeout_s` are bad lines with their numbers, and nothing is
/// submitted (before: exit 1 without a line for the first, and the line before it already
/// queued for the second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_names_non_utf8_and_absurd_timeout_lines_and_submits_nothing() {
    let redis = RedisServer::start().unwrap();
    let mut input = b"{\"id\":\"a\",\"timeout_s\":60,\"payload\":{}}\n".to_vec();
    input.extend_from_slice(b"{\"id\":\"b\",\"timeout_s\":60,\"payload\":{\"p\":\"\xff\"}}\n");
    input.extend_from_slice(b"{\"id\":\"c\",\"timeout_s\":1e300,\"payload\":{}}\n");
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &input).unwrap();
    let path = file.path().display().to_string();
    let out = inferq(&redis, &["submit", "-f", &path], "");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2: not valid UTF-8"), "{err}");
    assert!(
        err.contains("line 3: timeout_s is too large (1e300 s"),
        "{err}"
    );
    assert_nothing_submitted(&redis, &err).await;
}

/// A `timeout_s` counts from submission, not from when reading began: lines that arrive
/// slowly on standard input are all submitted (before: a 2 s line read 3 s after the first was
/// refused as expired while the others were queued).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_counts_timeouts_from_submission_on_a_slow_stdin() {
    use std::io::Write;
    let redis = RedisServer::start().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_inferq"))
        .args(["submit"])
        .env("REDIS_URL", redis.url())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, r#"{{"id":"early","timeout_s":2,"payload":{{}}}}"#).unwrap();
    stdin.flush().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2_500));
    writeln!(stdin, r#"{{"id":"late","timeout_s":2,"payload":{{}}}}"#).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut con = common::con(&redis).await;
    let pending: u64 = con.zcard("request-sortedset").await.unwrap();
    assert_eq!(pending, 2);
}

/// Redis stalling in the middle of a submission: the command still prints its summary, with
/// what is queued, the lines that may or may not be, and the first line never sent, so a rerun
/// can start at the right line (before: only "timed out", exit 1, and an unknown part queued).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_cut_short_by_redis_says_what_is_queued() {
    let redis = RedisServer::start().unwrap();
    let mut input = String::new();
    for i in 0..20_000 {
        input.push_str(&format!(
            "{{\"id\":\"r{i}\",\"timeout_s\":600,\"payload\":{{}}}}\n"
        ));
    }
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &input).unwrap();
    let path = file.path().display().to_string();
    let url = redis.url();
    let submitting = std::thread::spawn(move || {
        common::cli(
            &["submit", "-f", &path, "--batch", "1"],
            &[("REDIS_URL", &url)],
            "",
        )
    });
    // Let some go in, then freeze Redis (SIGSTOP) until the producer has given up waiting for
    // a reply (3 s per try, three tries), however long that takes on a loaded machine.
    let mut con = common::con(&redis).await;
    let started = std::time::Instant::now();
    loop {
        let n: u64 = con.zcard("request-sortedset").await.unwrap();
        if n >= 100 {
            break;
        }
        assert!(
            !submitting.is_finished() && started.elapsed() < std::time::Duration::from_secs(30),
            "the submit did not get going"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let pid = redis.pid().unwrap().to_string();
    let signal = |sig: &str| {
        assert!(std::process::Command::new("kill")
            .args([sig, pid.as_str()])
            .status()
            .unwrap()
            .success());
    };
    signal("-STOP");
    let frozen = std::time::Instant::now();
    while !submitting.is_finished() && frozen.elapsed() < std::time::Duration::from_secs(60) {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    signal("-CONT");
    let out = submitting.join().unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    let submitted = summary["submitted"].as_u64().unwrap();
    let doubt = &summary["in_doubt_lines"];
    let (first, last) = (doubt[0].as_u64().unwrap(), doubt[1].as_u64().unwrap());
    assert_eq!(first, submitted + 1, "{summary}");
    assert_eq!(
        summary["not_sent_from_line"].as_u64(),
        Some(last + 1),
        "{summary}"
    );
    let queued: u64 = con.zcard("request-sortedset").await.unwrap();
    assert!(
        queued >= submitted && queued <= last,
        "queued {queued}, summary {summary}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("lines {first} to {last} may or may not be queued")),
        "{err}"
    );
}

/// Native and OpenAI Batch lines are submitted as the Go producer would, payload bytes intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_native_and_openai_batch_lines() {
    let redis = RedisServer::start().unwrap();
    let input = concat!(
        r#"{"id":"n1","timeout_s":60,"payload":{"prompt":"<b>","big":12345678901234567890},"metadata":{"userid":"u"}}"#,
        "\n",
        r#"{"custom_id":"task-7","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"hi"}]}}"#,
        "\n"
    );
    let out = inferq(&redis, &["submit", "--queue", "jobs"], input);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(r#""submitted":2"#));
    let mut con = common::con(&redis).await;
    let members: Vec<String> = con.zrange("jobs", 0, -1).await.unwrap();
    let envs: Vec<Envelope> = members
        .iter()
        .map(|m| Envelope::decode(m.as_bytes()).unwrap())
        .collect();
    let n1 = envs.iter().find(|e| e.request.id == "n1").unwrap();
    assert_eq!(
        n1.request.payload.get(),
        r#"{"prompt":"<b>","big":12345678901234567890}"#
    );
    assert_eq!(n1.internal.request_queue_name, "jobs");
    assert_eq!(n1.internal.result_queue_name, "result-list");
    let active: String = con.get("request-active:n1").await.unwrap();
    assert_eq!(active, n1.internal.request_token);
    let t7 = envs.iter().find(|e| e.request.id == "task-7").unwrap();
    assert_eq!(t7.request.endpoint, "/v1/chat/completions");
    assert!(t7
        .request
        .payload
        .get()
        .starts_with(r#"{"model":"m","messages""#));
    // Cancel marks the newest generation; an unknown id is a no-op.
    let out = inferq(&redis, &["cancel", "--queue", "jobs", "n1", "nope"], "");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(r#"{"id":"n1","result":"cancelled"}"#),
        "{text}"
    );
    assert!(
        text.contains(r#"{"id":"nope","result":"no active generation"}"#),
        "{text}"
    );
}

/// `--skip-invalid` over a file read in several batches: every good line is queued once, in
/// line order, whatever bad, blank and CRLF lines lie between them; the bad ones are named and
/// counted as refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_skips_bad_lines_of_a_file_across_batches() {
    let redis = RedisServer::start().unwrap();
    let mut input: Vec<u8> = Vec::new();
    let mut good = Vec::new();
    for i in 0..23 {
        match i % 5 {
            1 => input.extend_from_slice(b"{\"id\": not json}\n"),
            2 => input.extend_from_slice(b"\n  \n"),
            3 => input.extend_from_slice(b"{\"id\":\"bad\xff\",\"timeout_s\":60}\n"),
            _ => {
                good.push(format!("s{i}"));
                input.extend_from_slice(
                    format!(
                        "{{\"id\":\"s{i}\",\"deadline\":{},\"payload\":{{}}}}\r\n",
                        4_000_000_000u64 + i
                    )
                    .as_bytes(),
                );
            }
        }
    }
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &input).unwrap();
    let path = file.path().display().to_string();
    let out = inferq(
        &redis,
        &["submit", "-f", &path, "--batch", "2", "--skip-invalid"],
        "",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let summary: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert_eq!(summary["submitted"].as_u64(), Some(good.len() as u64));
    assert_eq!(summary["refused"].as_u64(), Some(9), "{summary}");
    // Lines count blank ones: entry i % 5 == 1 is the first bad line at line 2.
    assert!(err.contains("line 2:"), "{err}");
    assert!(err.contains("not valid UTF-8"), "{err}");
    let mut con = common::con(&redis).await;
    let members: Vec<String> = con.zrange("request-sortedset", 0, -1).await.unwrap();
    let ids: Vec<String> = members
        .iter()
        .map(|m| Envelope::decode(m.as_bytes()).unwrap().request.id)
        .collect();
    assert_eq!(ids, good, "each good line once, by deadline = line order");
}

/// Standard input is read twice like a file (checked whole, then streamed from a temporary
/// copy), so `submit` does not hold it in memory: 100,000 piped lines peak at about the
/// 12 MB of a small input, where holding them took about 40 MB.
/// `inferq submit` reading `stdin`, run to its end: how it exited and its peak resident set in
/// KiB (the kernel's account of it at exit).
fn submit_peak_kib(redis: &RedisServer, stdin: std::fs::File) -> (std::process::ExitStatus, i64) {
    use std::os::unix::process::ExitStatusExt;
    // Reaped by wait4 below, which also reports its peak memory (std's wait does not).
    #[allow(clippy::zombie_processes)]
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_inferq"))
        .arg("submit")
        .env("REDIS_URL", redis.url())
        .stdin(stdin)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut status = 0;
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `usage` is a valid rusage to write into; the pid is our own unwaited child.
    let waited = unsafe { libc::wait4(child.id() as i32, &mut status, 0, usage.as_mut_ptr()) };
    assert_eq!(waited, child.id() as i32);
    // SAFETY: wait4 filled it in.
    let peak_kib = unsafe { usage.assume_init() }.ru_maxrss;
    (std::process::ExitStatus::from_raw(status), peak_kib)
}

/// `inferq submit` of `file` on standard input, which must succeed and queue all its `lines`;
/// its peak resident set in KiB.
async fn submit_every_line(redis: &RedisServer, file: &tempfile::NamedTempFile, lines: u64) -> i64 {
    let (status, peak_kib) = submit_peak_kib(redis, std::fs::File::open(file.path()).unwrap());
    assert!(status.success(), "{status}");
    let mut con = common::con(redis).await;
    let pending: u64 = con.zcard("request-sortedset").await.unwrap();
    assert_eq!(pending, lines);
    peak_kib
}

/// A temporary file of `lines` lines, line `i` made by `line(i)`, written as it is made.
fn jsonl_file(lines: u64, line: impl Fn(u64) -> String) -> tempfile::NamedTempFile {
    use std::io::Write;
    let file = tempfile::NamedTempFile::new().unwrap();
    let mut w = std::io::BufWriter::new(std::fs::File::create(file.path()).unwrap());
    for i in 0..lines {
        writeln!(w, "{}", line(i)).unwrap();
    }
    w.flush().unwrap();
    file
}

/// Big requests are sent a few megabytes at a time, whatever `--batch` says: 48 requests of
/// 2 MiB are all queued while submit holds tens of megabytes. Before, a batch was 500 lines
/// whatever their size, all held at once (60 requests of 4 MB: 729 MB; 500 near the 16 MiB
/// limit would be gigabytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_of_big_requests_holds_a_few_megabytes_not_a_batch() {
    let redis = RedisServer::start().unwrap();
    let lines = 48;
    let prompt = "p".repeat(2 << 20);
    let file = jsonl_file(lines, |i| {
        format!("{{\"id\":\"big{i}\",\"timeout_s\":600,\"payload\":{{\"prompt\":\"{prompt}\"}}}}")
    });
    let peak_kib = submit_every_line(&redis, &file, lines).await;
    assert!(
        peak_kib < 64 * 1024,
        "submit peaked at {peak_kib} KiB for {lines} requests of 2 MiB"
    );
}

/// SIGTERM part-way through a submission stops it between two batches and prints the summary
/// with the first line not sent: exactly the requests it counts are queued, so a rerun from
/// that line neither loses nor repeats one. Before, the signal killed it with no summary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_stopped_by_a_signal_says_where_to_go_on_from() {
    let redis = RedisServer::start().unwrap();
    let lines = 200_000u64;
    let file = jsonl_file(lines, |i| {
        format!("{{\"id\":\"s{i}\",\"timeout_s\":600,\"payload\":{{\"n\":{i}}}}}")
    });
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_inferq"))
        .args(["submit", "--file"])
        .arg(file.path())
        .env("REDIS_URL", redis.url())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut con = common::con(&redis).await;
    while con.zcard::<_, u64>("request-sortedset").await.unwrap() == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    signal(&child.id().to_string(), "-TERM");
    let (status, stderr) = exit_within(&mut child, std::time::Duration::from_secs(60))
        .await
        .expect("submit did not stop");
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut stdout).unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    let summary: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let submitted = summary["submitted"].as_u64().unwrap();
    assert!(submitted < lines, "the signal came after the end");
    assert_eq!(summary["not_sent_from_line"], submitted + 1, "{summary}");
    let pending: u64 = con.zcard("request-sortedset").await.unwrap();
    assert_eq!(pending, submitted);
    assert!(stderr.contains("stopped by a signal"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_from_stdin_does_not_hold_the_input_in_memory() {
    let redis = RedisServer::start().unwrap();
    let lines = 100_000;
    let file = jsonl_file(lines, |i| {
        format!("{{\"id\":\"r{i}\",\"timeout_s\":600,\"payload\":{{\"model\":\"m\",\"messages\":[{{\"role\":\"user\",\"content\":\"summarise document {i} of the batch\"}}]}}}}")
    });
    let peak_kib = submit_every_line(&redis, &file, lines).await;
    assert!(
        peak_kib < 25 * 1024,
        "submit peaked at {peak_kib} KiB for {lines} lines on standard input"
    );
}

/// Standard input cannot be copied aside (no room, no such directory): the command says why
/// and where, and submits nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_says_so_when_stdin_cannot_be_copied_aside() {
    let redis = RedisServer::start().unwrap();
    let input = "{\"id\":\"a\",\"timeout_s\":60,\"payload\":{}}\n";
    let out = common::cli(
        &["submit"],
        &[
            ("REDIS_URL", &redis.url()),
            ("TMPDIR", "/nonexistent/inferq"),
        ],
        input,
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot copy standard input to a temporary file in /nonexistent/inferq"),
        "{err}"
    );
    assert_nothing_submitted(&redis, &err).await;
}

/// `results` writes JSONL; `--consumer` (now the durable mode) first hands back what an older
/// inferq's `--consumer` under the name took and never acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_writes_jsonl_and_reliable_mode_survives_a_dead_consumer() {
    let redis = RedisServer::start().unwrap();
    let mut con = common::con(&redis).await;
    for id in ["a", "b", "c"] {
        let _: () = con
            .lpush("result-list", ResultMessage::http(id, 200, b"{}").to_json())
            .await
            .unwrap();
    }
    // An older inferq's reliable consumer that takes one result and dies before storing it.
    let producer = common::producer(&redis, "request-sortedset").await;
    let mut dying = producer.reliable("w1").await.unwrap();
    let taken = dying
        .take(std::time::Duration::from_secs(1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(taken.result.unwrap().id, "a");
    drop(dying);
    // Its name's lease lapses as a dead consumer's does (shortened here from 15 s).
    let _: () = con
        .pexpire("result-list:taken:w1:lease", 300)
        .await
        .unwrap();
    let out = inferq(
        &redis,
        &["results", "-n", "3", "--timeout", "5s", "--consumer", "w1"],
        "",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<ResultMessage> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ids: Vec<&str> = lines.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["a", "b", "c"], "the handed-back result comes first");
    let taken_left: u64 = con.llen("result-list:taken:w1").await.unwrap();
    assert_eq!(taken_left, 0);
    let acked: u64 = con
        .zcard("result-list:result-ack-tombstones")
        .await
        .unwrap();
    assert_eq!(acked, 3, "taken and acked by the durable protocol");
    // Timing out short of N exits non-zero.
    let out = inferq(&redis, &["results", "-n", "1", "--timeout", "300ms"], "");
    assert_eq!(out.status.code(), Some(1));
}

/// A Redis that stops answering mid-run (frozen here with SIGSTOP; `DEBUG SLEEP` or a path
/// that drops packets do the same): `results --timeout 2s`, plain or durable, exits 1 saying
/// Redis does not answer, a few seconds past its timeout (before, it waited for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_gives_up_on_a_redis_that_stops_answering() {
    use std::time::{Duration, Instant};
    for (mode, args, waiting_in) in [
        ("plain", &["results", "--timeout", "2s"][..], "cmd=brpop"),
        (
            "durable",
            &["results", "--timeout", "2s", "--durable", "w1"][..],
            "cmd=evalsha",
        ),
    ] {
        let redis = RedisServer::start().unwrap();
        let mut child = spawn_results(&redis, args);
        // Frozen only once the consumer waits in its blocking pop.
        let mut con = common::con(&redis).await;
        let started = Instant::now();
        loop {
            let clients: String = redis::cmd("CLIENT")
                .arg("LIST")
                .query_async(&mut con)
                .await
                .unwrap();
            // Durable: past the start's hand-back of an older consumer (its lease dropped).
            let handing_back: bool = con.exists("result-list:taken:w1:lease").await.unwrap();
            if clients.contains(waiting_in) && !handing_back {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{mode}: {clients}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let pid = redis.pid().unwrap().to_string();
        signal(&pid, "-STOP");
        let exited = exit_within(&mut child, Duration::from_secs(30)).await;
        signal(&pid, "-CONT");
        let Some((status, err)) = exited else {
            panic!("{mode}: results still waits 30 s after its 2 s timeout");
        };
        assert_eq!(status.code(), Some(1), "{mode}: {err}");
        assert!(err.contains("no answer within"), "{mode}: {err}");
    }
}

/// A Redis frozen before `results` has connected (it accepts the connection and never
/// answers): the timeout bounds the start too, so the command gives up at it and says so
/// (before, it waited for the connection's own timeout: 6.5 s for a 1 s `--timeout`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_gives_up_at_its_timeout_on_a_redis_frozen_before_it_answers() {
    use std::time::Duration;
    for (mode, args) in [
        ("plain", &["results", "--timeout", "1s"][..]),
        (
            "durable",
            &["results", "--timeout", "1s", "--durable", "w1"][..],
        ),
    ] {
        let redis = RedisServer::start().unwrap();
        let pid = redis.pid().unwrap().to_string();
        signal(&pid, "-STOP");
        let mut child = spawn_results(&redis, args);
        let exited = exit_within(&mut child, Duration::from_secs(30)).await;
        signal(&pid, "-CONT");
        let Some((status, err)) = exited else {
            panic!("{mode}: results still waits 30 s after its 1 s timeout");
        };
        assert_eq!(status.code(), Some(1), "{mode}: {err}");
        assert!(
            err.contains("Redis did not answer within the timeout (1s); no result was taken"),
            "{mode}: {err}"
        );
    }
}

/// Plain `results` (Go's destructive pop) writes each result as it was stored, fields inferq
/// does not know included, and writes an entry that does not parse too, with a warning, and
/// goes on (before: the popped entry was lost, the run stopped with exit 1, and known results
/// were re-serialised without their unknown fields).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_keeps_what_it_pops_as_it_was_stored() {
    let redis = RedisServer::start().unwrap();
    let mut con = common::con(&redis).await;
    let stored = [
        ResultMessage::http("a", 200, b"{}").to_json(),
        r#"{"id":"b","status_code":200,"payload":"{}","extra":1}"#.to_owned(),
        "not json".to_owned(),
        ResultMessage::http("c", 200, b"{}").to_json(),
    ];
    for entry in &stored {
        let _: () = con.lpush("result-list", entry).await.unwrap();
    }
    let out = inferq(&redis, &["results", "-n", "4", "--timeout", "5s"], "");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(written, stored, "in order, byte for byte");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not parse"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `TOKIO_WORKER_THREADS` (the runtime's thread count) that cannot be used is bad input: exit 2
/// naming the variable and the value, where Tokio itself would have panicked. A usable value
/// runs as usual.
#[test]
fn an_unusable_worker_thread_count_is_bad_input() {
    for bad in ["0", "two", "-1", ""] {
        let out = common::cli(
            &["submit", "--redis-url", "redis://127.0.0.1:1/"],
            &[("TOKIO_WORKER_THREADS", bad)],
            "",
        );
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("TOKIO_WORKER_THREADS")
                && err.contains("at least 1")
                && err.contains(&format!("{bad:?}")),
            "{bad:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    // Past the check, to the point of reaching for Redis (none listens there).
    let out = common::cli(
        &["submit", "--redis-url", "redis://127.0.0.1:1/"],
        &[("TOKIO_WORKER_THREADS", "1")],
        "",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot connect to Redis"), "{err}");
}

/// A config file that cannot be read (or a certificate that cannot be used) is reported with its
/// cause once (before: "cannot read \"/no/such\": No such file or directory (os error 2): No
/// such file or directory (os error 2)").
#[test]
fn a_config_error_states_its_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let not_a_cert = dir.path().join("transport.json");
    std::fs::write(
        &not_a_cert,
        r#"{"url":"redis://127.0.0.1:1","queues":[{"queue_name":"q","igw_base_url":"http://gw"}]}"#,
    )
    .unwrap();
    let transport = format!("--transport-config-file={}", not_a_cert.display());
    let base = [
        "run",
        "--metrics-endpoint-auth=false",
        "--health-port=0",
        "--metrics-port=0",
        "--transport=redis-sortedset",
    ];
    let dir_flag = format!("--pool-config-file={}", dir.path().display());
    let ca_flag = format!("--tls-ca-cert={}", not_a_cert.display());
    let cases = [
        (
            vec!["--transport-config-file=/no/such/transport.json"],
            "No such file or directory",
        ),
        (
            vec![transport.as_str(), dir_flag.as_str()],
            "Is a directory",
        ),
        (
            vec![transport.as_str(), ca_flag.as_str()],
            "no PEM certificates",
        ),
    ];
    for (flags, cause) in cases {
        let args: Vec<&str> = base.iter().copied().chain(flags).collect();
        let out = common::cli(&args, &[], "");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.matches(cause).count(), 1, "{err}");
    }
}

/// `--redis-url` is read as `inferq run` reads its `url`: `?db=N` selects the database, as in
/// go-redis (before: `submit` wrote to database 0 while the processor, given the same URL,
/// served database 3), and a URL that cannot work is bad input naming the flag (before: exit 1,
/// "cannot connect to Redis: url http://x: Redis URL did not parse").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_url_flag_is_read_as_the_processor_reads_it() {
    let redis = RedisServer::start().unwrap();
    let url = format!("redis://127.0.0.1:{}?db=3", redis.port());
    let line = "{\"id\":\"a\",\"timeout_s\":60,\"payload\":{}}\n";
    let out = common::cli(&["submit", "--redis-url", &url], &[], line);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut con = common::con(&redis).await;
    assert_eq!(queued_in_db(&mut con, 3).await, (1, 0));

    for (bad, reason) in [
        ("http://127.0.0.1:1", "scheme must be"),
        ("redis://127.0.0.1:1?dbb=3", "unexpected option dbb"),
    ] {
        for args in [
            vec!["submit", "--redis-url", bad],
            vec!["dead-letter", "list", "--redis-url", bad],
        ] {
            let out = common::cli(&args, &[], "");
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
            assert!(
                err.contains("--redis-url: ") && err.contains(reason),
                "{args:?}: {err}"
            );
        }
    }
}

/// `submit -f` naming a directory is bad input (before: exit 1, "cannot read input: Is a
/// directory (os error 21)").
#[test]
fn submit_refuses_a_directory_as_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().display().to_string();
    let out = common::cli(
        &["submit", "--redis-url", "redis://127.0.0.1:1/", "-f", &path],
        &[],
        "",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("is a directory, not a JSONL file"), "{err}");
}

/// A `unix://` Redis URL in go-redis's form, user and password before the socket path, reaches
/// that Redis as that user (before, the URL was refused as having no host), and its `db` option
/// selects the database. The default user is switched off, so nothing gets in without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_redis_unix_url_with_credentials_is_used_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("redis.sock");
    let redis =
        RedisServer::start_with_args(vec!["--unixsocket".into(), socket.display().to_string()])
            .unwrap();
    let mut admin = common::con(&redis).await;
    for rule in [
        vec!["SETUSER", "app", "on", ">p@ss+1", "~*", "&*", "+@all"],
        vec!["SETUSER", "admin", "on", ">adm", "~*", "&*", "+@all"],
    ] {
        let _: () = redis::cmd("ACL")
            .arg(&rule)
            .query_async(&mut admin)
            .await
            .unwrap();
    }
    let admin_url = format!("redis://admin:adm@127.0.0.1:{}/", redis.port());
    let mut admin = inferq_client::connect::manager(&redis::Client::open(admin_url).unwrap())
        .await
        .unwrap();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "default", "off"])
        .query_async(&mut admin)
        .await
        .unwrap();
    let line = "{\"id\":\"u\",\"timeout_s\":60,\"payload\":{}}\n";
    let url = format!("unix://app:p%40ss+1@{}?db=2", socket.display());
    let out = common::cli(&["submit", "--redis-url", &url], &[], line);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("p@ss") && !err.contains("p%40ss"), "{err}");
    assert_eq!(queued_in_db(&mut admin, 2).await, (1, 0));
    let wrong = format!("unix://app:nope@{}", socket.display());
    let out = common::cli(&["submit", "--redis-url", &wrong], &[], line);
    assert_ne!(out.status.code(), Some(0), "a wrong password gets in");
}

/// How many requests `request-sortedset` holds in database `db` and in database 0.
async fn queued_in_db(con: &mut redis::aio::ConnectionManager, db: u32) -> (u64, u64) {
    redis::pipe()
        .cmd("SELECT")
        .arg(db)
        .ignore()
        .zcard("request-sortedset")
        .cmd("SELECT")
        .arg(0)
        .ignore()
        .zcard("request-sortedset")
        .query_async(con)
        .await
        .unwrap()
}

/// Ctrl-C (SIGINT) or SIGTERM stops `results --consumer` (the durable mode) as its timeout
/// does: between results, holding no claim, so a consumer restarted under the name takes what
/// waits at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_consumer_stops_between_results_on_a_signal() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let redis = RedisServer::start().unwrap();
    let mut con = common::con(&redis).await;
    for sig in ["-INT", "-TERM"] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_inferq"))
            .args(["results", "--timeout", "60s", "--consumer", "w1"])
            .env("REDIS_URL", redis.url())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Signalled once it asks the empty list in its loop.
        let started = Instant::now();
        loop {
            let clients: String = redis::cmd("CLIENT")
                .arg("LIST")
                .query_async(&mut con)
                .await
                .unwrap();
            let handing_back: bool = con.exists("result-list:taken:w1:lease").await.unwrap();
            if clients.contains("cmd=evalsha") && !handing_back {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(20), "{clients}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(Command::new("kill")
            .args([sig, &child.id().to_string()])
            .status()
            .unwrap()
            .success());
        let signalled = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(
                signalled.elapsed() < Duration::from_secs(10),
                "{sig}: results still runs 10 s after the signal"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert_eq!(status.code(), Some(1), "{sig}: {err}");
        assert!(err.contains("stopped by a signal"), "{sig}: {err}");
        let held: u64 = con.zcard("result-list:result-claims-idx").await.unwrap();
        assert_eq!(held, 0, "{sig}: a stopped consumer holds no claim: {err}");
    }
    // A successor under the name starts at once and gets what waits.
    let _: () = con
        .lpush(
            "result-list",
            ResultMessage::http("a", 200, b"{}").to_json(),
        )
        .await
        .unwrap();
    let started = Instant::now();
    let out = inferq(
        &redis,
        &["results", "-n", "1", "--timeout", "10s", "--consumer", "w1"],
        "",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the restart took {:?}",
        started.elapsed()
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"id\":\"a\""));
}

/// `inferq --version` names the commit the binary was built from, on every subcommand too.
#[test]
fn the_version_names_the_commit() {
    let head = std::process::Command::new("git")
        .args([
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "rev-parse",
            "--short=12",
            "HEAD",
        ])
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&head.stdout).trim().to_owned();
    assert_eq!(head.len(), 12, "not in a git work tree: {head:?}");
    for args in [&["--version"][..], &["run", "--version"][..]] {
        let out = common::cli(args, &[], "");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{args:?}: {out:?}");
        assert!(
            text.contains(&format!("{} (commit {head})", env!("CARGO_PKG_VERSION"))),
            "{args:?}: {text}"
        );
    }
}

/// The completion scripts come from the same definitions as the parser: bash's parses
/// (`bash -n`) and completes the subcommands and `run`'s flags; every shell clap knows gets one;
/// an unknown shell is bad input (exit 2).
#[test]
fn completion_scripts_know_the_commands_and_flags() {
    let out = common::cli(&["completions", "bash"], &[], "");
    assert!(out.status.success(), "{out:?}");
    let script = String::from_utf8_lossy(&out.stdout).into_owned();
    for word in [
        "batch-api",
        "dead-letter",
        "--drain-timeout",
        "--transport-config-file",
    ] {
        assert!(script.contains(word), "the bash script lacks {word}");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("inferq.bash");
    std::fs::write(&path, &script).unwrap();
    let syntax = std::process::Command::new("bash")
        .arg("-n")
        .arg(&path)
        .output()
        .unwrap();
    assert!(syntax.status.success(), "bash -n: {syntax:?}");
    // Sourced, the script registers the completion function for `inferq`.
    let registered = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("source {} && complete -p inferq", path.display()))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&registered.stdout).contains("inferq"),
        "{registered:?}"
    );
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let out = common::cli(&["completions", shell], &[], "");
        assert!(
            out.status.success() && out.stdout.len() > 1000,
            "{shell}: {out:?}"
        );
    }
    let out = common::cli(&["completions", "tcsh"], &[], "");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// `inferq man --dir` writes a page per command, and each is clean roff: `groff -ww` warns of
/// nothing, and `run`'s page documents its flags.
#[test]
fn man_pages_are_written_one_per_command() {
    let dir = tempfile::tempdir().unwrap();
    let out = common::cli(&["man", "--dir", dir.path().to_str().unwrap()], &[], "");
    assert!(out.status.success(), "{out:?}");
    let listed = String::from_utf8_lossy(&out.stdout).into_owned();
    for page in [
        "inferq.1",
        "inferq-run.1",
        "inferq-batch-api.1",
        "inferq-status.1",
    ] {
        let path = dir.path().join(page);
        assert!(path.exists(), "{page} missing: {listed}");
        assert!(listed.contains(page), "{page} not named: {listed}");
        let groff = std::process::Command::new("groff")
            .args(["-man", "-Tutf8", "-ww", "-z"])
            .arg(&path)
            .output();
        // groff is Debian's groff-base, on every Debian with man-db; skip the lint without it.
        if let Ok(groff) = groff {
            assert!(
                groff.status.success() && groff.stderr.is_empty(),
                "{page}: {}",
                String::from_utf8_lossy(&groff.stderr)
            );
        }
    }
    let run = std::fs::read_to_string(dir.path().join("inferq-run.1")).unwrap();
    assert!(run.contains("drain\\-timeout"), "{run}");
    // A directory that cannot be made is bad input naming the flag.
    let file = dir.path().join("inferq.1");
    let out = common::cli(&["man", "--dir", file.join("x").to_str().unwrap()], &[], "");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--dir"),
        "{out:?}"
    );
}

/// `inferq run --help` lists the flags to use first; Go's deprecated flags come under a heading
/// of their own after them, so the new flags do not make the list to read longer (issue 44).
#[test]
fn run_help_lists_go_s_deprecated_flags_apart() {
    let out = common::cli(&["run", "--help"], &[], "");
    let help = String::from_utf8_lossy(&out.stdout);
    let (ours, go) = help
        .split_once("Go's deprecated flags")
        .unwrap_or_else(|| panic!("no heading of Go's deprecated flags:\n{help}"));
    for flag in [
        "--redis.url",
        "--redis.ss.queues-config",
        "--message-queue-impl",
        "--request-merge-policy-config ",
    ] {
        assert!(
            !ours.contains(flag),
            "{flag} among the flags to use:\n{ours}"
        );
        assert!(go.contains(flag), "{flag} not under Go's heading:\n{go}");
    }
    assert!(ours.contains("--health-address"), "{ours}");
    let listed = ours
        .lines()
        .filter(|l| l.trim_start().starts_with("--"))
        .count();
    assert!(listed <= 50, "{listed} flags before Go's:\n{ours}");
}

/// `inferq batch-api` without a file store names both ways to give one (issue 44: it named
/// `--files-dir` alone).
#[test]
fn batch_api_without_a_file_store_names_files_dir_and_files_url() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("transport.json");
    std::fs::write(
        &config,
        r#"{"url":"redis://127.0.0.1:1","queues":[{"queue_name":"q","igw_base_url":"http://x"}]}"#,
    )
    .unwrap();
    let out = common::cli(
        &[
            "batch-api",
            "--transport-config-file",
            &config.display().to_string(),
        ],
        &[],
        "",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--files-dir") && err.contains("--files-url"),
        "{err}"
    );
}

/// getting-started.md's manual start, line by line as the page has it (its example ports
/// replaced by free ones): the request's result comes back, and no process logs a warning
/// (issue 44: the documented `inferq run` line warned at every start).
#[test]
fn the_manual_start_of_getting_started_runs_without_a_warning() {
    use std::os::unix::process::CommandExt;
    let page = include_str!("../../../../docs/src/getting-started.md");
    let section = page
        .split("## A manual start")
        .nth(1)
        .and_then(|s| s.split("```sh\n").nth(1))
        .and_then(|s| s.split("```").next())
        .expect("getting-started.md has a manual start");
    let mut script = section.to_owned();
    for port in ["6399", "8099", "8081", "9090"] {
        let free = inferq_testkit::free_port().unwrap().to_string();
        script = script.replace(port, &free);
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_inferq"))
        .parent()
        .unwrap()
        .display()
        .to_string();
    let path = format!("{bin}:{}", std::env::var("PATH").unwrap_or_default());
    // Give Redis and the processor a moment before the request, as a person typing does.
    let script = script
        .replace("\ninferq run", "\nsleep 1\ninferq run")
        .replace("\necho '{\"id\"", "\nsleep 2\necho '{\"id\"");
    let mut child = std::process::Command::new("bash")
        .args(["-c", &format!("set -e\n{script}")])
        .current_dir(dir.path())
        .env("PATH", path)
        .env_remove("REDIS_URL")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let pgid = child.id();
    let stdout = child.stdout.take();
    let status = child.wait().unwrap();
    let mut out = String::new();
    if let Some(mut s) = stdout {
        let _ = std::io::Read::read_to_string(&mut s, &mut out);
    }
    let _ = std::process::Command::new("kill")
        .args(["-TERM", "--", &format!("-{pgid}")])
        .status();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let logs: String = ["redis.log", "sim.log", "inferq.log"]
        .iter()
        .map(|f| std::fs::read_to_string(dir.path().join(f)).unwrap_or_default())
        .collect();
    assert!(status.success(), "{out}\n{logs}");
    assert!(out.contains("hello-1"), "no result:\n{out}\n{logs}");
    let inferq_log = std::fs::read_to_string(dir.path().join("inferq.log")).unwrap_or_default();
    let sim_log = std::fs::read_to_string(dir.path().join("sim.log")).unwrap_or_default();
    assert!(!inferq_log.contains(" WARN "), "{inferq_log}");
    assert!(!sim_log.contains(" WARN "), "{sim_log}");
    assert!(!inferq_log.is_empty(), "the processor logged nothing");
}
