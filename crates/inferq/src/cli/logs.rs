//! Where the binary's log lines go and how they look. `cli::main` picks a [`LogFormat`] from the
//! command line (for `run`, from Go's zap flags) and calls [`init`] once; every `tracing` event
//! after that is one line on standard error.
//!
//! Text lines are `tracing-subscriber`'s own format. JSON lines are written the way the Go
//! processor's production logger (zap's JSON encoder, as controller-runtime configures it) writes
//! them, so a log pipeline that parses a Go deployment's logs parses inferq's: one object per
//! line, keys `level`, `ts`, `logger`, `caller`, `msg`, then the event's own fields.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// `tracing-subscriber`'s text lines (colour on a terminal).
    Text,
    /// One JSON object per line, as zap's production encoder writes it.
    Json(TimeEncoding),
}

/// Zap's time encodings (`--zap-time-encoding`), for the `ts` key of a JSON line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeEncoding {
    /// Seconds since the Unix epoch, a JSON number with a fraction.
    Epoch,
    /// Milliseconds since the Unix epoch, a JSON number with a fraction.
    Millis,
    /// Nanoseconds since the Unix epoch, a whole JSON number.
    Nanos,
    /// `2026-11-30T02:10:00.123Z`: milliseconds always shown.
    Iso8601,
    /// `2026-11-30T02:10:00Z`: whole seconds (controller-runtime's default).
    Rfc3339,
    /// `2026-11-30T02:10:00.123456789Z`, trailing zeros of the fraction dropped.
    Rfc3339Nano,
}

impl LogFormat {
    /// The format Go's zap flags ask for: JSON when `--zap-encoder=json`, or when development
    /// mode is off (`--zap-devel=false`) and no encoder is named; text otherwise (Go's default,
    /// development mode, writes zap's console lines). The values were checked when parsed.
    pub fn from_zap_flags(devel: Option<bool>, encoder: Option<&str>, time: Option<&str>) -> Self {
        let json = match encoder.map(str::to_ascii_lowercase).as_deref() {
            Some("json") => true,
            Some(_) => false,
            None => devel == Some(false),
        };
        if !json {
            return LogFormat::Text;
        }
        let time = match time.map(str::to_ascii_lowercase).as_deref() {
            Some("epoch") => TimeEncoding::Epoch,
            Some("millis") => TimeEncoding::Millis,
            Some("nanos") => TimeEncoding::Nanos,
            Some("iso8601") => TimeEncoding::Iso8601,
            Some("rfc3339nano") => TimeEncoding::Rfc3339Nano,
            _ => TimeEncoding::Rfc3339,
        };
        LogFormat::Json(time)
    }
}

/// Installs the process's log subscriber: events at `default_level` and above (`RUST_LOG`
/// overrides), written to standard error in `format`. A second call changes nothing.
pub fn init(default_level: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    // A log line that cannot be written (standard error closed: the reader of a pipe went away)
    // is dropped. The subscriber would report it with eprintln!, whose panic would kill the
    // task that logged, such as the one waiting for SIGTERM.
    let builder = tracing_subscriber::fmt()
        .log_internal_errors(false)
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        LogFormat::Json(time) => builder
            .with_ansi(false)
            .event_format(ZapJson { time })
            .try_init(),
    };
}

/// Writes the error that ends the process as a log line of `format` (`inferq: …` for text).
pub fn fatal(format: LogFormat, error: &str) {
    match format {
        LogFormat::Text => tell!("inferq: {error}"),
        LogFormat::Json(time) => {
            let line =
                ZapJson { time }.line(&Level::ERROR, "inferq", None, error, &[], SystemTime::now());
            tell!("{line}");
        }
    }
}

/// The JSON line writer: zap's production encoder keys and level names.
struct ZapJson {
    time: TimeEncoding,
}

