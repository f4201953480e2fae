//! Reading the transport config file again while the processor runs (Go's
//! `--transport-config-watch-interval`, go-newer §5, and SIGHUP): [`spec`] checks the flag at
//! start-up and keeps what a reload compares with; [`ReloadSource::check`] reads the file,
//! says whether it changed, refuses a change of any field other than `queues` (a restart is
//! required for those) and validates the new queues as start-up does (known pools, Prometheus
//! for the gates that need it). The processor (`dispatch::reload`) applies the queues it
//! returns and then calls [`ReloadSource::applied`]; until then the running config stays the
//! one compared with.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use super::json::decode;
use super::pools::PoolConfig;
use super::run::{check_prometheus_gates, check_queue_pools, TransportSource};
use super::transport::{
    resolve_with, QueueConfig, RawSortedSet, TransportKind, RAW_SORTED_SET_OBJECTS,
};
use super::ConfigError;

/// The flag whose errors name it.
const FLAG: &str = "--transport-config-watch-interval";

/// What a reload needs from start-up: the file, how often to read it, what it said then, and
/// what its queues are checked against (the pools and `--prometheus-url` are not reloaded).
#[derive(Debug, Clone)]
pub struct ReloadSpec {
    /// The `--transport-config-file`.
    pub path: PathBuf,
    /// `--transport-config-watch-interval`; `None` when 0 (SIGHUP still reloads).
    pub interval: Option<Duration>,
    /// The config the processor started with, as decoded (absent fields left out).
    started: Value,
    /// The worker pools every queue's `worker_pool_id` must name.
    pools: Vec<PoolConfig>,
    /// Whether `--prometheus-url` is set (the `prometheus-*` gates need it).
    prometheus: bool,
}

/// Checks the watch flag against the transport surface and, when the queues can be reloaded
/// (`redis-sortedset` from `--transport-config-file`), says how. Elsewhere a non-zero interval
/// is refused with the reason: an inline config cannot change, and on `redis-pubsub` a channel
/// dropped at run time would lose what is published on it to no one (Go reloads neither).
pub(crate) fn spec(
    interval: Duration,
    source: &TransportSource,
    kind: TransportKind,
    started: Value,
    pools: &[PoolConfig],
    prometheus: bool,
) -> Result<Option<ReloadSpec>, ConfigError> {
    let path = match (source, kind) {
        (TransportSource::File(path), TransportKind::SortedSet) => path.clone(),
        _ if interval.is_zero() => return Ok(None),
        (_, TransportKind::PubSub) => {
            return Err(ConfigError::invalid(
                FLAG,
                "only with --transport=redis-sortedset: a redis-pubsub channel dropped while \
                 running would lose what is published on it; restart to change its queues",
            ))
        }
        _ => {
            return Err(ConfigError::invalid(
                FLAG,
                "only with --transport=redis-sortedset and --transport-config-file (an inline \
                 --transport-config or the deprecated flags cannot change while running)",
            ))
        }
    };
    Ok(Some(ReloadSpec {
        path,
        interval: (!interval.is_zero()).then_some(interval),
        started,
        pools: pools.to_vec(),
        prometheus,
    }))
}

/// Why a reload was refused; the running config stays as it was.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("cannot read {path:?}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A field other than `queues` changed: only a restart applies it.
    #[error("{field} changed")]
    RestartRequired { field: String },
    /// The new queues are not valid (the same checks as at start-up).
    #[error(transparent)]
    Invalid(#[from] ConfigError),
}

/// The outcome of a read of the file that found no error.
#[derive(Debug)]
pub enum Checked {
    /// The file says what it said at the last read, or what the running config says.
    Unchanged,
    /// New queues, valid: apply them, then call [`ReloadSource::applied`].
    Queues(Candidate),
}

/// Queues read from the file, validated, waiting to be applied.
#[derive(Debug)]
pub struct Candidate {
    /// Every queue of the file, in its order (empty: drain them all).
    pub queues: Vec<QueueConfig>,
    /// Deprecations and ignored settings met while reading it, to log.
    pub warnings: Vec<String>,
    /// The whole config as decoded, which becomes the running one once applied.
    decoded: Value,
}

