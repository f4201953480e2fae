//! The cluster section's command census: `MONITOR` on every master during a drain that is not
//! timed, each line sorted into top-level commands (the processor's round-trip slots) and
//! commands run inside scripts, and each top-level command's first key checked against the slot
//! of the queue it serves. In: MONITOR lines and the queues' [`Lane`]s; out: [`Tally`] counts
//! that [`super::report::Census`] turns into figures per request.
//!
//! A command *serves* a queue when its key is the queue or one of its `{queue}` keys, the
//! queue's result list (or that list's `{list}:delivered` markers), or a producer marker
//! (`request-active:<id>`, `request-cancel:<id>`) of a request submitted to that queue (the
//! bench gives every queue's request ids a prefix of their own). It is *cross-slot* when that
//! key hashes to another slot than the queue, and *cross-node* when another master serves the
//! key than the one serving the queue. A key the bench cannot attribute counts as cross-slot
//! when its slot is none of the queues' slots.

use std::collections::BTreeMap;

use inferq::config::hash_slot;

/// Commands that are not part of the work: connection set-up, topology discovery, the bench's
/// own readings. Left out of every count.
pub(super) const ADMIN: [&str; 16] = [
    "info",
    "config",
    "ping",
    "cluster",
    "client",
    "hello",
    "command",
    "monitor",
    "select",
    "auth",
    "readonly",
    "readwrite",
    "flushall",
    "echo",
    "memory",
    "latency",
];

/// Whether a command name (`cluster|slots` style, as INFO commandstats writes it, or plain) is
/// an [`ADMIN`] command.
pub(super) fn is_admin(name: &str) -> bool {
    let base = name.split('|').next().unwrap_or(name);
    ADMIN.contains(&base.to_ascii_lowercase().as_str())
}

/// One queue of a drain, as the census needs it.
#[derive(Debug, Clone)]
pub struct Lane {
    pub queue: String,
    pub results: String,
    /// The prefix of the ids of the requests submitted to this queue (`<prefix>-0000001`).
    pub id_prefix: String,
    pub slot: u16,
    /// The index of the master serving the queue's slot.
    pub node: usize,
}

/// What one MONITOR line says.
#[derive(Debug, PartialEq, Eq)]
pub struct Line {
    /// Run by a Lua script (`[0 lua]`), not sent by a client.
    pub by_script: bool,
    /// The client's `ip:port`, for a client's command.
    pub client: String,
    /// The command and its arguments, unquoted.
    pub args: Vec<String>,
}

/// Parses `1700000000.123456 [0 127.0.0.1:5555] "EVALSHA" "abc" "1" "key"`.
pub(super) fn parse_line(line: &str) -> Option<Line> {
    let open = line.find('[')?;
    let close = open + line[open..].find(']')?;
    let source = &line[open + 1..close];
    let client = source.split_whitespace().nth(1)?.to_owned();
    let args = unquote_all(&line[close + 1..])?;
    if args.is_empty() {
        return None;
    }
    Some(Line {
        by_script: client == "lua",
        client,
        args,
    })
}

/// The quoted arguments of a MONITOR line (`"a" "b\"c" "\x01"`), escapes undone (`\xNN` as the
/// character of that code).
fn unquote_all(text: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        match chars.next() {
            None => return Some(out),
            Some('"') => {}
            Some(_) => return None,
        }
        let mut arg = String::new();
        loop {
            match chars.next()? {
                '"' => break,
                '\\' => match chars.next()? {
                    'n' => arg.push('\n'),
                    'r' => arg.push('\r'),
                    't' => arg.push('\t'),
                    'a' => arg.push('\u{7}'),
                    'b' => arg.push('\u{8}'),
                    'x' => {
                        let hex: String = [chars.next()?, chars.next()?].iter().collect();
                        arg.push(char::from(u8::from_str_radix(&hex, 16).ok()?));
                    }
                    other => arg.push(other),
                },
                c => arg.push(c),
            }
        }
        out.push(arg);
    }
}

/// The first key of a command: after `numkeys` for the script commands (none when it is 0),
/// the first argument otherwise; `None` for a command without arguments.
pub(super) fn first_key(args: &[String]) -> Option<&str> {
    let name = args.first()?.to_ascii_lowercase();
    if matches!(
        name.as_str(),
        "eval" | "evalsha" | "eval_ro" | "evalsha_ro" | "fcall" | "fcall_ro"
    ) {
        let keys: usize = args.get(2)?.parse().ok()?;
        return if keys == 0 {
            None
        } else {
            args.get(3).map(String::as_str)
        };
    }
    // Pub/sub channels are not keys; the others take none.
    if matches!(
        name.as_str(),
        "script" | "wait" | "multi" | "exec" | "discard" | "subscribe" | "psubscribe" | "publish"
    ) {
        return None;
    }
    args.get(1).map(String::as_str)
}

/// Which kind of key a cross-slot command reached.
pub(super) fn kind_of(key: &str, lanes: &[Lane]) -> &'static str {
    if key.starts_with("request-active:") || key.starts_with("request-cancel:") {
        "producer markers"
    } else if lanes
        .iter()
        .any(|l| key == l.results || key.starts_with(&format!("{{{}}}", l.results)))
    {
        "result lists"
    } else {
        "other"
    }
}

