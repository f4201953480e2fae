//! `slack`'s reactions, on the controller with explicit times (growth, the learnt capacity,
//! shrinking and preempting on a standing queue, the delay signal, rejections, `Retry-After`, a
//! stale signal), and through the gate against a real metrics page.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::super::Answer;
use super::control::{FELL_STREAK, STANDING_STREAK};
use super::*;

fn settings() -> Settings {
    Settings {
        min_window: 1.0,
        max_window: 64.0,
        signal_target: 0.0,
        interval: Duration::from_millis(250),
        headroom: 2.0,
        memory: Duration::from_secs(10),
        latency_tolerance: 1.8,
        increase: 1.0,
        decrease_factor: 0.7,
        preempt: true,
    }
}

const P: Duration = Duration::from_millis(250);

fn fill(c: &mut Controller, now: Instant) -> Vec<u64> {
    let mut seqs = Vec::new();
    while let Some((seq, _)) = c.admit(now) {
        seqs.push(seq);
    }
    seqs
}

fn reading(waiting: f64, running: f64) -> Option<Reading> {
    Some(Reading::pooled(waiting, Some(running)))
}

/// With a signal: the window probes up while no queue stands, learns the pool's capacity from
/// the first queue, and then keeps room for the others plus headroom.
#[test]
fn the_queue_signal_learns_the_capacity_and_leaves_room_for_the_others() {
    let t = Instant::now();
    let mut c = Controller::new(settings(), t);
    let mut now = t;
    // Probing: the pool (capacity 32) runs 4 others and ours; no queue yet.
    for _ in 0..40 {
        fill(&mut c, now);
        let running = (4.0 + c.inflight() as f64).min(32.0);
        let waiting = (4.0 + c.inflight() as f64 - 32.0).max(0.0);
        now += P;
        c.tick(reading(waiting, running), now);
        if c.capacity.is_some() {
            break;
        }
    }
    assert_eq!(c.capacity, Some(32.0), "learnt when the queue formed");
    // Room: 32 − 4 − 2·√4 − 1 = 23.
    now += P;
    let ours = c.inflight() as f64;
    c.tick(
        reading((4.0 + ours - 32.0).max(0.0), (4.0 + ours).min(32.0)),
        now,
    );
    assert!((c.window - 23.0).abs() < 1e-9, "window {}", c.window);
    assert_eq!(c.steer, Steer::Queue);
}

/// A burst of others: the window shrinks at once (not by a step a period), and the youngest
/// requests over the window are preempted — as many as the queue is long.
#[test]
fn a_standing_queue_shrinks_at_once_and_preempts_the_youngest() {
    let t = Instant::now();
    let mut c = Controller::new(settings(), t);
    c.window = 28.0;
    let mut tokens = Vec::new();
    while let Some((_, tok)) = c.admit(t) {
        tokens.push(tok);
    }
    assert_eq!(tokens.len(), 28);
    // The pool of 32 runs our 28 and 4 others; 2 more others arrive and wait. Before the
    // capacity is known, a queue may be a flicker (a request waits for the next step even in a
    // pool with room): the window holds.
    for i in 1..FELL_STREAK {
        assert!(c.tick(reading(2.0, 32.0), t + i * P).is_empty());
        assert_eq!((c.capacity, c.window), (None, 28.0));
    }
    // The queue stands: the capacity is what the pool runs.
    let preempted = c.tick(reading(2.0, 32.0), t + FELL_STREAK * P);
    assert_eq!(c.capacity, Some(32.0));
    // Others 32 + 2 − 28 = 6: room 32 − 6 − 2·√6 − 1 ≈ 20.1, taken at once.
    assert!(c.window < 21.0 && c.window > 20.0, "window {}", c.window);
    assert_eq!(preempted.len(), 2, "as many as wait");
    for p in &preempted {
        p.cancel();
    }
    assert!(
        tokens[27].is_cancelled() && tokens[26].is_cancelled(),
        "the youngest two"
    );
    assert!(!tokens[25].is_cancelled());
    // Two engines, the queue on one of them: twice as many are taken back (ours are spread
    // over both, and only a slot freed on the queued one serves it).
    let mut c2 = Controller::new(settings(), t);
    c2.window = 28.0;
    fill(&mut c2, t);
    let split = Some(Reading {
        series: 2,
        queued_series: 1,
        ..Reading::pooled(2.0, Some(32.0))
    });
    for i in 1..FELL_STREAK {
        c2.tick(split, t + i * P);
    }
    assert_eq!(c2.tick(split, t + FELL_STREAK * P).len(), 4);
    // With preemption off, none is taken back.
    let mut c3 = Controller::new(
        Settings {
            preempt: false,
            ..settings()
        },
        t,
    );
    c3.window = 28.0;
    fill(&mut c3, t);
    for i in 1..FELL_STREAK {
        c3.tick(reading(2.0, 32.0), t + i * P);
    }
    assert!(c3.tick(reading(2.0, 32.0), t + FELL_STREAK * P).is_empty());
}

