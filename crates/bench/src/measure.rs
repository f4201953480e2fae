//! Readings a benchmark phase takes before and after: Redis `INFO commandstats` (calls per
//! command, Lua-internal calls included), a process's CPU seconds (utime + stime + cutime + cstime of
//! `/proc/PID/stat`) and peak resident memory (`VmHWM` of `/proc/PID/status`), and the machine
//! (cores, CPU model, memory, redis-server and node versions). In come a Redis connection or a
//! pid; out come plain numbers.

use std::collections::BTreeMap;
use std::process::Command;

use redis::aio::MultiplexedConnection;
use serde::Serialize;

use super::BenchError;

/// Calls per command name (`evalsha`, `zadd`, `config|resetstat`...).
pub(crate) type CommandCounts = BTreeMap<String, u64>;

/// One `INFO commandstats` reading.
pub(crate) async fn commandstats(
    con: &mut MultiplexedConnection,
) -> Result<CommandCounts, BenchError> {
    let text: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await?;
    Ok(parse_commandstats(&text))
}

/// Parses `cmdstat_NAME:calls=N,...` lines.
pub(crate) fn parse_commandstats(text: &str) -> CommandCounts {
    let mut out = CommandCounts::new();
    for line in text.lines() {
        let Some(rest) = line.trim().strip_prefix("cmdstat_") else {
            continue;
        };
        let Some((name, fields)) = rest.split_once(':') else {
            continue;
        };
        let calls = fields
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(calls) = calls {
            out.insert(name.to_owned(), calls);
        }
    }
    out
}

/// `after − before` per command, dropping zeros and the calls the bench itself made
/// (`own`: name → calls to subtract).
pub(crate) fn delta(
    before: &CommandCounts,
    after: &CommandCounts,
    own: &CommandCounts,
) -> CommandCounts {
    let mut out = CommandCounts::new();
    for (name, &calls) in after {
        let base = before.get(name).copied().unwrap_or(0);
        let mine = own.get(name).copied().unwrap_or(0);
        let n = calls.saturating_sub(base).saturating_sub(mine);
        if n > 0 {
            out.insert(name.clone(), n);
        }
    }
    out
}

/// Calls of Lua scripts (`eval`, `evalsha`, `fcall`... each one round trip) in `counts`.
pub(crate) fn script_calls(counts: &CommandCounts) -> u64 {
    counts
        .iter()
        .filter(|(name, _)| {
            matches!(
                name.as_str(),
                "eval" | "evalsha" | "eval_ro" | "evalsha_ro" | "fcall" | "fcall_ro"
            )
        })
        .map(|(_, n)| n)
        .sum()
}

/// A process's CPU time and peak memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub(crate) struct ProcUsage {
    /// User plus system CPU seconds.
    pub cpu_s: f64,
    /// Peak resident set size (`VmHWM`), MiB.
    pub peak_rss_mib: f64,
}

/// CPU seconds spent between two readings, when both could be taken.
pub(crate) fn spent(before: Option<f64>, after: Option<f64>) -> Option<f64> {
    Some(after? - before?)
}

/// Reads `/proc/PID/stat` and `/proc/PID/status`.
pub(crate) fn proc_usage(pid: u32) -> Result<ProcUsage, BenchError> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| BenchError::setup(format!("cannot read /proc/{pid}/stat"), e))?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| BenchError::setup(format!("cannot read /proc/{pid}/status"), e))?;
    let ticks = parse_cpu_ticks(&stat)
        .ok_or_else(|| BenchError::Phase(format!("unreadable /proc/{pid}/stat")))?;
    let hwm_kib = parse_status_kib(&status, "VmHWM")
        .ok_or_else(|| BenchError::Phase(format!("no VmHWM in /proc/{pid}/status")))?;
    Ok(ProcUsage {
        cpu_s: ticks as f64 / clock_ticks_per_second() as f64,
        peak_rss_mib: hwm_kib as f64 / 1024.0,
    })
}

