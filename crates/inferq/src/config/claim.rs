//! Claim settings from the transport-config JSON (`claim_lease_ttl_seconds`,
//! `claim_reclaim_interval_ms`, `max_deliveries`) and the Go durable-claims flags
//! (`--claim-lease-ttl`, `--claim-reclaim-interval`). The JSON wins; a flag applies when the JSON
//! leaves its field out (or zero, Go's "unset"); otherwise the defaults of
//! [`ClaimSettings::default`]. Out comes a validated [`ClaimSettings`].

use std::time::Duration;

use inferq_client::ClaimSettings;

use super::ConfigError;

/// The claim fields as written in the transport config.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct ClaimFields {
    pub lease_seconds: Option<f64>,
    pub reclaim_interval_ms: Option<i64>,
    pub max_deliveries: Option<i64>,
    /// `replica_wait` (inferq): replicas a finish waits for.
    pub replica_wait: Option<i64>,
    /// `replica_wait_timeout_ms` (inferq): how long it waits for them.
    pub replica_wait_timeout_ms: Option<i64>,
}

/// How long a replica wait lasts unless `replica_wait_timeout_ms` says otherwise.
pub(crate) const DEFAULT_REPLICA_WAIT_TIMEOUT: Duration = Duration::from_secs(1);

/// The replica wait of `replicas` (none when 0 or absent) with `timeout_ms` (default 1 s);
/// `fields` names them in errors (the transport config's, or `submit`'s flags).
pub(crate) fn resolve_replica_wait(
    replicas: Option<i64>,
    timeout_ms: Option<i64>,
    fields: (&str, &str),
) -> Result<Option<inferq_client::ReplicaWait>, ConfigError> {
    let replicas = match replicas.unwrap_or(0) {
        0 => None,
        n if n < 0 => {
            return Err(ConfigError::invalid(
                fields.0,
                format!("must be 0 or more, got {n}"),
            ))
        }
        n => Some(u32::try_from(n).map_err(|_| {
            ConfigError::invalid(fields.0, format!("must be at most {}, got {n}", u32::MAX))
        })?),
    };
    let timeout = match timeout_ms {
        None | Some(0) => DEFAULT_REPLICA_WAIT_TIMEOUT,
        Some(ms) if !(1..=600_000).contains(&ms) => {
            return Err(ConfigError::invalid(
                fields.1,
                format!("must be 1 to 600000 (10 minutes), got {ms}"),
            ))
        }
        Some(ms) => Duration::from_millis(ms.unsigned_abs()),
    };
    if replicas.is_none() && timeout_ms.is_some_and(|ms| ms != 0) {
        return Err(ConfigError::invalid(
            fields.1,
            format!("only with {} set above 0", fields.0),
        ));
    }
    Ok(replicas.map(|replicas| inferq_client::ReplicaWait { replicas, timeout }))
}

/// The claim flags, already parsed as durations.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct ClaimFlags {
    pub lease: Option<Duration>,
    pub reclaim_interval: Option<Duration>,
}

/// Shortest lease accepted.
const MIN_LEASE: Duration = Duration::from_secs(1);
/// Longest lease accepted: Go's longest duration (about 292 years), as for `--claim-lease-ttl`.
/// Beyond it a claim's deadline cannot be represented and the consumer would crash.
const MAX_LEASE: Duration = Duration::from_nanos(i64::MAX as u64);

/// Combines the JSON fields, the flags and the defaults, and validates the result.
///
/// Checked in this order, the first problem winning: the lease, the reclaim interval (and that
/// it fits in the lease), the delivery limit, the replica wait.
pub(crate) fn resolve_claim(
    json: ClaimFields,
    flags: ClaimFlags,
) -> Result<ClaimSettings, ConfigError> {
    let defaults = ClaimSettings::default();
    let (lease, lease_field) = lease(json.lease_seconds, flags.lease, defaults.lease)?;
    let reclaim = reclaim_interval(json.reclaim_interval_ms, flags.reclaim_interval)?;
    let reclaim_interval = match reclaim {
        Some((interval, field)) if interval > lease => {
            return Err(ConfigError::invalid(
                field,
                format!(
                    "{} is longer than the claim lease ({}, from {lease_field}); expired claims \
                     would wait longer than a lease to be reclaimed",
                    show(interval),
                    show(lease)
                ),
            ))
        }
        Some((interval, _)) => interval,
        // Unset: the default, but never longer than a short lease.
        None => defaults.reclaim_interval.min(lease),
    };
    let max_deliveries = max_deliveries(json.max_deliveries, defaults.max_deliveries)?;

    Ok(ClaimSettings {
        lease,
        reclaim_interval,
        max_deliveries,
        replica_wait: resolve_replica_wait(
            json.replica_wait,
            json.replica_wait_timeout_ms,
            ("replica_wait", "replica_wait_timeout_ms"),
        )?,
    })
}