/// The learnt capacity does not ratchet down: a queue seen up to three times while the pool
/// runs less than the capacity (a slot being refilled, or the window's headroom kept free for
/// longer than the peak is remembered) leaves it where it is; a queue that stands for
/// `FELL_STREAK` readings below it means the pool shrank, and then it follows.
#[test]
fn a_short_queue_below_the_capacity_keeps_it_and_a_long_one_lowers_it() {
    let t = Instant::now();
    let mut c = Controller::new(settings(), t);
    c.window = 20.0;
    fill(&mut c, t);
    let mut now = t;
    // The pool of 32 runs full with a queue: the capacity is 32.
    for _ in 0..FELL_STREAK {
        now += P;
        c.tick(reading(2.0, 32.0), now);
    }
    assert_eq!(c.capacity, Some(32.0));
    // For longer than the peak is remembered the pool runs 27 (the headroom), with queues
    // seen three times in a row now and then (requests waiting for a step): never below 32
    // (such a queue sets back only what a probe added).
    for _ in 0..40 {
        for waiting in [1.0, 1.0, 1.0, 0.0] {
            now += P;
            c.tick(reading(waiting, 27.0), now);
            assert!(
                c.capacity.is_some_and(|cap| (32.0..=33.0).contains(&cap)),
                "a flicker is no news of the capacity: {:?}",
                c.capacity
            );
        }
    }
    // A pod leaves: 16 run and a queue stands. After FELL_STREAK readings the capacity is 16.
    for i in 1..=FELL_STREAK {
        now += P;
        c.tick(reading(4.0, 16.0), now);
        if i < FELL_STREAK {
            assert_eq!(c.capacity, Some(32.0), "reading {i}");
        }
    }
    assert_eq!(c.capacity, Some(16.0));
    // A long quiet spell with the window in use probes upward, the first probe after
    // `memory` (the pool ran its capacity), the next ones twice as far apart each (it no
    // longer does): after 50 s, probes at 10, 20 and 40 s.
    for _ in 0..200 {
        fill(&mut c, now);
        now += P;
        c.tick(reading(0.0, 16.0), now);
    }
    assert_eq!(c.capacity, Some(19.0));
    // A queue that stands below it sets back what probing added: to the capacity last seen
    // with a queue.
    for _ in 0..STANDING_STREAK {
        now += P;
        c.tick(reading(1.0, 16.0), now);
    }
    assert_eq!(c.capacity, Some(16.0), "back to the confirmed capacity");
    // More than it was ever seen to run raises it at once.
    now += P;
    c.tick(reading(0.0, 18.0), now);
    assert_eq!(c.capacity, Some(18.0));
}