/// utime + stime + cutime + cstime (fields 14 to 17) of a `/proc/PID/stat` line, in clock
/// ticks: a process's own CPU and that of the children it has waited for. For redis-server those
/// children are its AOF rewrites, which a drain triggers (the AOF doubles past 64 MB) and which
/// take a core of their own while they run: leaving them out hid about 6 µs per request.
/// The command name in parentheses may hold spaces, so fields are counted after its closing
/// parenthesis.
pub(crate) fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the name: field 3 (state) is index 0, so utime (14) is index 11, up to cstime (17).
    let mut ticks = 0;
    for index in 11..=14 {
        ticks += fields.get(index)?.parse::<u64>().ok()?;
    }
    Some(ticks)
}

/// A `Key:   N kB` line of `/proc/PID/status` or `/proc/meminfo`, in KiB.
pub(crate) fn parse_status_kib(status: &str, key: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        if k.trim() != key {
            return None;
        }
        v.split_whitespace().next()?.parse().ok()
    })
}

/// `getconf CLK_TCK`, or 100 (Linux's USER_HZ everywhere it runs today).
fn clock_ticks_per_second() -> u64 {
    static TICKS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        command_line(&["getconf", "CLK_TCK"])
            .and_then(|s| s.parse().ok())
            .filter(|&n: &u64| n > 0)
            .unwrap_or(100)
    })
}

/// The first line a command prints, if it runs.
fn command_line(argv: &[&str]) -> Option<String> {
    let (program, args) = argv.split_first()?;
    let out = Command::new(program).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().next().map(|l| l.trim().to_owned())
}

/// What the run ran on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub nproc: usize,
    pub cpu_model: String,
    pub memory_mib: u64,
    pub kernel: String,
    pub redis_server: String,
    /// `None` when node is not installed.
    pub node: Option<String>,
}

impl Machine {
    pub fn read() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == "model name").then(|| v.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".to_owned());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        Machine {
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model,
            memory_mib: parse_status_kib(&meminfo, "MemTotal").unwrap_or(0) / 1024,
            kernel: command_line(&["uname", "-r"]).unwrap_or_else(|| "unknown".to_owned()),
            redis_server: command_line(&["redis-server", "--version"])
                .unwrap_or_else(|| "unknown".to_owned()),
            node: command_line(&["node", "--version"]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_lines_parse_into_calls() {
        let text = "# Commandstats\r\ncmdstat_evalsha:calls=12,usec=5,usec_per_call=0.4,rejected_calls=0,failed_calls=0\r\n\
                    cmdstat_config|resetstat:calls=1,usec=9\r\ncmdstat_zadd:calls=3,usec=1\r\n";
        let c = parse_commandstats(text);
        assert_eq!(c["evalsha"], 12);
        assert_eq!(c["config|resetstat"], 1);
        assert_eq!(c["zadd"], 3);
        let before = CommandCounts::from([("evalsha".to_owned(), 2), ("zadd".to_owned(), 3)]);
        let own = CommandCounts::from([("config|resetstat".to_owned(), 1)]);
        let d = delta(&before, &c, &own);
        assert_eq!(d, CommandCounts::from([("evalsha".to_owned(), 10)]));
        assert_eq!(script_calls(&c), 12);
    }

    #[test]
    fn cpu_ticks_skip_a_command_name_with_spaces() {
        let stat = "4242 (in ferq) S 1 4242 4242 0 -1 4194560 500 0 0 0 150 25 7 3 20 0 9 0";
        assert_eq!(parse_cpu_ticks(stat), Some(185));
        assert_eq!(parse_cpu_ticks("garbage"), None);
    }

    #[test]
    fn this_process_has_cpu_time_and_a_peak_rss() {
        let u = proc_usage(std::process::id()).unwrap();
        assert!(u.peak_rss_mib > 0.0);
        assert!(u.cpu_s >= 0.0);
        assert_eq!(
            parse_status_kib("VmHWM:\t  2048 kB\nVmRSS: 1 kB\n", "VmHWM"),
            Some(2048)
        );
    }
}
