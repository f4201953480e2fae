//! `aimd`'s reactions, each shown on the bands with explicit times: growth, decrease once per
//! flight, holds, `Retry-After`, each dropped reason, and the gate's wait and refusal.

use std::time::{Duration, Instant};

use serde_json::json;

use super::*;
use crate::dispatch::gates::basic::testing::{apply, gate, name};

fn params() -> AimdParams {
    AimdParams {
        min_window: 1.0,
        max_window: 16.0,
        increase: 1.0,
        decrease_factor: 0.5,
        hold: Duration::from_secs(1),
        tier_label: "tier".to_owned(),
    }
}

const OB: usize = 5; // overflow-batch
const RI: usize = 0; // reserved-interactive

/// Sends one request in band `b` at `t` and settles it with `answer` at `t + 10 ms`.
fn round(bands: &mut Bands, b: usize, t: Instant, answer: Answer, ra: Option<Duration>) {
    assert!(bands.admit(b, t), "band {b} had room");
    bands.settle(b, Some((answer, t, ra)), t + Duration::from_millis(10));
}

#[test]
fn slow_start_doubles_per_window_then_grows_by_one_per_window() {
    let mut bands = Bands::new(params());
    let t = Instant::now();
    assert_eq!(bands.bands[OB].window, 1.0);
    round(&mut bands, OB, t, Answer::Accepted, None);
    assert_eq!(bands.bands[OB].window, 2.0);
    for _ in 0..2 {
        round(&mut bands, OB, t, Answer::Accepted, None);
    }
    assert_eq!(
        bands.bands[OB].window, 4.0,
        "one window of answers doubled it"
    );
    // Past ssthresh (set by a decrease), growth is 1/window per answer.
    let later = t + Duration::from_secs(1);
    round(&mut bands, OB, later, Answer::Saturated, None);
    assert_eq!(
        (bands.bands[OB].window, bands.bands[OB].ssthresh),
        (2.0, 2.0)
    );
    round(&mut bands, OB, later, Answer::Accepted, None);
    assert_eq!(bands.bands[OB].window, 2.5);
    // Never above max_window.
    let mut bands = Bands::new(params());
    for _ in 0..100 {
        round(&mut bands, OB, t, Answer::Accepted, None);
    }
    assert_eq!(bands.bands[OB].window, 16.0);
}

#[test]
fn a_flight_is_cut_once() {
    let mut bands = Bands::new(params());
    let t = Instant::now();
    for _ in 0..7 {
        round(&mut bands, OB, t, Answer::Accepted, None);
    }
    assert_eq!(bands.bands[OB].window, 8.0);
    // Four requests of one flight, all sent before the first rejection comes back.
    let sent = t + Duration::from_millis(100);
    for _ in 0..4 {
        assert!(bands.admit(OB, sent));
    }
    let back = sent + Duration::from_millis(50);
    for _ in 0..4 {
        bands.settle(OB, Some((Answer::Saturated, sent, None)), back);
    }
    assert_eq!(bands.bands[OB].window, 4.0, "halved once, not four times");
    assert_eq!(bands.bands[OB].inflight, 0);
    // A request sent after that decrease is a new flight.
    round(
        &mut bands,
        OB,
        back + Duration::from_millis(1),
        Answer::Saturated,
        None,
    );
    assert_eq!(bands.bands[OB].window, 2.0);
}

#[test]
fn a_rejection_cuts_the_bands_below_and_holds_the_bands_above() {
    let mut bands = Bands::new(params());
    let t = Instant::now();
    for b in 0..6 {
        for _ in 0..3 {
            round(&mut bands, b, t, Answer::Accepted, None);
        }
    }
    assert!(bands.bands.iter().all(|b| b.window == 4.0));
    let rejected_at = t + Duration::from_millis(100);
    round(&mut bands, 3, rejected_at, Answer::Saturated, None); // overflow-interactive
    let windows: Vec<f64> = bands.bands.iter().map(|b| b.window).collect();
    assert_eq!(windows, [4.0, 4.0, 4.0, 2.0, 2.0, 2.0]);
    // The bands above are held: an answer sent before the hold does not grow them...
    let now = rejected_at + Duration::from_millis(20);
    assert!(bands.admit(RI, t));
    bands.settle(RI, Some((Answer::Accepted, t, None)), now);
    assert_eq!(bands.bands[RI].window, 4.0, "held");
    // ...until the hold ends,
    round(
        &mut bands,
        RI,
        rejected_at + Duration::from_secs(2),
        Answer::Accepted,
        None,
    );
    assert!(bands.bands[RI].window > 4.0);
    // and an accepted answer in band 3 sent after the hold clears the holds above it.
    let mut bands2 = Bands::new(params());
    round(&mut bands2, 3, t, Answer::Saturated, None);
    assert!(bands2.bands[1].hold.is_some());
    round(
        &mut bands2,
        3,
        t + Duration::from_millis(500),
        Answer::Accepted,
        None,
    );
    assert!(bands2.bands[1].hold.is_none());
}

