//! End-to-end test of `inferq-dev bench --quick`: the built binary starts redis-server, the
//! gateways and `inferq run` processors, runs every phase, and must write a `bench.json` with
//! every figure and a PNG plot. No timing is asserted: the figures only have to be there, be
//! numbers, and show that no request was lost on the way.
//!
//! The cluster section starts a 3-master Redis Cluster (`redis-cli` must be installed too).
//!
//! Needs `redis-server` on `PATH` (or `$INFERQ_REDIS_SERVER`). Uses node and BullMQ when they
//! are installed; the JSON must then hold BullMQ's drains, otherwise say why they were skipped.

use std::process::Command;

use serde_json::Value;

fn number(v: &Value, path: &str) -> f64 {
    let mut at = v;
    for key in path.split('.') {
        at = match key.parse::<usize>() {
            Ok(i) => &at[i],
            Err(_) => &at[key],
        };
    }
    match at.as_f64() {
        Some(n) if n.is_finite() => n,
        _ => panic!("{path} is not a number: {at}"),
    }
}

#[test]
fn quick_bench_writes_every_figure() {
    let out_dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_inferq-dev"))
        .args(["bench", "--quick", "--out"])
        .arg(out_dir.path())
        .output()
        .expect("inferq-dev bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "inferq-dev bench failed ({})\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    for heading in [
        "drains",
        "cluster: ",
        "capacity, cluster, lists tagged",
        "gw conns",
        "open loop",
        "target",
        "redelivery after kill -9",
    ] {
        assert!(
            stdout.contains(heading),
            "no {heading:?} in the table:\n{stdout}"
        );
    }

    let text = std::fs::read_to_string(out_dir.path().join("bench.json")).unwrap();
    let r: Value = serde_json::from_str(&text).unwrap();
    assert!(number(&r, "machine.nproc") >= 1.0);
    assert!(r["machine"]["redis_server"]
        .as_str()
        .unwrap()
        .contains("v="));

    let ceilings = r["gateway_ceilings"].as_array().unwrap();
    assert!(!ceilings.is_empty());
    for i in 0..ceilings.len() {
        assert!(number(&r, &format!("gateway_ceilings.{i}.ceiling.requests_per_s")) > 0.0);
    }

    // Three sizes through every gateway, each drained completely.
    let drains = r["drains"].as_array().unwrap();
    assert_eq!(drains.len(), 3 * ceilings.len(), "{text}");
    for (i, d) in drains.iter().enumerate() {
        for field in [
            "requests_per_s",
            "seconds",
            "ratio_to_gateway_ceiling",
            "commands.per_request",
            "commands.script_calls_per_request",
            "producer_commands_per_submit",
            "cpu_s_per_1k",
            "peak_rss_mib",
        ] {
            assert!(
                number(&r, &format!("drains.{i}.{field}")) > 0.0,
                "{field} of {d}"
            );
        }
        // The gateway counted the connections the processor opened to it: at least one.
        assert!(
            number(&r, &format!("drains.{i}.gateway_connections")) >= 1.0,
            "gateway_connections of {d}"
        );
        // Read from /proc in clock ticks: a tiny drain may cost the gateway none.
        for field in ["redis_cpu_s_per_1k", "gateway_cpu_s_per_1k"] {
            assert!(
                number(&r, &format!("drains.{i}.{field}")) >= 0.0,
                "{field} of {d}"
            );
        }
    }
    assert!(number(&r, "command_census.top_level_per_request") > 0.0);
    assert!(number(&r, "command_census.inside_scripts_per_request") >= 0.0);

    if r["bullmq"]["measured"].as_bool().unwrap() {
        let ratios = r["bullmq"]["ratios"].as_array().unwrap();
        assert_eq!(ratios.len(), 3, "{text}");
        let bull_drains = r["bullmq"]["drains"].as_array().unwrap();
        assert_eq!(bull_drains.len(), 3, "{text}");
        for (i, b) in bull_drains.iter().enumerate() {
            assert!(
                number(&r, &format!("bullmq.drains.{i}.gateway_connections")) >= 1.0,
                "gateway_connections of {b}"
            );
        }
        for i in 0..3 {
            assert!(number(&r, &format!("bullmq.ratios.{i}.inferq_over_bullmq")) > 0.0);
            // What each system's drain cost the machine, per request, and the ratio.
            for field in ["bullmq_cpu_us", "inferq_cpu_us", "bullmq_cpu_over_inferq"] {
                assert!(
                    number(&r, &format!("bullmq.ratios.{i}.{field}")) > 0.0,
                    "{field} of {}",
                    r["bullmq"]["ratios"][i]
                );
            }
        }
    } else {
        assert!(!r["bullmq"]["skipped_because"].as_str().unwrap().is_empty());
    }

    // The split placement drained every size again through the node gateway, on CPUs apart
    // from the gateway's, or says why not (no node, one CPU).
    let split = &r["split"];
    if split.get("measured").and_then(Value::as_bool).unwrap() {
        assert_ne!(split["queue_cpus"], split["gateway_cpus"], "{split}");
        let drains = split["drains"].as_array().unwrap();
        assert_eq!(drains.len(), 3, "{split}");
        for i in 0..3 {
            assert!(number(&r, &format!("split.drains.{i}.requests_per_s")) > 0.0);
        }
        if split["bullmq"]["measured"].as_bool().unwrap() {
            for i in 0..3 {
                assert!(number(&r, &format!("split.bullmq.ratios.{i}.inferq_over_bullmq")) > 0.0);
            }
        }
    } else {
        assert!(!split["skipped_because"].as_str().unwrap().is_empty());
    }

    // The fleet drains: one processor, then four sharing the same workers, each drain with its
    // throughput and the requests the processors lost to one another's claims.
    assert_eq!(r["fleet"]["measured"], Value::Bool(true), "{}", r["fleet"]);
    let fleet = r["fleet"]["drains"].as_array().unwrap();
    let sizes: Vec<u64> = fleet
        .iter()
        .map(|d| d["processors"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [1, 4], "{}", r["fleet"]);
    for (i, d) in fleet.iter().enumerate() {
        assert!(number(&r, &format!("fleet.drains.{i}.requests_per_s")) > 0.0);
        assert!(number(&r, &format!("fleet.drains.{i}.claims_lost_per_request")) >= 0.0);
        assert_eq!(d["concurrency"], r["drains"][0]["concurrency"], "{d}");
    }
    // A lone processor has no one to lose a claim to.
    assert_eq!(number(&r, "fleet.drains.0.claims_lost_per_request"), 0.0);
    assert!(stdout.contains("fleet: "), "{stdout}");

    check_cluster_section(&r);

    // Every open-loop request got its result and was seen by the gateway.
    let open = r["open_loop"].as_array().unwrap();
    assert_eq!(open.len(), 3);
    for (i, o) in open.iter().enumerate() {
        assert_eq!(o["completed"], o["submitted"], "open loop {o}");
        assert_eq!(o["enqueue_to_dispatch"]["samples"], o["submitted"], "{o}");
        for field in [
            "achieved_submit_rps",
            "throughput_rps",
            "enqueue_to_dispatch.p50_ms",
            "enqueue_to_dispatch.p99_ms",
            "enqueue_to_dispatch.max_ms",
            "submit_to_result.p50_ms",
            "submit_to_result.p99_ms",
            "submit_to_result.max_ms",
            "cpu_s_per_1k",
            "peak_rss_mib",
        ] {
            assert!(
                number(&r, &format!("open_loop.{i}.{field}")) > 0.0,
                "{field} of {o}"
            );
        }
    }

    // The killed processor's requests all ran again.
    assert_eq!(r["redelivery"]["redelivered"], r["redelivery"]["requests"]);
    assert!(number(&r, "redelivery.max_s") > 0.0);
    assert!(number(&r, "redelivery.p50_s") > 0.0);

    let targets = r["targets"].as_array().unwrap();
    assert!(targets.len() >= 8, "{text}");
    for t in targets {
        assert!(t["measured"].as_str().is_some_and(|m| !m.is_empty()), "{t}");
    }

    let png = std::fs::read(out_dir.path().join("bench.png")).unwrap();
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "bench.png is not a PNG"
    );
}

/// The cluster section: the standalone reference and both cluster drains drained every request,
/// their costs were read on every master, and a result list in its queue's slot took no command
/// outside that slot (one in another slot did).
fn check_cluster_section(r: &Value) {
    let c = &r["cluster"];
    assert_eq!(c["measured"], Value::Bool(true), "{c}");
    let n = c["n"].as_u64().unwrap();
    assert!(n > 0, "{c}");
    // One queue on each of the 3 masters, each apart list on another master than its queue.
    let queues = c["queues"].as_array().unwrap();
    assert_eq!(queues.len(), 3, "{c}");
    let mut masters: Vec<u64> = queues
        .iter()
        .map(|q| q["master"].as_u64().unwrap())
        .collect();
    masters.sort_unstable();
    masters.dedup();
    assert_eq!(masters.len(), 3, "{c}");
    for q in queues {
        assert_ne!(q["master"], q["apart_list_master"], "{q}");
    }
    let runs = c["runs"].as_array().unwrap();
    let labels: Vec<&str> = runs.iter().map(|x| x["label"].as_str().unwrap()).collect();
    assert_eq!(
        labels,
        [
            "standalone",
            "cluster, lists tagged",
            "cluster, lists apart"
        ],
        "{c}"
    );
    for (i, run) in runs.iter().enumerate() {
        let at = |f: &str| number(r, &format!("cluster.runs.{i}.{f}"));
        assert_eq!(
            run["results"].as_u64(),
            Some(n),
            "every request drained: {run}"
        );
        assert_eq!(run["census"]["requests"], runs[0]["census"]["requests"]);
        assert!(
            at("requests_per_s") > 0.0 && at("requests_per_s_settled") > 0.0,
            "{run}"
        );
        assert!(at("seconds_settled") >= at("seconds"), "{run}");
        let nodes = run["masters"].as_array().unwrap();
        assert_eq!(nodes.len(), if i == 0 { 1 } else { 3 }, "{run}");
        // Every master served its queue: each spent CPU and ran commands.
        for j in 0..nodes.len() {
            assert!(
                at(&format!("masters.{j}.cpu_us_per_request")) > 0.0,
                "{run}"
            );
            assert!(at(&format!("masters.{j}.calls_per_request")) > 0.0, "{run}");
        }
        assert!(at("redis_cpu_us_per_request") > 0.0, "{run}");
        // Commands per request stay a small constant (the standalone run batches everything).
        assert!(
            at("calls_per_request") > 0.0 && at("calls_per_request") <= 12.0,
            "{run}"
        );
        let top = at("census.top_level_per_request");
        assert!(top > 0.0 && top <= 5.0, "{run}");
    }
    let cross = |i: usize, kind: &str| {
        runs[i]["census"]["cross_slot_by_kind"]
            .get(kind)
            .and_then(Value::as_f64)
            .unwrap_or(0.0)
    };
    // One server has no slots.
    assert_eq!(
        number(r, "cluster.runs.0.census.cross_slot_per_request"),
        0.0
    );
    // The result list in its queue's slot: the finish never left the slot.
    assert_eq!(cross(1, "result lists"), 0.0, "{}", runs[1]["census"]);
    // The list in another slot: delivered there, batch by batch.
    assert!(cross(2, "result lists") > 0.0, "{}", runs[2]["census"]);
    assert!(cross(2, "result lists") <= 1.0, "{}", runs[2]["census"]);
    // The projection: k masters each bound by the dearest master's cost per request.
    let projections = c["projections"].as_array().unwrap();
    assert_eq!(projections.len(), 3, "{c}");
    for p in &projections[1..] {
        let us = p["us_per_request_per_master"].as_f64().unwrap();
        assert!(us > 0.0, "{p}");
        let (k, rps) = (&p["requests_per_s"][0][0], &p["requests_per_s"][0][1]);
        assert_eq!(k.as_u64(), Some(3), "{p}");
        assert!((rps.as_f64().unwrap() - 3e6 / us).abs() < 1.0, "{p}");
    }
    // The replica wait's cost, both submits timed.
    let waits = c["replica_wait"]["runs"].as_array().unwrap();
    assert_eq!(waits.len(), 2, "{c}");
    for (i, w) in waits.iter().enumerate() {
        assert_eq!(w["replica_wait"].as_u64(), Some(i as u64), "{w}");
        assert!(w["requests_per_s"].as_f64().unwrap() > 0.0, "{w}");
    }
}
