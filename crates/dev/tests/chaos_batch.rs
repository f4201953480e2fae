//! The batch chaos profile end to end, through the built binary: `inferq-dev chaos batch`
//! runs four batches through three Batch API replicas and two processors while replicas and
//! processors are SIGKILLed and Redis restarts, then checks every batch's output and error
//! files. This test asserts on its JSON report: faults happened, no line is missing or doubled,
//! and every batch ended as it should. The seed is random unless `INFERQ_CHAOS_SEED` is set.

use std::process::Command;

use serde_json::Value;

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
    let r: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(r["lines"], 6000, "{context}");
    assert_eq!(r["lines_missing"], 0, "{context}");
    assert_eq!(r["lines_doubled"], 0, "{context}");
    assert_eq!(r["statuses"]["completed"], 3, "{context}");
    assert_eq!(r["statuses"]["cancelled"], 1, "{context}");
    assert!(r["replica_kills"].as_u64() >= Some(3), "{context}");
    assert!(r["processor_kills"].as_u64() >= Some(3), "{context}");
    assert!(r["redis_restarts"].as_u64() >= Some(1), "{context}");
}