/// The queue a key serves (see the module documentation), by index into `lanes`.
pub(super) fn lane_of(key: &str, lanes: &[Lane]) -> Option<usize> {
    let id = key
        .strip_prefix("request-active:")
        .or_else(|| key.strip_prefix("request-cancel:"));
    lanes.iter().position(|l| match id {
        Some(id) => id.starts_with(&format!("{}-", l.id_prefix)),
        None => {
            key == l.queue
                || key.starts_with(&format!("{{{}}}", l.queue))
                || key == l.results
                || key.starts_with(&format!("{{{}}}", l.results))
        }
    })
}

/// Counts over a census drain.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Tally {
    /// Top-level commands by name (admin commands left out).
    pub top_level: BTreeMap<String, u64>,
    pub inside_scripts: u64,
    /// Top-level commands whose key is in another slot than their queue's, by kind of key.
    pub cross_slot: BTreeMap<String, u64>,
    /// Of those, the ones served by another master than their queue's.
    pub cross_node: u64,
}

impl Tally {
    /// Counts one line; `node_of` names the master serving a slot, `own` are the bench's own
    /// connections (left out). On one server (`slots` false) nothing is cross-slot.
    pub fn count(
        &mut self,
        slots: bool,
        line: &Line,
        lanes: &[Lane],
        node_of: impl Fn(u16) -> usize,
        own: &[String],
    ) {
        if line.by_script {
            self.inside_scripts += 1;
            return;
        }
        if own.contains(&line.client) {
            return;
        }
        let name = line.args[0].to_ascii_lowercase();
        if is_admin(&name) {
            return;
        }
        *self.top_level.entry(name).or_default() += 1;
        let Some(key) = first_key(&line.args).filter(|_| slots) else {
            return;
        };
        let slot = hash_slot(key);
        let (cross, home) = match lane_of(key, lanes) {
            Some(i) => (slot != lanes[i].slot, Some(lanes[i].node)),
            None => (lanes.iter().all(|l| l.slot != slot), None),
        };
        if cross {
            *self
                .cross_slot
                .entry(kind_of(key, lanes).to_owned())
                .or_default() += 1;
            if home.is_none_or(|node| node != node_of(slot)) {
                self.cross_node += 1;
            }
        }
    }

    /// Adds another master's counts.
    pub fn add(&mut self, other: Tally) {
        for (k, v) in other.top_level {
            *self.top_level.entry(k).or_default() += v;
        }
        for (k, v) in other.cross_slot {
            *self.cross_slot.entry(k).or_default() += v;
        }
        self.inside_scripts += other.inside_scripts;
        self.cross_node += other.cross_node;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lanes() -> Vec<Lane> {
        vec![Lane {
            queue: "q-0".into(),
            results: "results-7".into(),
            id_prefix: "apart-q-0".into(),
            slot: hash_slot("q-0"),
            node: 0,
        }]
    }

    #[test]
    fn lines_unquote_and_name_their_client() {
        let l = parse_line(
            r#"1700000000.1 [0 127.0.0.1:5555] "EVALSHA" "ab\"c" "2" "{q-0}:claimed" "\x41""#,
        )
        .unwrap();
        assert!(!l.by_script);
        assert_eq!(l.client, "127.0.0.1:5555");
        assert_eq!(l.args, ["EVALSHA", "ab\"c", "2", "{q-0}:claimed", "A"]);
        assert_eq!(first_key(&l.args), Some("{q-0}:claimed"));
        assert!(
            parse_line(r#"1700000000.2 [0 lua] "hset" "k" "f" "v""#)
                .unwrap()
                .by_script
        );
        assert_eq!(parse_line("OK"), None);
        assert_eq!(first_key(&["EVAL".into(), "x".into(), "0".into()]), None);
        assert_eq!(first_key(&["GET".into(), "k".into()]), Some("k"));
    }

    #[test]
    fn keys_in_another_slot_than_their_queue_count_as_cross_slot() {
        let lanes = lanes();
        let mut t = Tally::default();
        let far = |_: u16| 1;
        let line = |args: &[&str]| Line {
            by_script: false,
            client: "127.0.0.1:9".into(),
            args: args.iter().map(|a| a.to_string()).collect(),
        };
        t.count(
            true,
            &line(&["EVALSHA", "s", "1", "{q-0}:claimed"]),
            &lanes,
            far,
            &[],
        );
        t.count(
            true,
            &line(&["GET", "request-cancel:apart-q-0-0000001"]),
            &lanes,
            far,
            &[],
        );
        t.count(
            true,
            &line(&["EVALSHA", "s", "2", "results-7", "x"]),
            &lanes,
            far,
            &[],
        );
        t.count(true, &line(&["CLUSTER", "SLOTS"]), &lanes, far, &[]);
        t.count(
            true,
            &line(&["LLEN", "results-7"]),
            &lanes,
            far,
            &["127.0.0.1:9".into()],
        );
        assert_eq!(t.top_level.values().sum::<u64>(), 3);
        assert_eq!(t.cross_slot["producer markers"], 1);
        assert_eq!(t.cross_slot["result lists"], 1);
        assert_eq!(t.cross_node, 2);
        assert!(is_admin("cluster|slots") && !is_admin("evalsha"));
    }
}