/// The first capacity is not learnt from a queue seen a few times: while the window opens,
/// the requests just sent wait for a step. The window holds while a queue is seen, and a queue
/// that stands `FELL_STREAK` readings gives the capacity.
#[test]
fn the_first_capacity_waits_for_a_queue_that_stands() {
    let t = Instant::now();
    let mut c = Controller::new(settings(), t);
    let mut now = t;
    for _ in 0..20 {
        fill(&mut c, now);
        now += P;
        c.tick(reading(0.0, c.inflight() as f64), now);
    }
    let opened = c.window;
    for waiting in [1.0, 2.0, 1.0, 0.0, 2.0, 1.0, 1.0, 2.0, 1.0, 0.0] {
        fill(&mut c, now);
        now += P;
        c.tick(reading(waiting, 20.0), now);
    }
    assert_eq!(c.capacity, None, "flickers, not a standing queue");
    assert!(c.window > opened, "it grew between them");
    let held = c.window;
    for i in 1..=FELL_STREAK {
        now += P;
        c.tick(reading(3.0, 22.0), now);
        if i < FELL_STREAK {
            assert_eq!((c.capacity, c.window), (None, held), "reading {i}");
        }
    }
    assert_eq!(c.capacity, Some(22.0));
}

/// Without a running count on the page: Vegas on the queue alone — growth while none stands,
/// a cut once it has stood for two periods.
#[test]
fn a_queue_alone_steers_like_vegas() {
    let t = Instant::now();
    let mut c = Controller::new(settings(), t);
    let only_waiting = |w| Some(Reading::pooled(w, None));
    fill(&mut c, t);
    c.tick(only_waiting(0.0), t + P);
    assert_eq!(c.window, 2.0);
    c.window = 10.0;
    fill(&mut c, t);
    c.tick(only_waiting(3.0), t + 2 * P);
    assert_eq!(c.window, 10.0, "one reading is not a standing queue");
    c.tick(only_waiting(3.0), t + 3 * P);
    assert!((c.window - 7.0).abs() < 1e-9);
}

/// Without a signal: the first answer sets the baseline, growth follows answers, and a latency
/// per token past the tolerance cuts the window once per flight.
#[test]
fn delay_grows_on_answers_and_cuts_past_the_tolerance_once_per_flight() {
    let t = Instant::now();
    let mut c = Controller::new(settings(), t);
    let (seq, _) = c.admit(t).unwrap();
    c.tick(None, t + P);
    assert_eq!(c.window, 1.0, "no answer yet: no growth");
    c.settle(seq, Some((Answer::Accepted, t, None, 0.012)), t + 2 * P);
    c.tick(None, t + 2 * P);
    assert_eq!((c.window, c.baseline()), (2.0, Some(0.012)));
    assert_eq!(c.steer, Steer::Delay);
    // Latency at 1.5× the baseline: under 0.9 × 1.8, still growing.
    let mut now = t + 3 * P;
    for _ in 0..4 {
        for seq in fill(&mut c, now) {
            c.settle(seq, Some((Answer::Accepted, now, None, 0.018)), now);
        }
        now += P;
        c.tick(None, now);
    }
    assert_eq!(c.window, 6.0);
    // 2.5× the baseline: one cut, then none until requests sent after it answer.
    let sent = now;
    let seqs = fill(&mut c, sent);
    assert_eq!(seqs.len(), 6);
    for seq in &seqs[..4] {
        c.settle(*seq, Some((Answer::Accepted, sent, None, 0.030)), now + P);
    }
    c.tick(None, now + P);
    assert!((c.window - 4.2).abs() < 1e-9, "cut ×0.7: {}", c.window);
    for seq in &seqs[4..] {
        c.settle(
            *seq,
            Some((Answer::Accepted, sent, None, 0.030)),
            now + 2 * P,
        );
    }
    c.tick(None, now + 2 * P);
    assert!(
        (c.window - 4.2).abs() < 1e-9,
        "the same flight is not cut twice"
    );
}

