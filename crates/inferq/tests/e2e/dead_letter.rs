//! Bad input end to end: every kind of malformed member written straight into the request
//! sorted set is dead-lettered with a reason a user can act on (plus `INVALID_REQUEST` where
//! its id can be read) while the good requests around it are served; then `inferq dead-letter
//! list|requeue|purge` against that dead list, run as the built binary against a real Redis.

use crate::common;

use std::process::{Command, Output};
use std::time::Duration;

use common::{Gateway, Processor, ProcessorOpts};
use inferq::queue::dead::{DeadRecord, KEPT_PREFIX_BYTES};
use inferq_client::producer::unix_ms;
use inferq_client::wire::{Envelope, ErrorCode, Routing, MAX_MEMBER_BYTES};
use inferq_testkit::RedisServer;
use redis::AsyncCommands;

const QUEUE: &str = "request-sortedset";
const DEAD: &str = "request-sortedset:dead";

fn inferq(redis: &RedisServer, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_inferq"))
        .args(args)
        .env("REDIS_URL", redis.url())
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// One malformed member: its bytes, words its dead-letter reason must contain, and the id an
/// `INVALID_REQUEST` result must carry (when one can be read).
struct Bad {
    member: Vec<u8>,
    reason: &'static str,
    id: Option<&'static str>,
}

fn bad(member: &str, reason: &'static str, id: Option<&'static str>) -> Bad {
    Bad {
        member: member.as_bytes().to_vec(),
        reason,
        id,
    }
}

fn malformed(deadline: i64) -> Vec<Bad> {
    let d = deadline;
    let mut oversized = format!(
        r#"{{"internal":{{"request_token":"tok-big"}},"request_kind":"plain","data":{{"id":"big1","deadline":{d},"payload":{{"prompt":""#
    )
    .into_bytes();
    oversized.resize(17 * 1024 * 1024, b'x');
    oversized.extend_from_slice(br#""}}}"#);
    let mut not_utf8 =
        format!(r#"{{"request_kind":"plain","data":{{"id":"utf","deadline":{d},"payload":{{"p":""#)
            .into_bytes();
    not_utf8.extend_from_slice(b"\xff\xfe");
    not_utf8.extend_from_slice(br#""}}}"#);
    vec![
        bad("this is not json", "not valid JSON", None),
        bad("{\"request_kind\":\"plain\",", "not valid JSON", None),
        bad("[1,2,3]", "not an envelope object", None),
        bad("\"just a string\"", "not an envelope object", None),
        bad("{}", "no request_kind", None),
        bad(
            &format!(r#"{{"request_kind":"shiny","data":{{"id":"k1","deadline":{d}}}}}"#),
            "unknown request_kind \"shiny\"",
            Some("k1"),
        ),
        bad(r#"{"request_kind":"plain"}"#, "no data", None),
        bad(r#"{"request_kind":"plain","data":null}"#, "no data", None),
        bad(
            r#"{"request_kind":"plain","data":[1]}"#,
            "not a request",
            None,
        ),
        bad(
            &format!(r#"{{"request_kind":"plain","data":{{"deadline":{d}}}}}"#),
            "no id",
            None,
        ),
        bad(
            &format!(r#"{{"request_kind":"plain","data":{{"id":"","deadline":{d}}}}}"#),
            "no id",
            None,
        ),
        bad(
            &format!(r#"{{"request_kind":"plain","data":{{"id":7,"deadline":{d}}}}}"#),
            "expected a string",
            None,
        ),
        bad(
            r#"{"request_kind":"plain","data":{"id":"nd1","payload":{}}}"#,
            "deadline is missing or invalid",
            Some("nd1"),
        ),
        bad(
            r#"{"request_kind":"plain","data":{"id":"nd2","deadline":"tomorrow"}}"#,
            "deadline is missing or invalid",
            Some("nd2"),
        ),
        bad(
            &format!(
                r#"{{"request_kind":"plain","data":{{"id":"p1","deadline":{d},"payload":"summarise this"}}}}"#
            ),
            "payload must be a JSON object",
            Some("p1"),
        ),
        bad(
            &format!(
                r#"{{"request_kind":"plain","data":{{"id":"p2","deadline":{d},"payload":[1,2]}}}}"#
            ),
            "payload must be a JSON object",
            Some("p2"),
        ),
        bad(
            &format!(
                r#"{{"request_kind":"plain","data":{{"id":"m1","deadline":{d},"metadata":{{"n":1}}}}}}"#
            ),
            "not a request",
            Some("m1"),
        ),
        Bad {
            member: not_utf8,
            reason: "not valid JSON",
            // Its id is readable: only the payload holds the bad bytes.
            id: Some("utf"),
        },
        Bad {
            member: oversized,
            reason: "over the 16777216-byte (16 MiB) limit",
            id: Some("big1"),
        },
    ]
}

/// Every malformed kind ends in the dead list with its reason, readable ids get
/// `INVALID_REQUEST`, the good requests around them are all served; then the CLI lists,
/// refuses to requeue what cannot be, requeues what can (as a new generation that is served),
/// and purges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_members_are_dead_lettered_and_the_cli_manages_them() {
    let redis = RedisServer::start().unwrap();
    let gateway = Gateway::start().await;
    let mut con = common::con(&redis).await;
    let producer = common::producer(&redis, QUEUE).await;
    let deadline = unix_ms() / 1000 + 600;
    let cases = malformed(deadline);
    // Good requests before, between (same score) and after the bad ones.
    for i in 0..10 {
        producer
            .submit(common::request(
                &format!("good-{i}"),
                600,
                r#"{"prompt":"hi"}"#,
            ))
            .await
            .unwrap();
    }
    for case in &cases {
        let _: () = con.zadd(QUEUE, &case.member, deadline).await.unwrap();
    }
    for i in 10..20 {
        producer
            .submit(common::request(
                &format!("good-{i}"),
                600,
                r#"{"prompt":"hi"}"#,
            ))
            .await
            .unwrap();
    }
    let invalid_ids: Vec<&str> = cases.iter().filter_map(|c| c.id).collect();
    let processor = Processor::start(&redis, &gateway, &ProcessorOpts::default()).await;
    let results =
        common::wait_results(&mut con, 20 + invalid_ids.len(), Duration::from_secs(60)).await;
    assert_eq!(results.len(), 20 + invalid_ids.len(), "{results:?}");
    for i in 0..20 {
        let id = format!("good-{i}");
        let mine: Vec<_> = results.iter().filter(|r| r.id == id).collect();
        assert_eq!(mine.len(), 1, "{id}: {mine:?}");
        assert_eq!(mine[0].status_code, 200, "{id}: {mine:?}");
    }
    for case in &cases {
        let Some(id) = case.id else { continue };
        let mine: Vec<_> = results.iter().filter(|r| r.id == id).collect();
        assert_eq!(mine.len(), 1, "{id}: {mine:?}");
        assert_eq!(
            mine[0].error_code,
            ErrorCode::InvalidRequest.as_str(),
            "{id}"
        );
        let msg = mine[0].error_message.clone();
        assert!(
            msg.starts_with("Failed: ") && msg.contains(case.reason) && msg.ends_with('.'),
            "{id}: {msg}"
        );
        if id == "nd1" {
            // Go's very words for a request without a usable deadline.
            assert_eq!(
                msg,
                "Failed: deadline is missing or invalid (Unix seconds)."
            );
        }
    }
    // Members without an id get no result: their dead-lettering may land after the last
    // result, so wait for it (at most 10 s).
    let settled = std::time::Instant::now();
    let (pending, raw) = loop {
        let pending: u64 = con.zcard(QUEUE).await.unwrap();
        let raw: Vec<Vec<u8>> = con.lrange(DEAD, 0, -1).await.unwrap();
        if (pending == 0 && raw.len() == cases.len()) || settled.elapsed() > Duration::from_secs(10)
        {
            break (pending, raw);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(pending, 0, "nothing is left pending");

    // The dead list: one record per bad member, each with its reason.
    assert_eq!(raw.len(), cases.len());
    let records: Vec<DeadRecord> = raw
        .iter()
        .map(|r| serde_json::from_slice(r).unwrap())
        .collect();
    for case in &cases {
        let found = records.iter().find(|r| {
            r.member_bytes == case.member.len()
                && (r.exact_member() == Some(&case.member[..])
                    || r.member_truncated
                    || r.member_lossy)
                && r.reason.contains(case.reason)
        });
        let found = found.unwrap_or_else(|| {
            panic!(
                "no dead record with reason {:?} for {:?}; records: {records:#?}",
                case.reason,
                String::from_utf8_lossy(&case.member[..case.member.len().min(120)])
            )
        });
        assert_eq!(found.id, case.id.unwrap_or(""), "{}", found.reason);
    }
    // The oversized member: size and limit in the reason, and only a prefix kept.
    let big = records.iter().find(|r| r.id == "big1").unwrap();
    let big_len = cases.last().unwrap().member.len();
    assert!(
        big.reason.contains(&format!("member is {big_len} bytes")),
        "{}",
        big.reason
    );
    assert!(big.reason.contains(&MAX_MEMBER_BYTES.to_string()));
    assert!(big.member_truncated && big.member.len() <= KEPT_PREFIX_BYTES);
    assert_eq!(big.member_sha1.len(), 40);
    let biggest = raw.iter().map(Vec::len).max().unwrap();
    assert!(
        biggest < 64 * 1024,
        "no record stores the 17 MiB again: {biggest} bytes"
    );
    let lossy = records.iter().find(|r| r.member_lossy).unwrap();
    assert!(lossy.member.contains('\u{FFFD}') && lossy.exact_member().is_none());
    drop(processor);

    // --- the CLI ---------------------------------------------------------------------------
    let out = inferq(&redis, &["dead-letter", "list", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), cases.len());
    assert!(rows
        .iter()
        .all(|r| r["reason"].as_str().is_some_and(|s| !s.is_empty())
            && r["when"].as_str().is_some_and(|s| s.ends_with('Z'))
            && r["deliveries"].is_u64()
            && r["requeueable"] == false));
    let out = inferq(
        &redis,
        &["dead-letter", "list", "--id", "big1", "--limit", "5"],
    );
    let rows: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(
        rows[0].contains(&format!(r#""member_bytes":{big_len}"#)),
        "{}",
        rows[0]
    );
    assert!(rows[0].contains("oversized member"), "{}", rows[0]);

    // A malformed member cannot be requeued: said clearly, exit 2, the record stays.
    let out = inferq(&redis, &["dead-letter", "requeue", "--id", "nd1"]);
    assert_eq!(out.status.code(), Some(2));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(r#""outcome":"refused""#) && stdout.contains("not a valid request"),
        "{stdout}"
    );
    assert!(
        text(&out.stderr).contains("1 record(s) cannot be requeued"),
        "{}",
        text(&out.stderr)
    );
    let n: u64 = con.llen(DEAD).await.unwrap();
    assert_eq!(n as usize, cases.len());

    // A buried request (as bury writes it) is requeued as a new generation and served.
    let old_token = "0123456789abcdef0123456789abcdef";
    let member = valid_member("poisoned-once", old_token, deadline);
    let (mut record, _) = DeadRecord::about(QUEUE, "delivery limit reached", &member, None);
    record.deliveries = 3;
    let _: () = con.lpush(DEAD, record.to_json()).await.unwrap();
    // And one whose id the producer has since re-submitted: requeueing it would make two.
    let member = valid_member("resubmitted", old_token, deadline);
    let (record, _) = DeadRecord::about(QUEUE, "delivery limit reached", &member, None);
    let _: () = con.lpush(DEAD, record.to_json()).await.unwrap();
    let _: () = con
        .set("request-active:resubmitted", "a-newer-token")
        .await
        .unwrap();

    let out = inferq(&redis, &["dead-letter", "requeue", "--id", "poisoned-once"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let line: serde_json::Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
    assert_eq!(line["outcome"], "requeued");
    let new_token = line["request_token"].as_str().unwrap().to_owned();
    assert_ne!(new_token, old_token);
    let active: String = con.get("request-active:poisoned-once").await.unwrap();
    assert_eq!(active, new_token, "cancel reaches the new generation");
    let members: Vec<Vec<u8>> = con.zrange(QUEUE, 0, -1).await.unwrap();
    assert_eq!(members.len(), 1);
    let env = Envelope::decode(&members[0]).unwrap();
    assert_eq!(env.internal.request_token, new_token);
    assert_eq!(
        env.request.payload.get(),
        r#"{"prompt":"again","big":12345678901234567890}"#
    );
    let n: u64 = con.llen(DEAD).await.unwrap();
    assert_eq!(
        n as usize,
        cases.len() + 1,
        "the requeued record left the dead list"
    );

    let out = inferq(&redis, &["dead-letter", "requeue", "--id", "resubmitted"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stdout).contains("newer live generation"),
        "{}",
        text(&out.stdout)
    );

    let _processor = Processor::start(&redis, &gateway, &ProcessorOpts::default()).await;
    let results = common::wait_results(
        &mut con,
        20 + invalid_ids.len() + 1,
        Duration::from_secs(30),
    )
    .await;
    let served: Vec<_> = results.iter().filter(|r| r.id == "poisoned-once").collect();
    assert_eq!(served.len(), 1, "{served:?}");
    assert_eq!(served[0].status_code, 200);
    assert_eq!(gateway.seen("poisoned-once").len(), 1);

    // Bad input exits 2 with a clear message.
    let out = inferq(&redis, &["dead-letter", "requeue", "--id", "no-such-id"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("no dead record with id \"no-such-id\""),
        "{}",
        text(&out.stderr)
    );
    let out = inferq(&redis, &["dead-letter", "purge"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let out = inferq(&redis, &["dead-letter", "purge", "--older-than", "soon"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));

    // Purge: nothing is an hour old; by id; then everything.
    let purged = |out: Output| -> u64 {
        assert!(out.status.success(), "{}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
        v["purged"].as_u64().unwrap()
    };
    assert_eq!(
        purged(inferq(
            &redis,
            &["dead-letter", "purge", "--older-than", "1h"]
        )),
        0
    );
    assert_eq!(
        purged(inferq(&redis, &["dead-letter", "purge", "--id", "big1"])),
        1
    );
    assert_eq!(
        purged(inferq(&redis, &["dead-letter", "purge", "--all"])),
        cases.len() as u64
    );
    let n: u64 = con.llen(DEAD).await.unwrap();
    assert_eq!(n, 0);
}

/// `requeue --all` over a dead list of several pages (the CLI reads 1,000 records at a time
/// while requeueing removes them): every requeueable record goes back to the queue exactly once
/// as a new generation, the ones that cannot be requeued stay and are named, and the exit code
/// says some were refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_all_moves_every_record_once_across_pages() {
    let redis = RedisServer::start().unwrap();
    let mut con = common::con(&redis).await;
    let deadline = unix_ms() / 1000 + 600;
    const GOOD: usize = 2_400;
    let mut records = Vec::with_capacity(GOOD + 3);
    for i in 0..GOOD {
        let member = valid_member(
            &format!("bulk-{i}"),
            "0123456789abcdef0123456789abcdef",
            deadline,
        );
        let (record, _) = DeadRecord::about(QUEUE, "delivery limit reached", &member, None);
        records.push(record.to_json());
        // Three that cannot be requeued, among the others (one in each page).
        if i % 800 == 400 {
            let (record, _) = DeadRecord::about(QUEUE, "not JSON", b"{broken", None);
            records.push(record.to_json());
        }
    }
    for chunk in records.chunks(500) {
        let _: () = con.rpush(DEAD, chunk).await.unwrap();
    }

    let out = inferq(&redis, &["dead-letter", "requeue", "--all"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(&format!("{GOOD} requeued, 3 refused")),
        "{}",
        text(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), GOOD + 3, "one line per record, each read once");
    assert_eq!(
        lines.iter().filter(|l| l["outcome"] == "refused").count(),
        3
    );

    let members: Vec<Vec<u8>> = con.zrange(QUEUE, 0, -1).await.unwrap();
    let mut ids: Vec<String> = members
        .iter()
        .map(|m| Envelope::decode(m).unwrap().request.id)
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), GOOD, "each requeued once");
    assert_eq!(members.len(), GOOD);
    let left: Vec<String> = con.lrange(DEAD, 0, -1).await.unwrap();
    assert_eq!(left.len(), 3, "only the refused stay: {left:?}");
    assert!(left.iter().all(|r| r.contains("not JSON")));
}

fn valid_member(id: &str, token: &str, deadline: i64) -> Vec<u8> {
    let mut req = common::request(id, 600, r#"{"prompt":"again","big":12345678901234567890}"#);
    req.deadline = deadline;
    let routing = Routing {
        request_token: token.to_owned(),
        request_queue_name: QUEUE.to_owned(),
        result_queue_name: "result-list".to_owned(),
        ..Routing::default()
    };
    req.into_envelope(routing).unwrap().encode()
}

/// `requeue --all` stopped by SIGTERM part-way stops between two records and says what it
/// did: every record it reported requeued is in pending, every other one is still in the dead
/// list, and the summary counts them. Before, the signal killed it wherever it was, with no
/// summary, and a record Redis had requeued could go unreported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_all_stopped_by_a_signal_reports_exactly_what_it_moved() {
    use std::io::BufRead;
    let redis = RedisServer::start().unwrap();
    let mut con = common::con(&redis).await;
    let deadline = unix_ms() / 1000 + 600;
    const RECORDS: usize = 20_000;
    let records: Vec<String> = (0..RECORDS)
        .map(|i| {
            let member = valid_member(
                &format!("stop-{i}"),
                "0123456789abcdef0123456789abcdef",
                deadline,
            );
            DeadRecord::about(QUEUE, "delivery limit reached", &member, None)
                .0
                .to_json()
        })
        .collect();
    for chunk in records.chunks(1000) {
        let _: () = con.rpush(DEAD, chunk).await.unwrap();
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_inferq"))
        .args(["dead-letter", "requeue", "--all"])
        .env("REDIS_URL", redis.url())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert!(first.contains("\"requeued\""), "{first}");
    assert!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let reported = 1 + rest.lines().filter(|l| l.contains("\"requeued\"")).count();
    assert!(reported < RECORDS, "the signal came after the end");
    assert!(
        stderr.contains(&format!("{reported} requeued, 0 refused")) && stderr.contains("signal"),
        "{stderr}"
    );
    let pending: usize = con.zcard(QUEUE).await.unwrap();
    let dead: usize = con.llen(DEAD).await.unwrap();
    assert_eq!(
        pending, reported,
        "requeued but not reported, or reported but not requeued"
    );
    assert_eq!(dead, RECORDS - reported);
}
