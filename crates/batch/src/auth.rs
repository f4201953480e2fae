//! Who is calling. With `--api-keys-file` (a JSON object mapping each key to its tenant) every
//! call needs `Authorization: Bearer <key>`. The presented key is hashed (SHA-256) and compared
//! in constant time against every known key's hash, so the time taken says nothing about how
//! close a guess came. Keys are never logged. Without a keys file every caller is the tenant
//! `default`.

use std::collections::BTreeMap;
use std::path::Path;

use axum::http::HeaderMap;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::ApiError;

/// The tenant of callers when no keys are configured.
pub const OPEN_TENANT: &str = "default";

/// Why the keys file was refused.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    #[error("--api-keys-file {path}: {reason}")]
    Bad { path: String, reason: String },
}

/// The known keys, as hashes.
#[derive(Clone, Default)]
pub struct Keys {
    known: Vec<([u8; 32], String)>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keys({} keys)", self.known.len())
    }
}

fn digest(key: &[u8]) -> [u8; 32] {
    Sha256::digest(key).into()
}

impl Keys {
    /// Reads a keys file: `{"<key>": "<tenant>", …}`, at least one, no empty key or tenant.
    pub fn load(path: &Path) -> Result<Keys, KeysError> {
        let bad = |reason: String| KeysError::Bad {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let map: BTreeMap<String, String> = serde_json::from_str(&text)
            .map_err(|e| bad(format!("must be a JSON object of key -> tenant: {e}")))?;
        if map.is_empty() {
            return Err(bad("holds no key".into()));
        }
        let mut known = Vec::new();
        for (key, tenant) in map {
            if key.len() < 16 {
                return Err(bad(format!(
                    "the key of tenant {tenant:?} is shorter than 16 characters"
                )));
            }
            if tenant.is_empty()
                || !tenant
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
            {
                return Err(bad(format!(
                    "tenant {tenant:?} must be letters, digits, '-', '_' or '.'"
                )));
            }
            known.push((digest(key.as_bytes()), tenant));
        }
        Ok(Keys { known })
    }

    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// The caller's tenant, or a 401.
    pub fn tenant(&self, headers: &HeaderMap) -> Result<String, ApiError> {
        if self.known.is_empty() {
            return Ok(OPEN_TENANT.to_owned());
        }
        let Some(value) = headers.get(axum::http::header::AUTHORIZATION) else {
            return Err(ApiError::unauthorized(
                "You didn't provide an API key. You need to provide your API key in an \
                 Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
            ));
        };
        let presented = value
            .as_bytes()
            .strip_prefix(b"Bearer ")
            .map(|k| k.trim_ascii())
            .unwrap_or_default();
        let presented = digest(presented);
        let mut found: Option<&str> = None;
        for (known, tenant) in &self.known {
            if bool::from(known.ct_eq(&presented)) {
                found = Some(tenant);
            }
        }
        found
            .map(str::to_owned)
            .ok_or_else(|| ApiError::unauthorized("Incorrect API key provided."))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(auth: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Ok(v) = auth.parse() {
            h.insert(axum::http::header::AUTHORIZATION, v);
        }
        h
    }

    #[test]
    fn keys_name_tenants_and_wrong_keys_get_401() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("keys.json");
        std::fs::write(
            &path,
            r#"{"sk-aaaaaaaaaaaaaaaa":"alpha","sk-bbbbbbbbbbbbbbbb":"beta"}"#,
        )?;
        let keys = Keys::load(&path)?;
        assert_eq!(
            keys.tenant(&headers("Bearer sk-bbbbbbbbbbbbbbbb"))
                .ok()
                .as_deref(),
            Some("beta")
        );
        for bad in [
            "Bearer sk-bbbbbbbbbbbbbbbc",
            "sk-aaaaaaaaaaaaaaaa",
            "Bearer ",
            "",
        ] {
            let e = keys.tenant(&headers(bad)).err().map(|e| e.status.as_u16());
            assert_eq!(e, Some(401), "{bad:?}");
        }
        std::fs::write(&path, r#"{"short":"alpha"}"#)?;
        assert!(Keys::load(&path).is_err());
        std::fs::write(&path, r#"{"sk-aaaaaaaaaaaaaaaa":"../x"}"#)?;
        assert!(Keys::load(&path).is_err());
        Ok(())
    }
}
