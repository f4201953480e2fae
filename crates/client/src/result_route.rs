//! Which result lists a message may name: never a key of inferq's or of its producers'.
//!
//! A message (or Go's `result_routing_resolved` stamp) names the list its result is pushed to.
//! Pushed to a key that already exists with another type, the push fails; pushed to a key that
//! does not exist *yet*, it makes that key a list — and a queue whose sorted set, hash or
//! marker became a list stops with `WRONGTYPE` at every poll. So a result list is checked
//! before the push, against every key name inferq or its producers use:
//!
//! - each configured queue's keys, in both layouts (`<queue>:…`, and `{<queue>}:…` as on a
//!   Redis Cluster): all of [`QueueKeys`] (a test destructures it, so a key added there later
//!   is refused too) and the `seen` markers. Other names under the prefix stay open: a result
//!   list in the queue's slot (`{<queue>}:results`) gives a cluster its one-script finish;
//! - the retry set;
//! - the producers' keys: `request-active:*`, `request-cancel:*`, `request-payload:*`,
//!   `request-seq:*`;
//! - keys derived from a result list by its consumers and finishers: `…:delivered:<queue>`,
//!   `…:taken:…`, `…:result-claimed` and the other durable-results keys;
//! - keys an operator adds (the tenant queues' prefix, the fair-share index and weights, the
//!   Batch API's and front door's `{inferq-batch}:` keys, gate keys), as names or prefixes.
//!
//! The lists the Batch API and front door name for their own results are open
//! ([`ReservedKeys::open`]). A list the queue itself is configured with is the operator's choice
//! and always allowed; any other must also match the queue's allow-list of glob patterns when
//! it has one ([`glob_match`], Redis's own `KEYS`/ACL `~pattern` syntax, so one pattern serves
//! both the ACL and this list).
//!
//! Data enters as names at start-up ([`ReservedKeys::builder`]) and as one list name per
//! result ([`decide`]); a [`RouteRefusal`] saying why leaves. `glob_match` is hand-written:
//! the glob crates treat `/` and `{a,b}` as path syntax, which Redis key patterns do not.

use std::collections::HashSet;
use std::fmt;

use crate::keys::QueueKeys;

/// The prefixes of keys a producer writes per request (Go's names).
pub const PRODUCER_PREFIXES: [&str; 4] = [
    "request-active:",
    "request-cancel:",
    "request-payload:",
    "request-seq:",
];

/// What keys derived from a result list end with (durable results, reliable consumers).
const RESULT_DERIVED_SUFFIXES: [&str; 5] = [
    ":result-claimed",
    ":result-claim-owners",
    ":result-claims-idx",
    ":result-ack-tombstones",
    ":lease",
];

/// What keys derived from a result list hold in their name (cross-slot delivery markers, a
/// reliable consumer's taken list).
const RESULT_DERIVED_INFIXES: [&str; 2] = [":delivered:", ":taken:"];

/// Every key name a message may not name as its result list.
#[derive(Debug, Clone, Default)]
pub struct ReservedKeys {
    exact: HashSet<String>,
    prefixes: Vec<String>,
    open: HashSet<String>,
}

/// Builds a [`ReservedKeys`].
#[derive(Debug, Default)]
pub struct ReservedKeysBuilder {
    keys: ReservedKeys,
}

impl ReservedKeysBuilder {
    /// A configured queue: every key of its [`QueueKeys`] and its pub/sub markers
    /// (`<prefix>:seen:`), in both layouts. Other names under its prefix stay open: a result
    /// list in the queue's slot (`{queue}:results`) is how a cluster finishes in one script.
    pub fn queue(mut self, queue: &str) -> Self {
        for keys in [QueueKeys::new(queue), QueueKeys::clustered(queue)] {
            for key in keys.all() {
                self.keys.exact.insert(key.to_owned());
            }
            self.keys.prefixes.push(format!("{}:seen:", keys.prefix));
        }
        self
    }

    /// One key name.
    pub fn key(mut self, name: &str) -> Self {
        if !name.is_empty() {
            self.keys.exact.insert(name.to_owned());
        }
        self
    }

    /// Every key whose name starts with `prefix`.
    pub fn prefix(mut self, prefix: &str) -> Self {
        if !prefix.is_empty() {
            self.keys.prefixes.push(prefix.to_owned());
        }
        self
    }

    /// A list that may be named although it is under a reserved prefix (the Batch API's
    /// result lists).
    pub fn open(mut self, name: &str) -> Self {
        self.keys.open.insert(name.to_owned());
        self
    }

    /// The names given so far.
    pub fn build(mut self) -> ReservedKeys {
        // Longest first is not needed for a yes/no answer; shortest first ends sooner.
        self.keys.prefixes.sort_by_key(String::len);
        self.keys.prefixes.dedup();
        self.keys
    }
}