/// Rejections, as `aimd` reads them: a capacity rejection cuts once per flight, `Retry-After`
/// closes the gate until then, expiry cuts gently, the rest change nothing.
#[test]
fn rejections_cut_and_retry_after_closes() {
    let t = Instant::now();
    let grown = || {
        let mut c = Controller::new(settings(), t);
        c.window = 10.0;
        c
    };
    let after = |answer, ra| {
        let mut c = grown();
        let (seq, _) = c.admit(t).unwrap();
        c.settle(seq, Some((answer, t, ra, 0.01)), t + P);
        c
    };
    assert!((after(Answer::Saturated, None).window - 7.0).abs() < 1e-9);
    assert!((after(Answer::Expired, None).window - 9.0).abs() < 1e-9);
    for quiet in [Answer::Other, Answer::Error] {
        assert_eq!(after(quiet, None).window, 10.0, "{quiet:?}");
    }
    let mut closed = after(Answer::Saturated, Some(Duration::from_secs(2)));
    assert_eq!(closed.window, 1.0);
    assert!(closed.admit(t + Duration::from_secs(1)).is_none(), "closed");
    assert!(
        closed.admit(t + Duration::from_secs(3)).is_some(),
        "reopened"
    );
    // Two rejections of one flight cut once.
    let mut c = grown();
    let a = c.admit(t).unwrap().0;
    let b = c.admit(t).unwrap().0;
    c.settle(a, Some((Answer::Saturated, t, None, 0.0)), t + P);
    c.settle(b, Some((Answer::Saturated, t, None, 0.0)), t + P);
    assert!((c.window - 7.0).abs() < 1e-9);
}

/// An eviction by the router takes one off the window per evicted request, at once, and the
/// window holds for `memory` whatever the signal says; then it grows again.
#[test]
fn evictions_shrink_the_window_by_their_number_and_hold_it_for_memory() {
    let t = Instant::now();
    let mut c = Controller::new(settings(), t);
    let only_waiting = |w| Some(Reading::pooled(w, None));
    c.window = 10.0;
    let seqs = fill(&mut c, t);
    for seq in &seqs[..3] {
        c.settle(*seq, Some((Answer::Evicted, t, None, 0.0)), t + P);
    }
    assert!((c.window - 7.0).abs() < 1e-9, "window {}", c.window);
    assert_eq!(c.evictions, 3);
    // No queue and a full window: it would grow, but holds for `memory` (10 s).
    fill(&mut c, t + P);
    for i in 2..40 {
        c.tick(only_waiting(0.0), t + i * P);
        fill(&mut c, t + i * P);
    }
    assert!((c.window - 7.0).abs() < 1e-9, "held at {}", c.window);
    c.tick(only_waiting(0.0), t + P + Duration::from_secs(10));
    assert!(
        (c.window - 8.0).abs() < 1e-9,
        "grows after memory: {}",
        c.window
    );
    // Evicted at the smallest window: it stays at min_window.
    let mut small = Controller::new(settings(), t);
    let (seq, _) = small.admit(t).unwrap();
    small.settle(seq, Some((Answer::Evicted, t, None, 0.0)), t);
    assert_eq!(small.window, 1.0);
}

/// A signal that stops answering goes stale after three periods: the controller then steers by
/// delay, and back by the queue when a reading comes again.
#[test]
fn a_stale_signal_falls_back_to_delay() {
    let t = Instant::now();
    let mut c = Controller::new(settings(), t);
    c.tick(reading(0.0, 4.0), t + P);
    assert_eq!(c.steer, Steer::Queue);
    c.tick(None, t + 2 * P);
    assert_eq!(c.steer, Steer::Queue, "one missed read is not stale");
    c.tick(None, t + 5 * P);
    assert_eq!(c.steer, Steer::Delay);
    c.tick(reading(0.0, 4.0), t + 6 * P);
    assert_eq!(c.steer, Steer::Queue);
}