/// The lease and where it came from (named in the reclaim interval's error): the JSON's
/// `claim_lease_ttl_seconds`, else `--claim-lease-ttl`, else `default`.
fn lease(
    json_seconds: Option<f64>,
    flag: Option<Duration>,
    default: Duration,
) -> Result<(Duration, &'static str), ConfigError> {
    match json_seconds.filter(|&s| s != 0.0) {
        Some(secs) => {
            let field = "claim_lease_ttl_seconds";
            let lease = Duration::try_from_secs_f64(secs)
                .ok()
                .filter(|d| (MIN_LEASE..=MAX_LEASE).contains(d))
                .ok_or_else(|| {
                    let reason = if secs < 1.0 {
                        format!("must be at least 1 second, got {secs}")
                    } else {
                        format!(
                            "must be at most {} seconds (about 292 years), got {secs}",
                            MAX_LEASE.as_secs()
                        )
                    };
                    ConfigError::invalid(field, reason)
                })?;
            Ok((lease, field))
        }
        None => match flag {
            Some(lease) if lease < MIN_LEASE => Err(ConfigError::invalid(
                "--claim-lease-ttl",
                format!("must be at least 1s, got {}", show(lease)),
            )),
            Some(lease) => Ok((lease, "--claim-lease-ttl")),
            None => Ok((default, "the default claim lease")),
        },
    }
}

/// The reclaim interval and the field it came from: the JSON's `claim_reclaim_interval_ms`,
/// else `--claim-reclaim-interval`; `None` when neither is set.
fn reclaim_interval(
    json_ms: Option<i64>,
    flag: Option<Duration>,
) -> Result<Option<(Duration, &'static str)>, ConfigError> {
    match json_ms.filter(|&ms| ms != 0) {
        Some(ms) if ms < 0 => Err(ConfigError::invalid(
            "claim_reclaim_interval_ms",
            format!("must be at least 1, got {ms}"),
        )),
        Some(ms) => Ok(Some((
            Duration::from_millis(ms.unsigned_abs()),
            "claim_reclaim_interval_ms",
        ))),
        None => match flag {
            Some(d) if d.is_zero() => Err(ConfigError::invalid(
                "--claim-reclaim-interval",
                "must be greater than 0",
            )),
            Some(d) => Ok(Some((d, "--claim-reclaim-interval"))),
            None => Ok(None),
        },
    }
}

/// `max_deliveries`: 0 (or absent) for `default`, else at least 1.
fn max_deliveries(json: Option<i64>, default: u32) -> Result<u32, ConfigError> {
    match json.unwrap_or(0) {
        0 => Ok(default),
        n if n < 0 => Err(ConfigError::invalid(
            "max_deliveries",
            format!("must be at least 1, got {n}"),
        )),
        n => u32::try_from(n).map_err(|_| {
            ConfigError::invalid(
                "max_deliveries",
                format!("must be at most {}, got {n}", u32::MAX),
            )
        }),
    }
}