#[test]
fn retry_after_closes_the_band_and_those_below_then_reopens_in_slow_start() {
    let mut bands = Bands::new(params());
    let t = Instant::now();
    for _ in 0..7 {
        round(&mut bands, 4, t, Answer::Accepted, None);
        round(&mut bands, OB, t, Answer::Accepted, None);
    }
    round(
        &mut bands,
        4,
        t,
        Answer::Saturated,
        Some(Duration::from_secs(2)),
    );
    let now = t + Duration::from_millis(100);
    assert!(!bands.admit(4, now), "closed");
    assert!(!bands.admit(OB, now), "the band below is closed too");
    assert!(bands.admit(3, now), "the band above stays open");
    assert_eq!(bands.bands[4].window, 1.0);
    let reopened = t + Duration::from_secs(3);
    assert!(bands.admit(4, reopened));
    bands.settle(4, Some((Answer::Accepted, reopened, None)), reopened);
    assert_eq!(
        bands.bands[4].window, 2.0,
        "slow start toward the kept ssthresh"
    );
    assert_eq!(bands.bands[4].ssthresh, 4.0);
}

#[test]
fn each_dropped_reason_does_what_go_aimd_says() {
    let t = Instant::now();
    let grown = || {
        let mut bands = Bands::new(params());
        for _ in 0..7 {
            round(&mut bands, OB, t, Answer::Accepted, None);
        }
        bands
    };
    let after = |answer| {
        let mut bands = grown();
        round(&mut bands, OB, t + Duration::from_millis(1), answer, None);
        bands.bands[OB].window
    };
    assert_eq!(after(Answer::Saturated), 4.0);
    assert!((after(Answer::Expired) - 7.2).abs() < 1e-9, "gentle ×0.9");
    assert_eq!(after(Answer::Evicted), 8.0);
    assert_eq!(after(Answer::Other), 8.0);
    assert_eq!(after(Answer::Error), 8.0);
    // A request never sent frees its slot and teaches nothing.
    let mut bands = grown();
    assert!(bands.admit(OB, t));
    bands.settle(OB, None, t);
    assert_eq!((bands.bands[OB].window, bands.bands[OB].inflight), (8.0, 0));
}

#[test]
fn bands_follow_tier_and_classification() {
    assert_eq!(band_of(Some("reserved"), Some("interactive")), 0);
    assert_eq!(band_of(Some("reserved"), Some("async")), 1);
    assert_eq!(band_of(Some("reserved"), None), 2);
    assert_eq!(band_of(None, Some("interactive")), 3);
    assert_eq!(band_of(Some("overflow"), Some("weird")), 5);
}

/// Through the gate: a full overflow band refuses at once, a full reserved band waits for a slot
/// and gets the one a finished request frees.
#[tokio::test]
async fn a_full_band_refuses_overflow_and_makes_reserved_wait() {
    let g = gate("aimd", json!({"max_window": 4})).unwrap();
    let first = apply(g.as_ref(), &[], &[]).await;
    assert_eq!(name(&first.verdict), "continue");
    let second = apply(g.as_ref(), &[], &[]).await;
    assert_eq!(name(&second.verdict), "refuse", "window 1 is full");
    let reserved = [("classification", "reserved")];
    let held = apply(g.as_ref(), &[], &reserved).await;
    assert_eq!(name(&held.verdict), "continue");
    let waiting = {
        let g = g.clone();
        tokio::spawn(async move {
            let d = apply(g.as_ref(), &[], &reserved).await;
            name(&d.verdict)
        })
    };
    tokio::time::sleep(Duration::from_millis(30)).await;
    let fb = Feedback {
        status: Some(200),
        dropped_reason: None,
        retry_after: None,
        sent_at: Instant::now(),
        elapsed: Duration::from_millis(5),
        body: None,
    };
    Decision::settle_all(held.releases, Some(fb)).await;
    assert_eq!(
        waiting.await.unwrap(),
        "continue",
        "the freed slot went to the waiter"
    );
    assert!(gate("aimd", json!({"decrease_factor": 1.5})).is_err());
    assert!(gate("aimd", json!({"min_window": 8, "max_window": 4})).is_err());
}
