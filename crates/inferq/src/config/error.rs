//! The one error type of the configuration layer, and the password redaction every message passes
//! through. Loaders build a [`ConfigError`] naming the flag or JSON path at fault; the CLI prints
//! it and exits with [`EXIT_CODE`]. Any text that may hold a Redis URL (user input echoed back,
//! serde or parser messages) goes through [`redact_in_text`] on the way in, so no error and no
//! `Debug` output ever shows a password.

use std::path::PathBuf;

/// Process exit code for a configuration error (same as a command-line usage error).
pub const EXIT_CODE: u8 = 2;

/// Why the configuration could not be turned into a [`crate::config::RunConfig`].
///
/// Every variant's message starts with `invalid config:`, then the flag (`--drain-timeout`) or
/// the JSON path (`queues[1].igw_base_url`) at fault, then the reason.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A value is missing, malformed or out of range.
    #[error("invalid config: {field}: {reason}")]
    Invalid {
        /// Flag name or JSON path.
        field: String,
        /// What is wrong, already redacted.
        reason: String,
    },
    /// A valid Go setting that inferq does not implement (yet).
    #[error("invalid config: {field}: {reason}")]
    Unsupported {
        /// Flag name or JSON path.
        field: String,
        /// What is not supported and what to use instead.
        reason: String,
    },
    /// A file named by a flag could not be read.
    #[error("invalid config: {flag}: cannot read {path:?}: {source}")]
    Read {
        /// The flag that named the file.
        flag: &'static str,
        /// The file as given.
        path: PathBuf,
        /// The I/O failure.
        source: std::io::Error,
    },
}

impl ConfigError {
    /// The process exit code the CLI uses for any configuration error.
    pub const EXIT_CODE: u8 = EXIT_CODE;

    /// A malformed or out-of-range value; `reason` is redacted here.
    pub fn invalid(field: impl Into<String>, reason: impl AsRef<str>) -> Self {
        ConfigError::Invalid {
            field: redact_in_text(&field.into()),
            reason: redact_in_text(reason.as_ref()),
        }
    }

    /// A setting inferq does not implement; `reason` is redacted here.
    pub fn unsupported(field: impl Into<String>, reason: impl AsRef<str>) -> Self {
        ConfigError::Unsupported {
            field: redact_in_text(&field.into()),
            reason: redact_in_text(reason.as_ref()),
        }
    }

    /// The flag name or JSON path this error is about.
    pub fn field(&self) -> &str {
        match self {
            ConfigError::Invalid { field, .. } | ConfigError::Unsupported { field, .. } => field,
            ConfigError::Read { flag, .. } => flag,
        }
    }

    /// The exit code for this error (always [`EXIT_CODE`]).
    pub fn exit_code(&self) -> u8 {
        EXIT_CODE
    }

    /// The same error, saying which file it is in (`… (in /etc/inferq/transport.json)`); a
    /// read error names its file already.
    pub(crate) fn in_file(self, path: &str) -> Self {
        let path = redact_in_text(path);
        match self {
            ConfigError::Invalid { field, reason } => ConfigError::Invalid {
                field,
                reason: format!("{reason} (in {path})"),
            },
            ConfigError::Unsupported { field, reason } => ConfigError::Unsupported {
                field,
                reason: format!("{reason} (in {path})"),
            },
            other => other,
        }
    }

    /// The same error about another field (used to name a legacy flag instead of the JSON path
    /// of the config synthesised from it).
    pub(crate) fn with_field(self, field: &str) -> Self {
        match self {
            ConfigError::Invalid { reason, .. } => ConfigError::Invalid {
                field: field.to_owned(),
                reason,
            },
            ConfigError::Unsupported { reason, .. } => ConfigError::Unsupported {
                field: field.to_owned(),
                reason,
            },
            other => other,
        }
    }
}

pub use inferq_client::{redact_in_text, redact_url};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_constructors_redact_and_name_the_field() {
        let err = ConfigError::invalid("url", "bad scheme in \"http://u:hunter2@x\"");
        let shown = err.to_string();
        assert_eq!(
            shown,
            "invalid config: url: bad scheme in \"http://u:***@x\""
        );
        assert!(!format!("{err:?}").contains("hunter2"));
        assert_eq!(err.field(), "url");
        assert_eq!(err.exit_code(), 2);
        assert_eq!(ConfigError::EXIT_CODE, 2);
    }
}
