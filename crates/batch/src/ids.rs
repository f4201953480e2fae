//! Ids of files, batches and output lines. New ids are random (`file-` / `batch_` and 24
//! lowercase letters and digits); ids from a request's path are checked against that shape
//! before they name a key or an object, so no path trick (`..`, `/`, `%2F`) reaches the store.
//! The `batch_req_…` id of an output line is derived from the batch id and the line, so two
//! stewards that write one batch's files write the same lines.

use sha2::{Digest, Sha256};

const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

fn random_suffix() -> String {
    (0..24)
        .map(|_| char::from(ALPHABET[rand::random_range(0..ALPHABET.len())]))
        .collect()
}

pub fn new_file_id() -> String {
    format!("file-{}", random_suffix())
}

pub fn new_batch_id() -> String {
    format!("batch_{}", random_suffix())
}

fn suffix_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Whether `id` has the shape of a file id this server makes.
pub fn is_file_id(id: &str) -> bool {
    id.strip_prefix("file-").is_some_and(suffix_ok)
}

/// Whether `id` has the shape of a batch id this server makes.
pub fn is_batch_id(id: &str) -> bool {
    id.strip_prefix("batch_").is_some_and(suffix_ok)
}

/// The inferq request id of a batch's line (1-based line of the input file).
pub fn request_id(batch_id: &str, line: u64) -> String {
    format!("{batch_id}:{line}")
}

/// The `batch_req_…` id of a line's output record: the same for every writer.
pub fn output_line_id(batch_id: &str, line: u64) -> String {
    let digest = Sha256::digest(format!("{batch_id}:{line}").as_bytes());
    let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
    format!("batch_req_{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_ids_pass_and_path_tricks_do_not() {
        assert!(is_file_id(&new_file_id()));
        assert!(is_batch_id(&new_batch_id()));
        for bad in [
            "file-../x",
            "file-",
            "file-A",
            "file-a/b",
            "file-a%2Fb",
            "batch_x",
            "../file-a",
        ] {
            assert!(!is_file_id(bad), "{bad}");
        }
        assert!(!is_batch_id("batch_../../etc"));
    }

    #[test]
    fn output_line_ids_are_stable_and_distinct() {
        assert_eq!(output_line_id("batch_a", 1), output_line_id("batch_a", 1));
        assert_ne!(output_line_id("batch_a", 1), output_line_id("batch_a", 2));
        assert!(output_line_id("batch_a", 1).starts_with("batch_req_"));
    }
}