impl ReservedKeys {
    /// Starts from the producers' prefixes (always reserved).
    pub fn builder() -> ReservedKeysBuilder {
        let mut b = ReservedKeysBuilder::default();
        for p in PRODUCER_PREFIXES {
            b = b.prefix(p);
        }
        b
    }

    /// Why `list` is a key of inferq's, or `None` when it is not.
    pub fn owner(&self, list: &str) -> Option<&'static str> {
        if self.open.contains(list) {
            return None;
        }
        if list.is_empty() {
            return Some("an empty name");
        }
        if self.exact.contains(list) {
            return Some("a key of inferq's");
        }
        if self.prefixes.iter().any(|p| list.starts_with(p.as_str())) {
            return Some("under a prefix of inferq's keys");
        }
        if RESULT_DERIVED_SUFFIXES.iter().any(|s| list.ends_with(s))
            || RESULT_DERIVED_INFIXES.iter().any(|s| list.contains(s))
        {
            return Some("a key derived from a result list");
        }
        None
    }
}

/// Why a result list was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteRefusal {
    /// The list is one of inferq's keys.
    Reserved {
        /// The list named.
        list: String,
        /// Whose key it is.
        why: &'static str,
    },
    /// The queue has an allow-list and the list matches none of its patterns.
    NotAllowed {
        /// The list named.
        list: String,
    },
}

impl fmt::Display for RouteRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteRefusal::Reserved { list, why } => write!(
                f,
                "the result list {list:?} is refused: it is {why} (a message may not name one)"
            ),
            RouteRefusal::NotAllowed { list } => write!(
                f,
                "the result list {list:?} is refused: it matches none of the queue's \
                 allowed_result_lists"
            ),
        }
    }
}

impl std::error::Error for RouteRefusal {}

/// The result-route decision: may a result be pushed to `list`? `configured`: the list is the
/// queue's own or the transport's default (an operator's choice, always allowed). `allow`: the
/// queue's allow-list of glob patterns (empty: any list that is not a key of inferq's).
pub fn decide(
    reserved: &ReservedKeys,
    list: &str,
    configured: bool,
    allow: &[String],
) -> Result<(), RouteRefusal> {
    if configured {
        return Ok(());
    }
    if let Some(why) = reserved.owner(list) {
        return Err(RouteRefusal::Reserved {
            list: list.to_owned(),
            why,
        });
    }
    if !allow.is_empty()
        && !allow
            .iter()
            .any(|p| glob_match(p.as_bytes(), list.as_bytes()))
    {
        return Err(RouteRefusal::NotAllowed {
            list: list.to_owned(),
        });
    }
    Ok(())
}

/// Redis's glob (`KEYS`, ACL `~pattern`): `*` any run, `?` one byte, `[abc]`, `[^a-z]`, and `\`
/// quoting the next byte. Iterative, with one back-tracking point, so its time is bounded by
/// `pattern.len() * text.len()` whatever the pattern.
pub fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0usize, 0usize);
    // Where to resume after the last `*`: its pattern position and the text it swallowed to.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() {
            match pattern[p] {
                b'*' => {
                    star = Some((p, t));
                    p += 1;
                    continue;
                }
                b'?' => {
                    p += 1;
                    t += 1;
                    continue;
                }
                b'[' => {
                    if let Some((matched, next)) = class(pattern, p, text[t]) {
                        if matched {
                            p = next;
                            t += 1;
                            continue;
                        }
                    } else if text[t] == b'[' {
                        // An unclosed `[` is a literal.
                        p += 1;
                        t += 1;
                        continue;
                    }
                }
                b'\\' if p + 1 < pattern.len() && pattern[p + 1] == text[t] => {
                    p += 2;
                    t += 1;
                    continue;
                }
                b'\\' if p + 1 < pattern.len() => {}
                c if c == text[t] => {
                    p += 1;
                    t += 1;
                    continue;
                }
                _ => {}
            }
        }
        match star {
            Some((sp, st)) => {
                star = Some((sp, st + 1));
                p = sp + 1;
                t = st + 1;
            }
            None => return false,
        }
    }
    pattern[p.min(pattern.len())..].iter().all(|&c| c == b'*')
}

