//! Fuzzes the sorted-set member decoder with arbitrary bytes: decoding, id salvage and the
//! dead record built from a bad member must never panic; a member that decodes must re-encode
//! to one that decodes to the same request with the same `data` bytes; a dead record of any
//! member must round-trip through JSON, and `revive` (what requeue would write) must either
//! refuse or produce a member that decodes.
#![no_main]

use inferq::queue::dead::DeadRecord;
use inferq::queue::dead_letters::{DeadLetters, Listed};
use inferq_client::wire::Envelope;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let decoded = Envelope::decode(data);
    let _ = Envelope::salvage_id(data);
    if let Ok(env) = &decoded {
        let again = Envelope::decode(&env.encode()).expect("a re-encoded member decodes");
        assert_eq!(again.data.get(), env.data.get());
        assert_eq!(again.request.payload.get(), env.request.payload.get());
        assert_eq!(again.request.id, env.request.id);
    }
    let (record, _) = DeadRecord::about("q", "fuzz", data, decoded.as_ref().ok());
    let raw = record.to_json();
    let back: DeadRecord = serde_json::from_str(&raw).expect("a dead record parses back");
    assert_eq!(back, record);
    let listed = Listed {
        raw,
        record: Ok(back),
        from_tail: 0,
    };
    if let Ok((env, member)) = DeadLetters::revive(&listed, 0) {
        let again = Envelope::decode(&member).expect("a revived member decodes");
        assert_eq!(again.data.get(), env.data.get());
    }
});
