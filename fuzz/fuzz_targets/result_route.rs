//! Fuzzes the result-route decision: a list name and an allow-list of glob patterns from
//! arbitrary bytes (NUL-separated), against a fixed set of queues. The decision and the glob
//! matcher must never panic; a list under any queue's private prefix (plain or hash-tagged), a
//! queue itself, the retry set or a producer's key is refused whatever the patterns; `*` allows
//! every list that is not reserved; a list named exactly by a pattern without glob characters
//! is allowed unless reserved.
#![no_main]

use inferq_client::keys::QueueKeys;
use inferq_client::result_route::{decide, glob_match, ReservedKeys, PRODUCER_PREFIXES};
use libfuzzer_sys::fuzz_target;

const QUEUES: [&str; 3] = ["q", "{t}jobs", "request-sortedset"];

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.split('\0');
    let list = parts.next().unwrap_or("").to_owned();
    let allow: Vec<String> = parts.map(str::to_owned).collect();
    let mut b = ReservedKeys::builder().key("retry-sortedset");
    for q in QUEUES {
        b = b.queue(q);
    }
    let reserved = b.build();
    for p in &allow {
        let _ = glob_match(p.as_bytes(), list.as_bytes());
    }
    let verdict = decide(&reserved, &list, false, &allow);
    let ours = QUEUES.iter().any(|q| {
        [QueueKeys::new(q), QueueKeys::clustered(q)]
            .iter()
            .any(|k| list == k.pending || list.starts_with(&format!("{}:", k.prefix)))
    }) || list == "retry-sortedset"
        || PRODUCER_PREFIXES.iter().any(|p| list.starts_with(p));
    if ours {
        assert!(verdict.is_err(), "{list:?} is a key of inferq's");
    }
    let reserved_at_all = reserved.owner(&list).is_some();
    assert_eq!(
        decide(&reserved, &list, false, &["*".to_owned()]).is_ok(),
        !reserved_at_all
    );
    let plain = !list.contains(['*', '?', '[', '\\']);
    if plain && !reserved_at_all {
        assert!(decide(&reserved, &list, false, &[list.clone()]).is_ok());
    }
    // The queue's own list is the operator's choice.
    assert!(decide(&reserved, &list, true, &allow).is_ok());
});
