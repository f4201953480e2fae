//! Fuzzes the Batch API's line reading with arbitrary bytes: `decode_line` must never panic,
//! and a line it accepts must hand back a non-empty `custom_id` and a body that is a JSON
//! object found in the line as is; the line splitter must give the same lines however the
//! bytes are cut into chunks.
//!
//! "A JSON object" is JSON's grammar: the body alone must parse as one whole value. It is not
//! checked with `serde_json::Value`, which cannot hold what the grammar allows and Python's
//! `json` reads: a `\u` escape naming half a surrogate pair alone, or a number like `1e999`
//! (the fuzzer found both; `lines.rs` has them as tests).
#![no_main]

use inferq_batch::lines::{decode_line, LineSplitter, SplitError};
use libfuzzer_sys::fuzz_target;

fn split(chunks: &[&[u8]]) -> Result<Vec<(u64, Vec<u8>)>, SplitError> {
    let mut s = LineSplitter::new(1 << 16);
    let mut out = Vec::new();
    for c in chunks {
        s.push::<SplitError>(c, &mut |n, l| {
            out.push((n, l.to_vec()));
            Ok(())
        })?;
    }
    s.finish::<SplitError>(&mut |n, l| {
        out.push((n, l.to_vec()));
        Ok(())
    })?;
    Ok(out)
}

fuzz_target!(|data: &[u8]| {
    if let Ok(line) = decode_line(data, "/v1/chat/completions") {
        assert!(!line.custom_id.is_empty());
        let body = line.body.get();
        assert!(body.starts_with('{'));
        assert!(data.windows(body.len()).any(|w| w == body.as_bytes()));
        serde_json::from_str::<Box<serde_json::value::RawValue>>(body)
            .expect("an accepted body is one whole JSON value");
    }
    let cut = data.first().map_or(0, |b| usize::from(*b)).min(data.len());
    assert_eq!(split(&[data]), split(&[&data[..cut], &data[cut..]]));
});
