//! The history checker: given everything a chaos run observed — what was submitted (the
//! [`Ledger`]), the whole result list and dead list read at the end (LRANGE, not consumed),
//! the sizes of every queue key, the gateway's execution times, and which requests each
//! killed or frozen processor held — it decides whether the durability contract held.
//!
//! It is a pure function ([`check`]) of that data, so it is tested here on hand-made
//! histories. A run fails on: a lost generation (accepted, no terminal record), a duplicate
//! terminal record (two for one generation, accepted or not), anything stranded in a queue key,
//! a result for an id nobody submitted, or a dead letter without its terminal record. Duplicate
//! *executions* at the gateway are allowed (execution is at least once) and reported.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::workload::{Fate, Ledger};
use inferq::queue::dead::DeadRecord;
use inferq_client::wire::ResultMessage;

/// Requests a processor held when it was killed or frozen.
#[derive(Debug, Clone, Serialize)]
pub struct Orphans {
    /// Index of the fault in the fault log.
    pub fault: usize,
    pub processor: usize,
    /// When the signal was sent (Unix ms).
    pub at_ms: i64,
    pub ids: Vec<String>,
}

/// What the run observed.
#[derive(Debug, Default)]
pub struct History {
    pub ledger: Ledger,
    /// The raw result list, in any order.
    pub results: Vec<Vec<u8>>,
    /// The raw dead list.
    pub dead: Vec<Vec<u8>>,
    /// Every queue key and its size (ZCARD / HLEN).
    pub keys: BTreeMap<String, u64>,
    /// The dead list's key (its size is reported, not a failure).
    pub dead_key: String,
    /// The claims hash and the staged-finish hash, whose leftovers are reported apart.
    pub claimed_key: String,
    pub staged_key: String,
    /// Gateway execution times per id (Unix ms).
    pub executions: HashMap<String, Vec<u64>>,
    pub orphans: Vec<Orphans>,
}

/// How long one orphaned request waited for its next execution.
#[derive(Debug, Clone, Serialize)]
pub struct Redelivery {
    pub id: String,
    pub fault: usize,
    pub ms: u64,
}

/// Redelivery times after processor kills and freezes.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Redeliveries {
    /// Requests held by a killed or frozen processor.
    pub orphaned: usize,
    /// Of those, executed again afterwards.
    pub re_executed: usize,
    /// Of those, never executed again (finished by the late owner's last writes, or by the
    /// deadline): not a failure, their terminal record is checked like any other.
    pub not_re_executed: usize,
    pub p50_ms: Option<u64>,
    pub p99_ms: Option<u64>,
    pub slowest: Option<Redelivery>,
}

/// The verdict on one history.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Findings {
    pub submitted: usize,
    pub accepted: usize,
    /// Submits that failed: their fate is unknown.
    pub uncertain: usize,
    pub uncertain_with_result: usize,
    /// Queued on the primary, but no replica confirmed them within the replica wait: a
    /// fail-over may lose them, so losing one is no failure.
    pub unreplicated: usize,
    pub unreplicated_with_result: usize,
    pub unreplicated_lost: usize,
    /// Cancellations the producer made that found the generation active (each must still end
    /// with one terminal record: `CANCELLED`, or the result if it was already done).
    pub cancelled: u64,
    /// Accepted with no terminal record (up to 20 ids listed).
    pub lost: usize,
    pub lost_ids: Vec<String>,
    /// Generations with more than one terminal record, and how many each.
    pub duplicate_terminal: usize,
    pub duplicate_ids: BTreeMap<String, usize>,
    /// Results for ids this run never submitted, or that do not parse.
    pub strays: usize,
    /// Non-empty queue keys and their sizes.
    pub stranded: BTreeMap<String, u64>,
    /// Of those, claims nobody finished (entries of the claims hash).
    pub stranded_claims: u64,
    /// Of those, staged cross-slot finishes nobody delivered (entries of the staged hash).
    pub stranded_staged: u64,
    pub dead_letters: usize,
    /// Dead letters of ours without a terminal record.
    pub dead_without_result: usize,
    /// Dead letters by reason (the first 120 characters of each record's `reason`).
    pub dead_reasons: BTreeMap<String, usize>,
    /// Terminal records by kind (`HTTP 200`, `DEADLINE_EXCEEDED`, ...).
    pub outcomes: BTreeMap<String, usize>,
    /// Gateway executions of this run's ids.
    pub executions: u64,
    /// Ids executed more than once, and the extra executions.
    pub ids_executed_more_than_once: usize,
    pub duplicate_executions: u64,
    pub max_executions_of_one_id: u64,
    pub redelivery: Redeliveries,
}

