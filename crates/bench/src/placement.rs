//! Where the processes of a drain run. Everywhere else in the bench they share every CPU (the
//! shared placement): on a 2-core machine the stand-in gateway's CPU then counts against the
//! queue system under test, which a real inference fleet, on machines of its own, never does.
//! The split placement gives the gateway CPUs of its own and leaves the rest to Redis and the
//! queue's worker (inferq's processor, or BullMQ's node worker), so both queue systems are
//! measured on the same share of the machine with the gateway out of the way.
//!
//! In: the CPUs this process may use (`Cpus_allowed_list` in `/proc/self/status`); out: a
//! [`Split`] that pins running processes to one side (`taskset -a -p`: every thread; a child
//! forked later, such as Redis's AOF rewrite, inherits the mask) and gives every pinned process
//! back all the CPUs when dropped, and [`command_on`] for commands that start on one side
//! (`taskset -c`, which execs the command: the pid is the command's).

use std::process::{Command, Stdio};

/// The two sides of the machine, as `taskset` CPU lists.
#[derive(Debug)]
pub struct Split {
    /// Redis and the queue's worker.
    pub queue: String,
    /// The gateway.
    pub gateway: String,
    /// Every CPU this process may use: what a pinned process gets back.
    all: String,
    /// Processes pinned so far, given `all` back on drop.
    pinned: Vec<u32>,
}

/// Which side of a [`Split`] a process goes to.
#[derive(Debug, Clone, Copy)]
pub enum Side {
    Queue,
    Gateway,
}

impl Split {
    /// The split of this machine: the first half of the CPUs (at least one) for Redis and the
    /// worker, the rest for the gateway. An error saying why there is none: one CPU, or no
    /// `taskset`.
    pub fn plan() -> Result<Split, String> {
        let status = std::fs::read_to_string("/proc/self/status")
            .map_err(|e| format!("cannot read /proc/self/status: {e}"))?;
        let listed = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .ok_or("no Cpus_allowed_list in /proc/self/status")?
            .trim()
            .to_owned();
        let cpus = parse_cpu_list(&listed)?;
        if cpus.len() < 2 {
            return Err(format!(
                "one CPU ({listed}): there is no second one for the gateway"
            ));
        }
        let available = Command::new("taskset")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !available {
            return Err("taskset (util-linux) is not installed".to_owned());
        }
        let (queue, gateway) = cpus.split_at(cpus.len() / 2);
        Ok(Split {
            queue: join(queue),
            gateway: join(gateway),
            all: listed,
            pinned: Vec::new(),
        })
    }

    /// The CPU list of `side`.
    pub fn cpus(&self, side: Side) -> &str {
        match side {
            Side::Queue => &self.queue,
            Side::Gateway => &self.gateway,
        }
    }

    /// Moves every thread of the running process `pid` onto the CPUs of `side`.
    pub fn pin(&mut self, pid: u32, side: Side) -> Result<(), String> {
        self.pinned.push(pid);
        set_affinity(pid, self.cpus(side))
    }
}

/// A command for `program`, started by `taskset` on `cpus` when they are given.
pub(crate) fn command_on(cpus: Option<&str>, program: impl AsRef<std::ffi::OsStr>) -> Command {
    match cpus {
        Some(cpus) => {
            let mut command = Command::new("taskset");
            command.arg("-c").arg(cpus).arg(program);
            command
        }
        None => Command::new(program),
    }
}

impl Drop for Split {
    fn drop(&mut self) {
        for &pid in &self.pinned {
            // A process that has exited meanwhile needs nothing back.
            let _ = set_affinity(pid, &self.all);
        }
    }
}

fn set_affinity(pid: u32, cpus: &str) -> Result<(), String> {
    let out = Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("cannot run taskset: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "taskset -a -p -c {cpus} {pid}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The CPUs of a list such as `0-3,6,8-9`.
fn parse_cpu_list(list: &str) -> Result<Vec<u32>, String> {
    let mut cpus = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let number = |s: &str| {
            s.trim()
                .parse::<u32>()
                .map_err(|e| format!("CPU list {list:?}: {s:?}: {e}"))
        };
        match part.split_once('-') {
            Some((lo, hi)) => {
                let (lo, hi) = (number(lo)?, number(hi)?);
                if hi < lo {
                    return Err(format!("CPU list {list:?}: {part:?} runs backwards"));
                }
                cpus.extend(lo..=hi);
            }
            None => cpus.push(number(part)?),
        }
    }
    Ok(cpus)
}

fn join(cpus: &[u32]) -> String {
    cpus.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_as_the_kernel_writes_them() {
        assert_eq!(parse_cpu_list("0-1"), Ok(vec![0, 1]));
        assert_eq!(parse_cpu_list("0"), Ok(vec![0]));
        assert_eq!(parse_cpu_list("0-2,5,7-8"), Ok(vec![0, 1, 2, 5, 7, 8]));
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("a").is_err());
    }

    /// A pinned process runs only on its side, and gets every CPU back when the split is
    /// dropped.
    #[test]
    fn a_pinned_process_gets_its_cpus_back() {
        let mut split = match Split::plan() {
            Ok(split) => split,
            // One CPU, or no taskset: nothing to pin on this machine.
            Err(_) => return,
        };
        let mut child = match Command::new("sleep").arg("30").spawn() {
            Ok(child) => child,
            Err(e) => panic!("sleep: {e}"),
        };
        let allowed = |pid: u32| -> String {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .unwrap_or("")
                .trim()
                .to_owned()
        };
        let before = allowed(child.id());
        if let Err(e) = split.pin(child.id(), Side::Gateway) {
            panic!("{e}");
        }
        let pinned = allowed(child.id());
        let gateway = split.gateway.clone();
        drop(split);
        let after = allowed(child.id());
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(parse_cpu_list(&pinned), parse_cpu_list(&gateway), "pinned");
        assert_eq!(after, before, "given back");
    }
}
