//! Fault injection for tests of poison requests: with `INFERQ_FAULT_CRASH_ON=<marker>` set when
//! the processor starts, a worker about to send a request whose payload bytes contain `<marker>`
//! aborts the whole process (`std::process::abort`: no unwinding, no shutdown, no release — the
//! same as an OOM kill or a segfault in a native library). The variable is read once, by
//! [`arm_from_env`] at start-up; without it (or with it empty) the check is a no-op and the
//! processor behaves exactly as before.

use std::sync::OnceLock;

/// The environment variable that arms the crash.
pub const CRASH_ON_VAR: &str = "INFERQ_FAULT_CRASH_ON";

static CRASH_ON: OnceLock<Option<Vec<u8>>> = OnceLock::new();

/// Reads [`CRASH_ON_VAR`] once; later calls change nothing. Returns the marker when armed.
pub fn arm_from_env() -> Option<&'static [u8]> {
    CRASH_ON
        .get_or_init(|| {
            std::env::var_os(CRASH_ON_VAR)
                .map(|v| v.to_string_lossy().into_owned().into_bytes())
                .filter(|v| !v.is_empty())
        })
        .as_deref()
}

/// Aborts the process if the crash is armed and `payload` contains its marker.
pub fn before_dispatch(id: &str, payload: &[u8]) {
    let Some(Some(marker)) = CRASH_ON.get() else {
        return;
    };
    if contains(payload, marker) {
        tracing::error!(%id, "{CRASH_ON_VAR}: the payload carries the crash marker; aborting the process");
        std::process::abort();
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_marker_anywhere_in_the_payload() {
        assert!(contains(br#"{"prompt":"x POISON y"}"#, b"POISON"));
        assert!(!contains(br#"{"prompt":"x POISO"}"#, b"POISON"));
        assert!(!contains(b"", b"POISON"));
    }

    #[test]
    fn unarmed_is_a_no_op() {
        // The variable is not set in unit tests, so this must return (not abort).
        before_dispatch("a", b"anything INFERQ");
    }
}