impl Findings {
    /// Why the run fails; empty when it passes.
    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.lost > 0 {
            out.push(format!(
                "{} accepted generations have no terminal record: {:?}",
                self.lost, self.lost_ids
            ));
        }
        if self.duplicate_terminal > 0 {
            out.push(format!(
                "{} generations have more than one terminal record: {:?}",
                self.duplicate_terminal, self.duplicate_ids
            ));
        }
        if !self.stranded.is_empty() {
            out.push(format!("stranded in queue keys: {:?}", self.stranded));
        }
        if self.strays > 0 {
            out.push(format!(
                "{} results for ids never submitted or that do not parse",
                self.strays
            ));
        }
        if self.dead_without_result > 0 {
            out.push(format!(
                "{} dead letters have no terminal record",
                self.dead_without_result
            ));
        }
        out
    }
}

fn kind(r: &ResultMessage) -> String {
    if r.status_code != 0 {
        format!("HTTP {}", r.status_code)
    } else if !r.error_code.is_empty() {
        r.error_code.clone()
    } else {
        "unknown".to_owned()
    }
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

/// Checks a whole history.
pub fn check(h: &History) -> Findings {
    let mut f = Findings {
        submitted: h.ledger.ids.len(),
        accepted: h.ledger.accepted(),
        uncertain: h.ledger.uncertain(),
        unreplicated: h.ledger.unreplicated(),
        cancelled: h.ledger.cancelled,
        ..Findings::default()
    };

    let mut records: HashMap<&str, usize> = HashMap::new();
    let parsed: Vec<Option<ResultMessage>> = h
        .results
        .iter()
        .map(|raw| serde_json::from_slice::<ResultMessage>(raw).ok())
        .collect();
    for r in &parsed {
        match r {
            Some(r) if h.ledger.ids.contains_key(&r.id) => {
                *records.entry(r.id.as_str()).or_default() += 1;
                *f.outcomes.entry(kind(r)).or_default() += 1;
            }
            _ => f.strays += 1,
        }
    }
    for (id, (_, fate)) in &h.ledger.ids {
        let n = records.get(id.as_str()).copied().unwrap_or(0);
        if n > 1 {
            f.duplicate_terminal += 1;
            f.duplicate_ids.insert(id.clone(), n);
        }
        match fate {
            Fate::Accepted if n == 0 => {
                f.lost += 1;
                if f.lost_ids.len() < 20 {
                    f.lost_ids.push(id.clone());
                }
            }
            Fate::Uncertain(_) if n > 0 => f.uncertain_with_result += 1,
            Fate::Unreplicated(_) if n > 0 => f.unreplicated_with_result += 1,
            Fate::Unreplicated(_) => f.unreplicated_lost += 1,
            _ => {}
        }
    }

    for (key, n) in &h.keys {
        if *n > 0 && *key != h.dead_key {
            f.stranded.insert(key.clone(), *n);
            if *key == h.claimed_key {
                f.stranded_claims = *n;
            }
            if *key == h.staged_key {
                f.stranded_staged = *n;
            }
        }
    }
    for raw in &h.dead {
        f.dead_letters += 1;
        if let Ok(rec) = serde_json::from_slice::<DeadRecord>(raw) {
            let reason: String = rec.reason.chars().take(120).collect();
            *f.dead_reasons.entry(reason).or_default() += 1;
            if h.ledger.ids.contains_key(&rec.id) && !records.contains_key(rec.id.as_str()) {
                f.dead_without_result += 1;
            }
        }
    }

    for (id, times) in &h.executions {
        if !h.ledger.ids.contains_key(id) {
            continue;
        }
        let n = times.len() as u64;
        f.executions += n;
        if n > 1 {
            f.ids_executed_more_than_once += 1;
            f.duplicate_executions += n - 1;
        }
        f.max_executions_of_one_id = f.max_executions_of_one_id.max(n);
    }

    f.redelivery = redeliveries(h);
    f
}

fn redeliveries(h: &History) -> Redeliveries {
    let mut out = Redeliveries::default();
    let mut waits: Vec<Redelivery> = Vec::new();
    for o in &h.orphans {
        let at = u64::try_from(o.at_ms).unwrap_or(0);
        for id in &o.ids {
            out.orphaned += 1;
            let next = h
                .executions
                .get(id)
                .and_then(|times| times.iter().copied().find(|&t| t > at));
            match next {
                Some(t) => waits.push(Redelivery {
                    id: id.clone(),
                    fault: o.fault,
                    ms: t - at,
                }),
                None => out.not_re_executed += 1,
            }
        }
    }
    out.re_executed = waits.len();
    let mut ms: Vec<u64> = waits.iter().map(|w| w.ms).collect();
    ms.sort_unstable();
    out.p50_ms = percentile(&ms, 0.5);
    out.p99_ms = percentile(&ms, 0.99);
    out.slowest = waits.into_iter().max_by_key(|w| w.ms);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreplicated_request_may_be_lost_but_not_doubled_and_leftovers_are_named() {
        let mut h = history(&["a"], &[], &["a", "r1", "r2", "r2"]);
        for id in ["r1", "r2", "r3"] {
            h.ledger
                .ids
                .insert(id.into(), (1_000, Fate::Unreplicated("wait".into())));
        }
        h.claimed_key = "q:claimed".into();
        h.staged_key = "q:finishing".into();
        h.keys.insert("q:claimed".into(), 2);
        h.keys.insert("q:finishing".into(), 1);
        let f = check(&h);
        assert_eq!((f.accepted, f.uncertain, f.unreplicated), (1, 0, 3));
        assert_eq!((f.unreplicated_with_result, f.unreplicated_lost), (2, 1));
        assert_eq!((f.lost, f.duplicate_ids.len()), (0, 1));
        assert_eq!((f.stranded_claims, f.stranded_staged), (2, 1));
        assert_eq!(f.failures().len(), 2, "{:?}", f.failures());
    }

    fn ledger(accepted: &[&str], uncertain: &[&str]) -> Ledger {
        let mut l = Ledger::default();
        for id in accepted {
            l.ids.insert((*id).to_owned(), (1_000, Fate::Accepted));
        }
        for id in uncertain {
            l.ids
                .insert((*id).to_owned(), (1_000, Fate::Uncertain("cut".into())));
        }
        l
    }

    fn ok(id: &str) -> Vec<u8> {
        ResultMessage::http(id, 200, b"{}").to_json().into_bytes()
    }

    fn history(accepted: &[&str], uncertain: &[&str], results: &[&str]) -> History {
        History {
            ledger: ledger(accepted, uncertain),
            results: results.iter().map(|id| ok(id)).collect(),
            dead_key: "q:dead".into(),
            keys: [("q".to_owned(), 0), ("q:dead".to_owned(), 3)].into(),
            ..History::default()
        }
    }

    #[test]
    fn a_clean_history_passes_and_dead_list_size_is_not_stranding() {
        let f = check(&history(&["a", "b"], &[], &["a", "b"]));
        assert!(f.failures().is_empty(), "{:?}", f.failures());
        assert_eq!((f.accepted, f.outcomes["HTTP 200"]), (2, 2));
    }

    #[test]
    fn loss_duplicates_strays_and_stranding_fail() {
        let mut h = history(&["a", "b", "c"], &[], &["a", "a", "c", "zzz"]);
        h.results.push(b"not json".to_vec());
        h.keys.insert("q:claimed".into(), 1);
        let f = check(&h);
        assert_eq!(f.lost_ids, ["b"]);
        assert_eq!(f.duplicate_ids, [("a".to_owned(), 2)].into());
        assert_eq!(f.strays, 2);
        assert_eq!(f.stranded, [("q:claimed".to_owned(), 1)].into());
        assert_eq!(f.failures().len(), 4);
    }

    #[test]
    fn an_uncertain_submit_may_have_zero_or_one_record_but_not_two() {
        let f = check(&history(&[], &["u1", "u2"], &["u1"]));
        assert!(f.failures().is_empty());
        assert_eq!((f.uncertain, f.uncertain_with_result), (2, 1));
        let f = check(&history(&[], &["u1"], &["u1", "u1"]));
        assert_eq!(f.duplicate_terminal, 1);
    }

    #[test]
    fn a_dead_letter_needs_its_terminal_record() {
        let mut h = history(&["a", "b"], &[], &["a", "b"]);
        let rec = |id: &str| {
            let mut r = DeadRecord::new("q", "max deliveries", b"{}");
            r.id = id.into();
            serde_json::to_vec(&r).unwrap()
        };
        h.dead = vec![rec("a")];
        assert!(check(&h).failures().is_empty());
        h.results.pop();
        h.dead.push(rec("b"));
        let f = check(&h);
        assert_eq!((f.dead_letters, f.dead_without_result, f.lost), (2, 1, 1));
    }

    #[test]
    fn executions_and_redeliveries_are_counted() {
        let mut h = history(&["a", "b", "c"], &[], &["a", "b", "c"]);
        h.executions = [
            ("a".to_owned(), vec![900, 1_000, 4_000]),
            ("b".to_owned(), vec![950, 2_500]),
            ("c".to_owned(), vec![990]),
            ("other".to_owned(), vec![1, 2]),
        ]
        .into();
        h.orphans = vec![Orphans {
            fault: 3,
            processor: 1,
            at_ms: 1_000,
            ids: vec!["a".into(), "b".into(), "c".into()],
        }];
        let f = check(&h);
        assert_eq!(f.executions, 6);
        assert_eq!(
            (f.ids_executed_more_than_once, f.duplicate_executions),
            (2, 3)
        );
        assert_eq!(f.max_executions_of_one_id, 3);
        let r = &f.redelivery;
        assert_eq!((r.orphaned, r.re_executed, r.not_re_executed), (3, 2, 1));
        let slowest = r.slowest.as_ref().unwrap();
        assert_eq!(
            (slowest.id.as_str(), slowest.ms, slowest.fault),
            ("a", 3_000, 3)
        );
        assert_eq!(r.p50_ms, Some(1_500));
    }
}
