//! The chaos harness on a Redis Cluster and behind Sentinel, through the built binary:
//! `inferq-dev chaos --redis cluster` (3 masters with a replica each: processors killed and frozen,
//! masters killed -9 and failed over, manual `CLUSTER FAILOVER`s, the queue's slot migrated
//! mid-load) and `inferq-dev chaos --redis sentinel` (processors killed and frozen, the primary
//! killed -9, `SENTINEL FAILOVER`s), each a short run of 600 requests submitted with a replica
//! wait. The tests assert on the JSON report: nothing accepted lost, nothing doubled, nothing
//! stranded, and every fault kind carried out. The seed is random (printed, and named in any
//! failure) unless `INFERQ_CHAOS_SEED` is set.

use std::process::Command;

use serde_json::Value;

fn seed() -> String {
    std::env::var("INFERQ_CHAOS_SEED").unwrap_or_else(|_| rand::random::<u32>().to_string())
}

/// Runs `inferq-dev chaos --profile short --redis <redis>` with a fresh seed; returns the report
/// and the text to show on failure (the replay command, the table, the log).
fn run(redis: &str) -> (Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.json");
    let seed = seed();
    let out = Command::new(env!("CARGO_BIN_EXE_inferq-dev"))
        .args(["chaos", "--profile", "short", "--redis", redis])
        .args(["--seed", &seed, "--report"])
        .arg(&report)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("seed {seed}\n{stdout}");
    let context = format!(
        "seed {seed} (replay: inferq-dev chaos --profile short --redis {redis} --seed {seed})\n\
         {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = std::fs::read(&report)
        .map(|b| serde_json::from_slice(&b).unwrap())
        .unwrap_or(Value::Null);
    assert!(out.status.success(), "{context}");
    assert_eq!(json["seed"].to_string(), seed, "{context}");
    (json, context)
}

/// The checks both deployments share: the run passed, no request accepted with the replica
/// wait was lost, none has two terminal records, no claim or staged finish is left, and each
/// of `kinds` was carried out at least once (and no fault failed).
fn assert_durable(r: &Value, context: &str, kinds: &[&str]) {
    assert_eq!(r["passed"], true, "{context}");
    let h = &r["history"];
    assert_eq!(h["lost"], 0, "{context}");
    assert_eq!(h["duplicate_terminal"], 0, "{context}");
    assert_eq!(h["stranded"], serde_json::json!({}), "{context}");
    assert_eq!(h["stranded_claims"], 0, "{context}");
    assert_eq!(h["stranded_staged"], 0, "{context}");
    assert_eq!(h["strays"], 0, "{context}");
    assert!(h["accepted"].as_u64().unwrap() > 300, "{context}");
    // Every accepted request ended, each exactly once; requests not confirmed by a replica
    // or whose submit failed may have ended too.
    let outcomes: u64 = h["outcomes"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    let n = |k: &str| h[k].as_u64().unwrap();
    assert_eq!(
        outcomes,
        n("accepted") + n("uncertain_with_result") + n("unreplicated_with_result"),
        "{context}"
    );
    let by_kind = r["faults_by_kind"].as_object().unwrap();
    for kind in kinds {
        assert!(
            by_kind.get(*kind).and_then(Value::as_u64).unwrap_or(0) >= 1,
            "{kind} never carried out: {by_kind:?}\n{context}"
        );
    }
    assert!(
        by_kind.keys().all(|k| !k.ends_with("/failed")),
        "{by_kind:?}\n{context}"
    );
    for p in r["processors"].as_array().unwrap() {
        assert_eq!(p["final_stop"], "exit 0 after SIGTERM", "{context}");
    }
}

#[test]
fn a_cluster_run_loses_nothing_replicated_doubles_nothing_strands_nothing() {
    let (r, context) = run("cluster");
    assert_eq!(r["settings"]["redis"], "cluster", "{context}");
    assert_durable(
        &r,
        &context,
        &[
            "kill_processor",
            "pause_processor",
            "kill_master",
            "cluster_failover",
            "migrate_queue_slot",
        ],
    );
    // Both finish paths ran: the one-script finish onto the list beside the queue, and the
    // staged finish onto the list in another slot.
    let lists = &r["results_by_list"];
    assert!(
        lists["{chaos:requests}:results"].as_u64().unwrap() > 100,
        "{context}"
    );
    assert!(lists["chaos:results"].as_u64().unwrap() > 100, "{context}");
}

#[test]
fn a_sentinel_run_loses_nothing_replicated_doubles_nothing_strands_nothing() {
    let (r, context) = run("sentinel");
    assert_eq!(r["settings"]["redis"], "sentinel", "{context}");
    assert_durable(
        &r,
        &context,
        &[
            "kill_processor",
            "pause_processor",
            "kill_primary",
            "sentinel_failover",
        ],
    );
}

#[test]
fn pubsub_is_refused_on_a_cluster() {
    let out = Command::new(env!("CARGO_BIN_EXE_inferq-dev"))
        .args(["chaos", "--redis", "cluster", "--transport", "redis-pubsub"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("only with --redis standalone"), "{err}");
}