/// The reload state: the file, the config running now, and what the last read found.
#[derive(Debug)]
pub struct ReloadSource {
    spec: ReloadSpec,
    running: Value,
    /// The text of the last read, so a file left as it was is not checked (nor refused, nor
    /// counted) again at every tick.
    last_read: Option<String>,
}

impl ReloadSource {
    pub fn new(spec: ReloadSpec) -> ReloadSource {
        let running = spec.started.clone();
        ReloadSource {
            spec,
            running,
            last_read: None,
        }
    }

    /// The file.
    pub fn path(&self) -> &std::path::Path {
        &self.spec.path
    }

    /// Reads the file. `force` (SIGHUP) checks it even when its text is the one read last.
    pub fn check(&mut self, force: bool) -> Result<Checked, ReloadError> {
        self.check_with(force, &|key| std::env::var(key).ok())
    }

    /// [`ReloadSource::check`] with `env` for the environment (`REDIS_URL`).
    pub fn check_with(
        &mut self,
        force: bool,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Checked, ReloadError> {
        let text =
            std::fs::read_to_string(&self.spec.path).map_err(|source| ReloadError::Read {
                path: self.spec.path.clone(),
                source,
            })?;
        if !force && self.last_read.as_deref() == Some(text.as_str()) {
            return Ok(Checked::Unchanged);
        }
        self.last_read = Some(text.clone());
        let raw: RawSortedSet = decode(
            &text,
            "",
            "--transport-config-file",
            &RAW_SORTED_SET_OBJECTS,
        )?;
        let decoded = serde_json::to_value(&raw).unwrap_or(Value::Null);
        if decoded == self.running {
            return Ok(Checked::Unchanged);
        }
        if let Some(field) = changed_field(&self.running, &decoded) {
            return Err(ReloadError::RestartRequired { field });
        }
        let mut warnings = Vec::new();
        let (transport, _) = resolve_with(raw, env, &mut warnings, false)?;
        check_queue_pools(&transport.queues, &self.spec.pools)?;
        check_prometheus_gates(&transport.queues, &[], self.spec.prometheus)?;
        Ok(Checked::Queues(Candidate {
            queues: transport.queues,
            warnings,
            decoded,
        }))
    }

    /// The candidate's queues are running now: later reads compare with its config.
    pub fn applied(&mut self, candidate: Candidate) {
        self.running = candidate.decoded;
    }
}

/// The first top-level field other than `queues` whose value differs (an absent field and a
/// `null` one are the same), in name order.
fn changed_field(old: &Value, new: &Value) -> Option<String> {
    let empty = serde_json::Map::new();
    let old = old.as_object().unwrap_or(&empty);
    let new = new.as_object().unwrap_or(&empty);
    let mut names: Vec<&String> = old.keys().chain(new.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter(|name| name.as_str() != "queues")
        .find(|name| {
            old.get(name.as_str()).unwrap_or(&Value::Null)
                != new.get(name.as_str()).unwrap_or(&Value::Null)
        })
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const Q1: &str = r#"{"queue_name":"a","igw_base_url":"http://gw"}"#;
    const Q2: &str = r#"{"queue_name":"b","igw_base_url":"http://gw","worker_pool_id":"p"}"#;

    fn config(extra: &str, queues: &[&str]) -> String {
        format!(
            r#"{{"url":"redis://r:6379"{extra},"queues":[{}]}}"#,
            queues.join(",")
        )
    }

    fn pool(id: &str) -> PoolConfig {
        let json = format!(r#"[{{"id":"{id}","workers":1}}]"#);
        let pools = super::super::pools::parse_pools(&json, &mut Vec::new());
        pools.unwrap_or_default().remove(0)
    }

    /// A source started from `start`, in a file the test rewrites.
    fn source(start: &str) -> (tempfile::NamedTempFile, ReloadSource) {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), start).unwrap();
        let raw: RawSortedSet = decode(start, "", "x", &RAW_SORTED_SET_OBJECTS).unwrap();
        let spec = spec(
            Duration::from_secs(1),
            &TransportSource::File(file.path().into()),
            TransportKind::SortedSet,
            serde_json::to_value(&raw).unwrap(),
            &[pool("default"), pool("p")],
            false,
        )
        .unwrap()
        .unwrap();
        (file, ReloadSource::new(spec))
    }

    fn check(source: &mut ReloadSource, file: &tempfile::NamedTempFile, text: &str) -> String {
        std::fs::write(file.path(), text).unwrap();
        match source.check_with(false, &|_| None) {
            Ok(Checked::Unchanged) => "unchanged".to_owned(),
            Ok(Checked::Queues(c)) => {
                let ids: Vec<String> = c.queues.iter().map(|q| q.id.clone()).collect();
                source.applied(c);
                format!("queues {}", ids.join(","))
            }
            Err(e) => format!("refused: {e}"),
        }
    }

    #[test]
    fn only_the_queues_may_change_and_each_read_is_judged_once() {
        let start = config("", &[Q1]);
        let (file, mut s) = source(&start);
        assert_eq!(check(&mut s, &file, &start), "unchanged");
        // Spaces are no change.
        assert_eq!(
            check(&mut s, &file, &start.replace(',', " , ")),
            "unchanged"
        );
        assert_eq!(check(&mut s, &file, &config("", &[Q1, Q2])), "queues a,b");
        assert_eq!(
            check(&mut s, &file, &config(r#","batch_size":5"#, &[Q1])),
            "refused: batch_size changed"
        );
        // The same refused text is not judged again until it changes.
        assert_eq!(
            check(&mut s, &file, &config(r#","batch_size":5"#, &[Q1])),
            "unchanged"
        );
        assert_eq!(
            check(&mut s, &file, &config("", &[]).replace("6379", "6380")),
            "refused: url changed"
        );
        assert_eq!(check(&mut s, &file, &config("", &[])), "queues ");
        assert_eq!(
            check(
                &mut s,
                &file,
                &config("", &[&Q2.replace("\"p\"", "\"nope\"")])
            ),
            "refused: invalid config: queues[0].worker_pool_id: pool \"nope\" is not defined \
             (defined pools: default, p)"
        );
        assert_eq!(
            check(&mut s, &file, &config("", &[Q1, Q1])),
            "refused: invalid config: queues[1].queue_name: duplicate queue name \"a\" \
             (queues[0] has it too)"
        );
        assert!(check(&mut s, &file, "{").starts_with("refused: invalid config:"));
    }

    #[test]
    fn the_flag_needs_a_sorted_set_transport_from_a_file() {
        let file = TransportSource::File("t.json".into());
        let second = Duration::from_secs(1);
        let refused = |source: &TransportSource, kind| {
            spec(second, source, kind, Value::Null, &[], false)
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert!(refused(&file, TransportKind::PubSub)
            .is_err_and(|e| e.contains("only with --transport=redis-sortedset")));
        for other in [TransportSource::Inline, TransportSource::LegacyFlags] {
            assert!(refused(&other, TransportKind::SortedSet)
                .is_err_and(|e| e.contains("and --transport-config-file")));
        }
        // Off: nothing to refuse, and SIGHUP reloads only a sorted-set config from a file.
        let off = |source: &TransportSource, kind| {
            spec(Duration::ZERO, source, kind, Value::Null, &[], false)
                .map(|s| s.map(|s| s.interval))
                .map_err(|e| e.to_string())
        };
        assert_eq!(off(&file, TransportKind::SortedSet), Ok(Some(None)));
        assert_eq!(off(&file, TransportKind::PubSub), Ok(None));
        assert_eq!(
            off(&TransportSource::Inline, TransportKind::SortedSet),
            Ok(None)
        );
    }
}