impl ZapJson {
    /// One line (without its newline) for an event.
    fn line(
        &self,
        level: &Level,
        logger: &str,
        caller: Option<String>,
        msg: &str,
        fields: &[(&'static str, Value)],
        at: SystemTime,
    ) -> String {
        let mut out = String::with_capacity(128 + msg.len());
        out.push('{');
        push_pair(&mut out, "level", &Value::from(level_name(level)));
        out.push(',');
        push_pair(&mut out, "ts", &self.ts(at));
        out.push(',');
        push_pair(&mut out, "logger", &Value::from(logger));
        if let Some(caller) = caller {
            out.push(',');
            push_pair(&mut out, "caller", &Value::from(caller));
        }
        out.push(',');
        push_pair(&mut out, "msg", &Value::from(msg));
        for (key, value) in fields {
            out.push(',');
            push_pair(&mut out, key, value);
        }
        out.push('}');
        out
    }

    /// The `ts` value for an instant, in this writer's encoding (UTC for the text ones).
    fn ts(&self, at: SystemTime) -> Value {
        let since = at.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
        match self.time {
            TimeEncoding::Epoch => Value::from(since.as_secs_f64()),
            TimeEncoding::Millis => Value::from(since.as_nanos() as f64 / 1e6),
            TimeEncoding::Nanos => Value::from(u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)),
            TimeEncoding::Iso8601 => Value::from(humantime::format_rfc3339_millis(at).to_string()),
            TimeEncoding::Rfc3339 => Value::from(humantime::format_rfc3339_seconds(at).to_string()),
            TimeEncoding::Rfc3339Nano => {
                let text = humantime::format_rfc3339_nanos(at).to_string();
                // Go's RFC3339Nano drops the fraction's trailing zeros (and a bare dot).
                let body = text.trim_end_matches('Z').trim_end_matches('0');
                Value::from(format!("{}Z", body.trim_end_matches('.')))
            }
        }
    }
}

impl<S, N> FormatEvent<S, N> for ZapJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let caller = match (meta.file(), meta.line()) {
            (Some(file), Some(line)) => Some(format!("{}:{line}", short_file(file))),
            _ => None,
        };
        let line = self.line(
            meta.level(),
            meta.target(),
            caller,
            &fields.msg,
            &fields.rest,
            SystemTime::now(),
        );
        writeln!(writer, "{line}")
    }
}

/// Zap's lowercase level names; zap has no trace level, so trace events read as debug.
fn level_name(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "error",
        Level::WARN => "warn",
        Level::INFO => "info",
        Level::DEBUG | Level::TRACE => "debug",
    }
}

/// A source path as zap's short caller shows it: relative to the crate's `src/`.
fn short_file(file: &str) -> &str {
    // `crates/<crate>/src/cli/logs.rs` (a workspace build) or `src/cli/logs.rs`: what follows
    // the crate's `src/`.
    match file.rfind("/src/") {
        Some(i) => &file[i + "/src/".len()..],
        None => file.strip_prefix("src/").unwrap_or(file),
    }
}

/// `"key":value` onto a line.
fn push_pair(out: &mut String, key: &str, value: &Value) {
    out.push_str(&Value::from(key).to_string());
    out.push(':');
    out.push_str(&value.to_string());
}

/// An event's message and its other fields, in the order they were recorded.
#[derive(Default)]
struct Fields {
    msg: String,
    rest: Vec<(&'static str, Value)>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: Value) {
        if field.name() == "message" {
            self.msg = match value {
                Value::String(text) => text,
                other => other.to_string(),
            };
        } else {
            self.rest.push((field.name(), value));
        }
    }
}