/// Through the gate: with only `max_window` set it builds and admits; its window and signal
/// series exist from start-up; a signal_url that does not answer is reported as unavailable.
#[tokio::test]
async fn the_gate_reports_a_signal_it_cannot_read() {
    use crate::dispatch::gates::{GateEnv, GateOwner};
    use crate::ops::{Metrics, QueueLabels};
    let metrics = Arc::new(Metrics::new());
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let env = GateEnv {
        owner: Some(GateOwner {
            metrics: metrics.clone(),
            labels: QueueLabels {
                queue_id: String::new(),
                queue_name: String::new(),
                pool_name: "batch".into(),
            },
        }),
        pool_workers: Some(8),
        ..GateEnv::default()
    };
    let spec = crate::config::GateSpec {
        kind: crate::config::GateType::Slack,
        params:
            json!({"signal_url": format!("http://127.0.0.1:{port}/metrics"), "interval": "20ms"})
                .as_object()
                .cloned()
                .unwrap(),
    };
    let gate = crate::dispatch::gates::build(&spec, &env).unwrap();
    let page = metrics.encode().unwrap();
    assert!(
        page.contains(r#"inferq_slack_window{pool_name="batch"} 1"#),
        "{page}"
    );
    assert!(page.contains(r#"inferq_slack_signal_available{pool_name="batch"} 0"#));
    let metadata = Default::default();
    let labels = Default::default();
    let d = gate
        .apply(crate::dispatch::gates::GateInput {
            metadata: &metadata,
            labels: &labels,
        })
        .await
        .unwrap();
    assert!(matches!(d.verdict, Verdict::Continue) && d.preempt.is_some());
    tokio::time::sleep(Duration::from_millis(150)).await;
    let page = metrics.encode().unwrap();
    assert!(
        page.contains(r#"inferq_slack_signal_available{pool_name="batch"} 0"#),
        "{page}"
    );
    assert!(
        page.contains(r#"inferq_slack_inflight{pool_name="batch"} 1"#),
        "{page}"
    );
    // Parameters are checked, each error naming its parameter.
    let bad = |params: serde_json::Value| {
        let spec = crate::config::GateSpec {
            kind: crate::config::GateType::Slack,
            params: params.as_object().cloned().unwrap(),
        };
        match crate::dispatch::gates::build(&spec, &env) {
            Ok(_) => String::from("(built)"),
            Err(e) => e.to_string(),
        }
    };
    assert!(bad(json!({"signal_url": "ftp://x"})).contains("parameter signal_url"));
    assert!(bad(json!({"latency_tolerance": 0.5})).contains("parameter latency_tolerance"));
    assert!(bad(json!({"preempt": "maybe"})).contains("parameter preempt"));
    assert!(
        bad(json!({"min_window": 9})).contains("parameter min_window"),
        "above the 8 workers"
    );
}

/// Through the gate against a real page: a standing queue read from signal_url shrinks the
/// window and preempts the request over it.
#[tokio::test]
async fn the_gate_reads_a_real_page_and_preempts() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let waiting = Arc::new(AtomicU64::new(0));
    let served = waiting.clone();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let w = served.load(Ordering::SeqCst);
            async move {
                format!(
                    "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{pod=\"a\"}} {w}\n\
                     # TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{pod=\"a\"}} 4\n"
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.ok() });
    let spec = crate::config::GateSpec {
        kind: crate::config::GateType::Slack,
        params: json!({"signal_url": format!("http://{addr}/metrics"), "interval": "20ms", "headroom": 0, "max_window": 8})
            .as_object()
            .cloned()
            .unwrap(),
    };
    let gate =
        crate::dispatch::gates::build(&spec, &crate::dispatch::gates::GateEnv::default()).unwrap();
    let metadata = Default::default();
    let labels = Default::default();
    let input = crate::dispatch::gates::GateInput {
        metadata: &metadata,
        labels: &labels,
    };
    let mut held = Vec::new();
    // The page shows no queue: the window grows as requests fill it.
    let deadline = Instant::now() + Duration::from_secs(3);
    while held.len() < 3 && Instant::now() < deadline {
        let d = gate.apply(input).await.unwrap();
        if matches!(d.verdict, Verdict::Continue) {
            held.push(d);
        }
    }
    assert_eq!(held.len(), 3, "grew to three");
    // Now 4 run (ours among them: 3) and 2 wait: the capacity is 4, others 4 + 2 − 3 = 3,
    // room 4 − 3 − 1 = 0 → the window falls to 1 and the youngest of ours are taken back.
    waiting.store(2, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let taken: Vec<bool> = held
        .iter()
        .map(|d| d.preempt.as_ref().is_some_and(|p| p.is_cancelled()))
        .collect();
    assert_eq!(
        taken,
        [false, true, true],
        "the two youngest, as many as wait"
    );
}
