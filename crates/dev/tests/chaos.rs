//! The chaos harness end to end, through the built binary: `inferq-dev chaos --profile short`
//! starts Redis, the simulator and three processors, breaks them for about a minute, checks
//! the whole history and runs 1,000 stale-owner races; this test asserts on its JSON report.
//! The seed is random (printed, and named in any failure) unless `INFERQ_CHAOS_SEED` is set.

use std::process::Command;

use serde_json::Value;

fn chaos(args: &[&str], report: &std::path::Path) -> (std::process::Output, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_inferq-dev"))
        .arg("chaos")
        .args(args)
        .arg("--report")
        .arg(report)
        .output()
        .unwrap();
    let json = std::fs::read(report)
        .map(|b| serde_json::from_slice(&b).unwrap())
        .unwrap_or(Value::Null);
    (out, json)
}

fn seed() -> String {
    std::env::var("INFERQ_CHAOS_SEED").unwrap_or_else(|_| rand::random::<u32>().to_string())
}

#[test]
fn the_short_profile_loses_nothing_duplicates_nothing_strands_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.json");
    let seed = seed();
    let (out, r) = chaos(&["--profile", "short", "--seed", &seed], &path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    let context = format!(
        "seed {seed} (replay: inferq-dev chaos --profile short --seed {seed})\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{context}");
    assert_eq!(r["passed"], true, "{context}");
    assert_eq!(r["seed"].to_string(), seed);

    let h = &r["history"];
    assert_eq!(h["lost"], 0, "{context}");
    assert_eq!(h["duplicate_terminal"], 0, "{context}");
    assert_eq!(h["stranded"], serde_json::json!({}), "{context}");
    assert_eq!(h["strays"], 0, "{context}");
    assert!(h["accepted"].as_u64().unwrap() > 500, "{context}");
    // Every accepted request ended, each exactly once.
    let outcomes: u64 = h["outcomes"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(
        outcomes,
        h["accepted"].as_u64().unwrap() + h["uncertain_with_result"].as_u64().unwrap()
    );

    // Every kind of fault was injected and carried out.
    let faults = r["faults"].as_array().unwrap();
    let kinds: std::collections::BTreeSet<String> = faults
        .iter()
        .map(|f| {
            let kind = f["fault"]["kind"].as_str().unwrap().to_owned();
            match f["fault"]["graceful"].as_bool() {
                Some(true) => format!("{kind}/graceful"),
                Some(false) => format!("{kind}/kill"),
                None => kind,
            }
        })
        .collect();
    assert_eq!(kinds.len(), 9, "{kinds:?}");
    for f in faults {
        assert_eq!(f["outcome"], "ok", "{f}");
    }
    // Killed and frozen processors held requests (about 20 are in flight at any time, and
    // every run kills and freezes at least once each), and survivors ran them again.
    let redelivery = &h["redelivery"];
    assert!(redelivery["orphaned"].as_u64().unwrap() > 0, "{context}");
    assert!(redelivery["re_executed"].as_u64().unwrap() > 0, "{context}");
    for p in r["processors"].as_array().unwrap() {
        assert_eq!(p["final_stop"], "exit 0 after SIGTERM", "{context}");
    }

    let races = &r["races"];
    assert_eq!(races["races"], 1000);
    assert_eq!(races["taken_over"], 1000);
    assert_eq!(races["stale_moves_accepted"], 0);
    assert_eq!(races["results_by_stale_owner"], 0);
    assert_eq!(races["new_owner_published"], 1000);
}

#[test]
fn races_alone_and_a_bad_profile() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("races.json");
    let (out, r) = chaos(&["races", "--count", "200", "--seed", "3"], &path);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(r["passed"], true);
    assert_eq!(r["races"]["races"], 200);
    assert_eq!(r["races"]["results_by_stale_owner"], 0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("stale-owner races"), "{stdout}");

    let (out, _) = chaos(&["--profile", "medium"], &dir.path().join("none.json"));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("medium"));
}