/// A `[...]` class at `pattern[open]`: whether `c` is in it and where the pattern goes on;
/// `None` when the class is not closed.
fn class(pattern: &[u8], open: usize, c: u8) -> Option<(bool, usize)> {
    let mut i = open + 1;
    let negate = pattern.get(i) == Some(&b'^');
    if negate {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    loop {
        let here = *pattern.get(i)?;
        if here == b']' && !first {
            break;
        }
        first = false;
        if here == b'\\' {
            let quoted = *pattern.get(i + 1)?;
            matched |= quoted == c;
            i += 2;
        } else if pattern.get(i + 1) == Some(&b'-')
            && pattern.get(i + 2).is_some_and(|&e| e != b']')
        {
            let (mut lo, mut hi) = (here, pattern[i + 2]);
            if lo > hi {
                std::mem::swap(&mut lo, &mut hi);
            }
            matched |= (lo..=hi).contains(&c);
            i += 3;
        } else {
            matched |= here == c;
            i += 1;
        }
    }
    Some((matched != negate, i + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reserved() -> ReservedKeys {
        ReservedKeys::builder()
            .queue("q")
            .queue("{tenant}jobs")
            .key("retry-sortedset")
            .prefix("inferq-tenant:")
            .prefix("{inferq-batch}:")
            .open("{inferq-batch}:results")
            .build()
    }

    /// Every key of [`QueueKeys`] is refused, in both layouts. The destructuring names every
    /// field: a key added to `QueueKeys` later does not compile here until it is listed, and
    /// it must be refused like the others.
    #[test]
    fn every_queue_key_is_refused_in_both_layouts() {
        let r = reserved();
        for queue in ["q", "{tenant}jobs"] {
            for keys in [QueueKeys::new(queue), QueueKeys::clustered(queue)] {
                let QueueKeys {
                    prefix,
                    pending,
                    claimed,
                    owners,
                    idx,
                    scores,
                    deliveries,
                    deliveries_idx,
                    parked,
                    dead,
                    finishing,
                    finishing_idx,
                } = &keys;
                let fields = [
                    pending,
                    claimed,
                    owners,
                    idx,
                    scores,
                    deliveries,
                    deliveries_idx,
                    parked,
                    dead,
                    finishing,
                    finishing_idx,
                ];
                assert_eq!(fields.len(), keys.all().len());
                for key in fields {
                    assert!(
                        decide(&r, key, false, &[]).is_err(),
                        "{key} was not refused"
                    );
                }
                for key in keys.all() {
                    assert!(decide(&r, key, false, &[]).is_err(), "{key}");
                }
                assert!(decide(&r, &keys.seen(b"m"), false, &[]).is_err());
                // A list of the producer's own beside the queue, in its slot, is no key of
                // inferq's (the cluster's one-script finish depends on it).
                assert!(decide(&r, &format!("{prefix}:results"), false, &[]).is_ok());
            }
        }
    }

    #[test]
    fn producers_and_derived_keys_are_refused() {
        let r = reserved();
        for key in [
            "request-active:x",
            "request-cancel:x",
            "request-payload:x:t",
            "request-seq:q:17",
            "retry-sortedset",
            "inferq-tenant:alice",
            "{inferq-batch}:live",
            "{inferq-batch}:req:1",
            "{results}:delivered:q",
            "results:taken:me",
            "results:result-claimed",
            "{results}:result-ack-tombstones",
            "",
        ] {
            assert!(decide(&r, key, false, &[]).is_err(), "{key}");
        }
    }

    #[test]
    fn ordinary_and_open_lists_pass_and_configured_ones_always_do() {
        let r = reserved();
        for list in [
            "result-list",
            "results:alice",
            "qq",
            "q-results",
            "{q}results",
            "{inferq-batch}:results",
        ] {
            assert_eq!(decide(&r, list, false, &[]), Ok(()), "{list}");
        }
        assert_eq!(decide(&r, "q:dead", true, &[]), Ok(()));
    }

    #[test]
    fn the_allow_list_narrows_message_named_lists() {
        let r = reserved();
        let allow = vec!["results:*".to_owned(), "batch-[0-9]".to_owned()];
        assert_eq!(decide(&r, "results:alice", false, &allow), Ok(()));
        assert_eq!(decide(&r, "batch-7", false, &allow), Ok(()));
        assert!(matches!(
            decide(&r, "elsewhere", false, &allow),
            Err(RouteRefusal::NotAllowed { .. })
        ));
        // A pattern cannot open a reserved key.
        assert!(matches!(
            decide(&r, "q:dead", false, &["*".to_owned()]),
            Err(RouteRefusal::Reserved { .. })
        ));
    }

    #[test]
    fn glob_follows_redis() {
        let m = |p: &str, t: &str| glob_match(p.as_bytes(), t.as_bytes());
        assert!(m("*", ""));
        assert!(m("a*c", "abbbc"));
        assert!(!m("a*c", "abbb"));
        assert!(m("h?llo", "hello"));
        assert!(m("h[ae]llo", "hallo"));
        assert!(!m("h[^e]llo", "hello"));
        assert!(m("h[a-b]llo", "hbllo"));
        assert!(m("h\\*llo", "h*llo"));
        assert!(!m("h\\*llo", "hallo"));
        assert!(m("{x}:*", "{x}:results"));
        assert!(m("a[", "a["));
        assert!(!m("abc", "abcd"));
        assert!(m("*a*a*a*a*b", "aaaaaaaaaaaaaaaab"));
    }
}
