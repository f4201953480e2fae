//! The open-file limit (`RLIMIT_NOFILE`, `ulimit -n`) against what the processor needs: one
//! descriptor per busy worker's gateway connection, plus Redis, the listeners and their
//! clients. Past the limit nothing fails loudly: gateway connects fail with `EMFILE` and are
//! retried, so the pool runs at a fraction of its workers, and `/readyz` and `/metrics` accept
//! no connection, so probes fail. At start-up the soft limit is raised to the hard one (as the
//! Go runtime does since Go 1.19), and a limit still too small is warned about by name.

pub use inferq_http::fd_limit::{raise, FdLimit};

/// Descriptors the processor uses besides its gateway connections: standard streams, the
/// runtime's epoll and eventfds, Redis and pub/sub connections, listeners, probe and scrape
/// clients, gate connections, with room to spare.
pub const BASE_NEED: u64 = 64;

/// Descriptors needed for `workers` gateway connections at once.
pub fn needed(workers: u64) -> u64 {
    workers.saturating_add(BASE_NEED)
}

/// The warning for a limit below `need` (`None` when it is enough).
pub fn shortfall(limit: &FdLimit, workers: u64) -> Option<String> {
    let soft = limit.soft?;
    let need = needed(workers);
    if soft >= need {
        return None;
    }
    let hard = limit
        .hard
        .map_or_else(|| "unlimited".to_owned(), |h| h.to_string());
    Some(format!(
        "the open-file limit (RLIMIT_NOFILE, ulimit -n) is {soft} (hard limit {hard}), but {workers} workers need about {need}: past it gateway connections fail and are retried, so fewer requests run at once than configured, and the health and metrics ports refuse connections (probes fail). Raise the limit (ulimit -n, LimitNOFILE=, the container runtime's nofile) or lower --concurrency / the pools' workers"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(soft: u64, hard: u64) -> FdLimit {
        FdLimit {
            before: Some(soft),
            soft: Some(soft),
            hard: Some(hard),
        }
    }

    #[test]
    fn a_limit_below_the_workers_need_is_named_with_both_numbers() {
        let warning = shortfall(&limit(1024, 1024), 4096);
        let warning = warning.unwrap_or_default();
        assert!(warning.contains("is 1024 (hard limit 1024)"), "{warning}");
        assert!(
            warning.contains("4096 workers need about 4160"),
            "{warning}"
        );
    }

    #[test]
    fn a_limit_with_room_for_every_worker_says_nothing() {
        assert_eq!(shortfall(&limit(1_048_576, 1_048_576), 4096), None);
        assert_eq!(shortfall(&limit(4160, 4160), 4096), None);
        let unlimited = FdLimit {
            before: None,
            soft: None,
            hard: None,
        };
        assert_eq!(shortfall(&unlimited, 1_000_000), None);
    }
}
