//! The standard process metrics every Prometheus client library exports (and Go's
//! controller-runtime registry serves beside the processor's own), so a dashboard panel on
//! `process_resident_memory_bytes` or `rate(process_cpu_seconds_total[5m])` written for the Go
//! processor shows inferq too. Read from `/proc/self` on each scrape; on a system without
//! `/proc` (not Linux) nothing is written.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Clock ticks per second in `/proc/<pid>/stat` (`USER_HZ`, 100 on every Linux architecture).
const TICKS_PER_SECOND: f64 = 100.0;

/// The collector; register it once per registry.
#[derive(Debug, Default)]
pub struct ProcessCollector;

/// One reading of the process.
#[derive(Debug, Default, PartialEq)]
struct Reading {
    cpu_seconds: Option<f64>,
    start_time_seconds: Option<f64>,
    resident_bytes: Option<f64>,
    virtual_bytes: Option<f64>,
    open_fds: Option<f64>,
    max_fds: Option<f64>,
    max_virtual_bytes: Option<f64>,
}

impl Reading {
    fn now() -> Reading {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let stat = read("/proc/self/stat");
        let mut reading = Reading::default();
        if let Some(stat) = stat.as_deref() {
            let (cpu, started_ticks) = cpu_and_start(stat);
            reading.cpu_seconds = cpu;
            let boot = read("/proc/stat").and_then(|s| boot_time(&s));
            reading.start_time_seconds = boot
                .zip(started_ticks)
                .map(|(boot, ticks)| boot + ticks / TICKS_PER_SECOND);
        }
        if let Some(status) = read("/proc/self/status") {
            reading.resident_bytes = status_kib(&status, "VmRSS:").map(|k| k * 1024.0);
            reading.virtual_bytes = status_kib(&status, "VmSize:").map(|k| k * 1024.0);
        }
        if let Some(limits) = read("/proc/self/limits") {
            reading.max_fds = soft_limit(&limits, "Max open files");
            reading.max_virtual_bytes = soft_limit(&limits, "Max address space");
        }
        reading.open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|dir| dir.count() as f64);
        reading
    }
}

/// User plus system CPU seconds and the start time in ticks since boot, from
/// `/proc/self/stat` (fields 14, 15 and 22; the command name in field 2 may hold spaces).
fn cpu_and_start(stat: &str) -> (Option<f64>, Option<f64>) {
    let Some(after_name) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return (None, None);
    };
    // after_name starts at field 3.
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<f64>().ok());
    let cpu = field(14)
        .zip(field(15))
        .map(|(user, system)| (user + system) / TICKS_PER_SECOND);
    (cpu, field(22))
}

/// `btime` of `/proc/stat`: the boot time in Unix seconds.
fn boot_time(stat: &str) -> Option<f64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// A `kB` value of `/proc/self/status`.
fn status_kib(status: &str, key: &str) -> Option<f64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// A soft limit of `/proc/self/limits`; `unlimited` is Go's client's -1.
fn soft_limit(limits: &str, name: &str) -> Option<f64> {
    let rest = limits.lines().find_map(|l| l.strip_prefix(name))?;
    match rest.split_whitespace().next()? {
        "unlimited" => Some(-1.0),
        n => n.parse().ok(),
    }
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: Option<f64>,
) -> Result<(), std::fmt::Error> {
    if let Some(value) = value {
        let metric = ConstGauge::new(value);
        metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)?;
    }
    Ok(())
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let r = Reading::now();
        if let Some(cpu) = r.cpu_seconds {
            let metric = ConstCounter::new(cpu);
            metric.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                None,
                metric.metric_type(),
            )?)?;
        }
        let e = &mut encoder;
        gauge(
            e,
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            r.start_time_seconds,
        )?;
        gauge(
            e,
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            r.resident_bytes,
        )?;
        gauge(
            e,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            r.virtual_bytes,
        )?;
        gauge(
            e,
            "process_virtual_memory_max_bytes",
            "Maximum amount of virtual memory available in bytes.",
            r.max_virtual_bytes,
        )?;
        gauge(
            e,
            "process_open_fds",
            "Number of open file descriptors.",
            r.open_fds,
        )?;
        gauge(
            e,
            "process_max_fds",
            "Maximum number of open file descriptors.",
            r.max_fds,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_found_past_a_command_name_with_spaces() {
        // Fields: pid (comm) state ppid ... utime=14 stime=15 ... starttime=22.
        let stat = "42 (my (odd) cmd) S 1 2 3 4 5 6 7 8 9 10 250 150 0 0 20 0 4 0 12345 999 77";
        assert_eq!(cpu_and_start(stat), (Some(4.0), Some(12345.0)));
        assert_eq!(cpu_and_start("garbage"), (None, None));
    }

    #[test]
    fn limits_and_status_values_are_read() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            20000                40000                files\n\
                      Max address space         unlimited            unlimited            bytes\n";
        assert_eq!(soft_limit(limits, "Max open files"), Some(20000.0));
        assert_eq!(soft_limit(limits, "Max address space"), Some(-1.0));
        assert_eq!(
            status_kib("Name:\tx\nVmRSS:\t  2048 kB\n", "VmRSS:"),
            Some(2048.0)
        );
        assert_eq!(
            boot_time("cpu 1 2\nbtime 1700000000\n"),
            Some(1_700_000_000.0)
        );
    }

    #[test]
    fn this_process_reads_as_itself() {
        let r = Reading::now();
        if !std::path::Path::new("/proc/self/stat").exists() {
            return;
        }
        assert!(r.resident_bytes.is_some_and(|b| b > 1e6), "{r:?}");
        assert!(r.open_fds.is_some_and(|n| n >= 3.0), "{r:?}");
        assert!(r.cpu_seconds.is_some(), "{r:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let started = r.start_time_seconds.unwrap_or(0.0);
        assert!(
            (0.0..3600.0).contains(&(now - started)),
            "started at {started}: {r:?}"
        );
    }
}