impl Visit for Fields {
    fn record_f64(&mut self, field: &Field, value: f64) {
        // JSON has no NaN or infinity: those are written as text, as zap writes them.
        let value = serde_json::Number::from_f64(value)
            .map(Value::Number)
            .unwrap_or_else(|| Value::from(value.to_string()));
        self.put(field, value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::from(value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::from(value));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::from(value.to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, Value::from(format!("{value:?}")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64, nanos: u32) -> SystemTime {
        UNIX_EPOCH + Duration::new(secs, nanos)
    }

    #[test]
    fn the_zap_flags_choose_the_format_as_go_does() {
        assert_eq!(LogFormat::from_zap_flags(None, None, None), LogFormat::Text);
        assert_eq!(
            LogFormat::from_zap_flags(Some(true), None, Some("epoch")),
            LogFormat::Text
        );
        assert_eq!(
            LogFormat::from_zap_flags(Some(false), None, None),
            LogFormat::Json(TimeEncoding::Rfc3339)
        );
        assert_eq!(
            LogFormat::from_zap_flags(Some(false), Some("console"), None),
            LogFormat::Text
        );
        assert_eq!(
            LogFormat::from_zap_flags(None, Some("JSON"), Some("Millis")),
            LogFormat::Json(TimeEncoding::Millis)
        );
    }

    #[test]
    fn every_time_encoding_writes_zaps_form() {
        let t = at(1_764_468_600, 120_000_000);
        let ts = |time| ZapJson { time }.ts(t);
        assert_eq!(ts(TimeEncoding::Epoch), serde_json::json!(1_764_468_600.12));
        assert_eq!(
            ts(TimeEncoding::Millis),
            serde_json::json!(1_764_468_600_120.0)
        );
        assert_eq!(
            ts(TimeEncoding::Nanos),
            serde_json::json!(1_764_468_600_120_000_000u64)
        );
        assert_eq!(ts(TimeEncoding::Iso8601), "2025-11-30T02:10:00.120Z");
        assert_eq!(ts(TimeEncoding::Rfc3339), "2025-11-30T02:10:00Z");
        assert_eq!(ts(TimeEncoding::Rfc3339Nano), "2025-11-30T02:10:00.12Z");
        let whole = ZapJson {
            time: TimeEncoding::Rfc3339Nano,
        }
        .ts(at(1_764_468_600, 0));
        assert_eq!(whole, "2025-11-30T02:10:00Z");
    }

    #[test]
    fn a_line_is_one_json_object_with_zaps_keys_first() {
        let line = ZapJson {
            time: TimeEncoding::Epoch,
        }
        .line(
            &Level::WARN,
            "inferq::dispatch",
            Some("dispatch/consumer.rs:12".to_owned()),
            "gateway said \"no\"\nthen closed",
            &[("queue", Value::from("q1")), ("attempt", Value::from(3))],
            at(10, 500_000_000),
        );
        assert!(!line.contains('\n'), "one line: {line}");
        assert_eq!(
            line,
            r#"{"level":"warn","ts":10.5,"logger":"inferq::dispatch","caller":"dispatch/consumer.rs:12","msg":"gateway said \"no\"\nthen closed","queue":"q1","attempt":3}"#
        );
    }

    #[test]
    fn tracing_events_become_json_lines() {
        use std::io::Write;
        use std::sync::{Arc, Mutex};

        #[derive(Clone, Default)]
        struct Sink(Arc<Mutex<Vec<u8>>>);
        impl Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                if let Ok(mut bytes) = self.0.lock() {
                    bytes.extend_from_slice(buf);
                }
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_max_level(Level::DEBUG)
            .event_format(ZapJson {
                time: TimeEncoding::Rfc3339,
            })
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let err = std::io::Error::other("connection refused");
            tracing::error!(queue = "q1", error = %err, retry_in_ms = 250u64, "redis is down");
            tracing::debug!(ratio = f64::NAN, ok = true, "gate read");
        });
        let text = String::from_utf8(sink.0.lock().map(|b| b.clone()).unwrap_or_default())
            .unwrap_or_default();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0]["level"], "error");
        assert_eq!(lines[0]["msg"], "redis is down");
        assert_eq!(lines[0]["queue"], "q1");
        assert_eq!(lines[0]["error"], "connection refused");
        assert_eq!(lines[0]["retry_in_ms"], 250);
        assert!(lines[0]["logger"]
            .as_str()
            .is_some_and(|l| l.starts_with("inferq")));
        assert!(lines[0]["caller"]
            .as_str()
            .is_some_and(|c| c.starts_with("cli/logs.rs:")));
        assert!(lines[0]["ts"].as_str().is_some_and(|t| t.ends_with('Z')));
        assert_eq!(lines[1]["level"], "debug");
        assert_eq!(lines[1]["ratio"], "NaN");
        assert_eq!(lines[1]["ok"], true);
    }
}