/// A duration the way a user writes one (`1s 500ms`).
fn show(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(lease: Option<f64>, reclaim: Option<i64>, max: Option<i64>) -> ClaimFields {
        ClaimFields {
            lease_seconds: lease,
            reclaim_interval_ms: reclaim,
            max_deliveries: max,
            ..ClaimFields::default()
        }
    }

    #[test]
    fn a_replica_wait_needs_replicas_and_a_sane_timeout() {
        let f = ("replica_wait", "replica_wait_timeout_ms");
        assert_eq!(resolve_replica_wait(None, None, f).unwrap(), None);
        assert_eq!(resolve_replica_wait(Some(0), None, f).unwrap(), None);
        assert_eq!(
            resolve_replica_wait(Some(1), None, f).unwrap(),
            Some(inferq_client::ReplicaWait {
                replicas: 1,
                timeout: DEFAULT_REPLICA_WAIT_TIMEOUT
            })
        );
        assert_eq!(
            resolve_replica_wait(Some(2), Some(250), f)
                .unwrap()
                .map(|w| w.timeout),
            Some(Duration::from_millis(250))
        );
        let e = |r, t| resolve_replica_wait(r, t, f).unwrap_err().to_string();
        assert_eq!(
            e(Some(-1), None),
            "invalid config: replica_wait: must be 0 or more, got -1"
        );
        assert_eq!(
            e(Some(1), Some(-5)),
            "invalid config: replica_wait_timeout_ms: must be 1 to 600000 (10 minutes), got -5"
        );
        assert_eq!(
            e(None, Some(100)),
            "invalid config: replica_wait_timeout_ms: only with replica_wait set above 0"
        );
    }

    fn flags(lease: Option<u64>, reclaim: Option<u64>) -> ClaimFlags {
        ClaimFlags {
            lease: lease.map(Duration::from_millis),
            reclaim_interval: reclaim.map(Duration::from_millis),
        }
    }

    fn err(fields: ClaimFields, f: ClaimFlags) -> String {
        match resolve_claim(fields, f) {
            Ok(c) => format!("ok {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn defaults() {
        let c = resolve_claim(ClaimFields::default(), ClaimFlags::default()).unwrap();
        assert_eq!(c, ClaimSettings::default());
        assert_eq!(c.lease, Duration::from_secs(30));
        assert_eq!(c.reclaim_interval, Duration::from_millis(5000));
        assert_eq!(c.max_deliveries, 5);
        // Zero is Go's "unset".
        let c = resolve_claim(json(Some(0.0), Some(0), Some(0)), ClaimFlags::default()).unwrap();
        assert_eq!(c, ClaimSettings::default());
    }

    #[test]
    fn json_values_and_fractional_leases() {
        let c = resolve_claim(json(Some(1.5), Some(500), Some(3)), ClaimFlags::default()).unwrap();
        assert_eq!(c.lease, Duration::from_millis(1500));
        assert_eq!(c.reclaim_interval, Duration::from_millis(500));
        assert_eq!(c.max_deliveries, 3);
        // A short lease without a reclaim setting: the interval shrinks to the lease.
        let c = resolve_claim(json(Some(2.0), None, None), ClaimFlags::default()).unwrap();
        assert_eq!(c.reclaim_interval, Duration::from_secs(2));
    }

    #[test]
    fn flags_apply_only_when_json_lacks_the_field() {
        let f = flags(Some(60_000), Some(10_000));
        let c = resolve_claim(ClaimFields::default(), f).unwrap();
        assert_eq!(c.lease, Duration::from_secs(60));
        assert_eq!(c.reclaim_interval, Duration::from_secs(10));
        let c = resolve_claim(json(Some(20.0), Some(2000), None), f).unwrap();
        assert_eq!(c.lease, Duration::from_secs(20));
        assert_eq!(c.reclaim_interval, Duration::from_secs(2));
        let c = resolve_claim(json(Some(20.0), None, None), f).unwrap();
        assert_eq!(c.lease, Duration::from_secs(20));
        assert_eq!(c.reclaim_interval, Duration::from_secs(10));
    }

    #[test]
    fn rules_name_their_field() {
        let none = ClaimFlags::default();
        assert_eq!(
            err(json(Some(0.5), None, None), none),
            "invalid config: claim_lease_ttl_seconds: must be at least 1 second, got 0.5"
        );
        assert_eq!(
            err(json(Some(-3.0), None, None), none),
            "invalid config: claim_lease_ttl_seconds: must be at least 1 second, got -3"
        );
        assert_eq!(
            err(ClaimFields::default(), flags(Some(500), None)),
            "invalid config: --claim-lease-ttl: must be at least 1s, got 500ms"
        );
        assert_eq!(
            err(json(Some(2.0), Some(3000), None), none),
            "invalid config: claim_reclaim_interval_ms: 3s is longer than the claim lease (2s, \
             from claim_lease_ttl_seconds); expired claims would wait longer than a lease to be reclaimed"
        );
        assert!(
            err(json(Some(2.0), None, None), flags(None, Some(3000))).starts_with(
                "invalid config: --claim-reclaim-interval: 3s is longer than the claim lease"
            )
        );
        assert_eq!(
            err(json(None, Some(-1), None), none),
            "invalid config: claim_reclaim_interval_ms: must be at least 1, got -1"
        );
        assert_eq!(
            err(ClaimFields::default(), flags(None, Some(0))),
            "invalid config: --claim-reclaim-interval: must be greater than 0"
        );
        assert_eq!(
            err(json(None, None, Some(-2)), none),
            "invalid config: max_deliveries: must be at least 1, got -2"
        );
    }
}