/// The same faults with Go's redis-pubsub producer: requests are PUBLISHed on the queue's
/// channel and the three processors admit them. Every request an instance admitted (its admit
/// marker exists) ends with exactly one result; one no instance admitted (all that received it
/// were cut off or killed first, or Redis was down) may have none, as with Go, but never two;
/// nothing is stranded. No stale-owner races here (the short profile above runs them).
#[test]
fn the_short_profile_over_redis_pubsub_loses_nothing_admitted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.json");
    let seed = seed();
    let args = [
        "--profile",
        "short",
        "--seed",
        &seed,
        "--transport",
        "redis-pubsub",
        "--races",
        "0",
    ];
    let (out, r) = chaos(&args, &path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    let context = format!(
        "seed {seed} (replay: inferq-dev chaos --profile short --transport redis-pubsub --seed \
         {seed})\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{context}");
    assert_eq!(r["passed"], true, "{context}");
    assert_eq!(r["settings"]["transport"], "redis-pubsub", "{context}");
    let h = &r["history"];
    assert_eq!(h["lost"], 0, "{context}");
    assert_eq!(h["duplicate_terminal"], 0, "{context}");
    assert_eq!(h["stranded"], serde_json::json!({}), "{context}");
    // Most requests reach a live instance and are admitted.
    assert!(h["accepted"].as_u64().unwrap() > 500, "{context}");
    let redelivery = &h["redelivery"];
    assert!(redelivery["re_executed"].as_u64().unwrap() > 0, "{context}");
}

/// The batch profile (`inferq-dev chaos batch`): four batches through three Batch API replicas
/// and two processors while replicas and processors are SIGKILLed and Redis restarts; the
/// report must show faults, no line missing or doubled, and every batch ended as it should.
#[test]
fn the_batch_profile_loses_no_line_doubles_none_and_strands_no_batch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.json");
    let seed =
        std::env::var("INFERQ_CHAOS_SEED").unwrap_or_else(|_| rand::random::<u32>().to_string());
    let out = Command::new(env!("CARGO_BIN_EXE_inferq-dev"))
        .args([
            "chaos",
            "batch",
            "--batches",
            "4",
            "--lines",
            "1500",
            "--seconds",
            "20",
            "--seed",
            &seed,
            "--report",
        ])
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    let context = format!(
        "seed {seed} (replay: inferq-dev chaos batch --seed {seed})\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{context}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(r["lines"], 6000, "{context}");
    assert_eq!(r["lines_missing"], 0, "{context}");
    assert_eq!(r["lines_doubled"], 0, "{context}");
    assert_eq!(r["statuses"]["completed"], 3, "{context}");
    assert_eq!(r["statuses"]["cancelled"], 1, "{context}");
    assert!(r["replica_kills"].as_u64() >= Some(3), "{context}");
    assert!(r["processor_kills"].as_u64() >= Some(3), "{context}");
    assert!(r["redis_restarts"].as_u64() >= Some(1), "{context}");
}

/// The front-door profile (`inferq-dev chaos front`): clients send single requests with their
/// own Idempotency-Keys (wait mode, and enqueue plus long polls) through two replicas and two
/// processors while replicas and processors are SIGKILLed and Redis restarts, retrying with
/// their keys; every key must be answered, by one request holding one result.
#[test]
fn the_front_profile_answers_every_key_with_one_request_and_one_result() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.json");
    let seed =
        std::env::var("INFERQ_CHAOS_SEED").unwrap_or_else(|_| rand::random::<u32>().to_string());
    let out = Command::new(env!("CARGO_BIN_EXE_inferq-dev"))
        .args(["chaos", "front", "--clients", "8", "--per-client", "20"])
        .args(["--seconds", "15", "--seed", &seed, "--report"])
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    let context = format!(
        "seed {seed} (replay: inferq-dev chaos front --seed {seed})\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{context}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(r["keys"], 160, "{context}");
    assert_eq!(r["answered"], 160, "{context}");
    for list in ["lost", "split", "mismatched"] {
        assert_eq!(r[list], serde_json::json!([]), "{list}: {context}");
    }
    assert!(r["replica_kills"].as_u64() >= Some(3), "{context}");
    assert!(r["processor_kills"].as_u64() >= Some(3), "{context}");
    assert!(r["redis_restarts"].as_u64() >= Some(1), "{context}");
}
