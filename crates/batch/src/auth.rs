//! Who is calling, and what that tenant may do. With `--api-keys-file` (a JSON object mapping
//! each key to its tenant, or to `{"tenant", "weight", "max_enqueued_lines"}`) every call needs
//! `Authorization: Bearer <key>`. The presented key is hashed (SHA-256) and compared in constant
//! time against every known key's hash, so the time taken says nothing about how close a guess
//! came. Keys are never logged. Without a keys file every caller is the tenant `default`.
//!
//! Each tenant's settings ([`TenantSettings`]: its fair-share weight and its own bound on lines
//! not yet finished) are read from the same file and handed out by [`Keys::settings`].

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

/// What the keys file says of one tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantSettings {
    /// Its share of the fleet against other tenants with work (fair share), at least 1.
    pub weight: u32,
    /// Its own bound on batch lines not yet finished, in place of `--max-enqueued-lines`.
    pub max_enqueued_lines: Option<u64>,
}

impl Default for TenantSettings {
    fn default() -> TenantSettings {
        TenantSettings {
            weight: 1,
            max_enqueued_lines: None,
        }
    }
}

/// The known keys, as hashes, and the tenants they name.
#[derive(Clone, Default)]
pub struct Keys {
    known: Vec<([u8; 32], String)>,
    tenants: BTreeMap<String, TenantSettings>,
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
    /// Reads a keys file: `{"<key>": "<tenant>" | {"tenant": …, "weight": …,
    /// "max_enqueued_lines": …}, …}`, at least one key, no empty key or tenant; two keys of one
    /// tenant must not disagree on its settings.
    pub fn load(path: &Path) -> Result<Keys, KeysError> {
        let bad = |reason: String| KeysError::Bad {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let map: BTreeMap<String, serde_json::Value> = serde_json::from_str(&text)
            .map_err(|e| bad(format!("must be a JSON object of key -> tenant: {e}")))?;
        if map.is_empty() {
            return Err(bad("holds no key".into()));
        }
        let mut keys = Keys::default();
        for (key, value) in map {
            let (tenant, settings) = entry(&value).map_err(&bad)?;
            if key.len() < 16 {
                return Err(bad(format!(
                    "the key of tenant {tenant:?} is shorter than 16 characters"
                )));
            }
            match keys.tenants.get(&tenant) {
                Some(known) if *known != settings => {
                    return Err(bad(format!(
                        "two keys of tenant {tenant:?} give it different settings (weight, max_enqueued_lines): give them once, alike"
                    )))
                }
                _ => {
                    keys.tenants.insert(tenant.clone(), settings);
                }
            }
            keys.known.push((digest(key.as_bytes()), tenant));
        }
        Ok(keys)
    }

    /// The tenants the keys name, each with its settings.
    pub fn tenants(&self) -> impl Iterator<Item = (&str, &TenantSettings)> {
        self.tenants.iter().map(|(t, s)| (t.as_str(), s))
    }

    /// The settings of `tenant` (the defaults for one the keys do not name, such as the open
    /// tenant `default`).
    pub fn settings(&self, tenant: &str) -> TenantSettings {
        self.tenants.get(tenant).copied().unwrap_or_default()
    }

    /// The tenants whose series are exported from start-up: the keys' tenants, or `default`
    /// when the API is open.
    pub fn known_tenants(&self) -> Vec<String> {
        if self.tenants.is_empty() {
            vec![OPEN_TENANT.to_owned()]
        } else {
            self.tenants.keys().cloned().collect()
        }
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

/// One value of the keys file: a tenant's name, or an object naming it and its settings.
fn entry(value: &serde_json::Value) -> Result<(String, TenantSettings), String> {
    use serde_json::Value;
    let mut settings = TenantSettings::default();
    let tenant = match value {
        Value::String(t) => t.clone(),
        Value::Object(o) => {
            for field in o.keys() {
                if !["tenant", "weight", "max_enqueued_lines"].contains(&field.as_str()) {
                    return Err(format!(
                        "unknown field {field:?} (a key's object takes tenant, weight, max_enqueued_lines)"
                    ));
                }
            }
            let tenant = match o.get("tenant") {
                Some(Value::String(t)) => t.clone(),
                Some(_) => return Err("tenant: must be a string".into()),
                None => return Err("tenant: missing from a key's object".into()),
            };
            let whole = |field: &str, min: u64, max: u64| -> Result<Option<u64>, String> {
                match o.get(field) {
                    None | Some(Value::Null) => Ok(None),
                    Some(v) => v
                        .as_u64()
                        .filter(|n| (min..=max).contains(n))
                        .map(Some)
                        .ok_or_else(|| {
                            format!(
                                "{field} of tenant {tenant:?}: must be a whole number from {min} to {max}, not {v}"
                            )
                        }),
                }
            };
            if let Some(w) = whole("weight", 1, 1_000_000)? {
                settings.weight = u32::try_from(w).unwrap_or(1);
            }
            settings.max_enqueued_lines = whole("max_enqueued_lines", 1, 1 << 53)?;
            tenant
        }
        other => {
            return Err(format!(
                "a key's value must be its tenant (a string) or an object with tenant, weight, max_enqueued_lines, not {other}"
            ))
        }
    };
    if tenant.is_empty()
        || !tenant
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
    {
        return Err(format!(
            "tenant {tenant:?} must be letters, digits, '-', '_' or '.'"
        ));
    }
    Ok((tenant, settings))
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

    #[test]
    fn a_key_may_give_its_tenant_settings_and_bad_ones_name_the_field(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("keys.json");
        std::fs::write(
            &path,
            r#"{"sk-aaaaaaaaaaaaaaaa":{"tenant":"a","weight":3,"max_enqueued_lines":100},
                "sk-aaaaaaaaaaaaaaa2":{"tenant":"a","weight":3,"max_enqueued_lines":100},
                "sk-bbbbbbbbbbbbbbbb":"b"}"#,
        )?;
        let keys = Keys::load(&path)?;
        assert_eq!(
            keys.tenant(&headers("Bearer sk-aaaaaaaaaaaaaaa2"))
                .ok()
                .as_deref(),
            Some("a")
        );
        let a = TenantSettings {
            weight: 3,
            max_enqueued_lines: Some(100),
        };
        assert_eq!(keys.settings("a"), a);
        assert_eq!(keys.settings("b"), TenantSettings::default());
        assert_eq!(keys.settings("nobody").weight, 1);
        assert_eq!(keys.known_tenants(), ["a", "b"]);
        assert_eq!(Keys::default().known_tenants(), [OPEN_TENANT]);
        for (text, field) in [
            (
                r#"{"sk-aaaaaaaaaaaaaaaa":{"tenant":"a","weight":0}}"#,
                "weight",
            ),
            (
                r#"{"sk-aaaaaaaaaaaaaaaa":{"tenant":"a","weight":1.5}}"#,
                "weight",
            ),
            (
                r#"{"sk-aaaaaaaaaaaaaaaa":{"tenant":"a","max_enqueued_lines":-1}}"#,
                "max_enqueued_lines",
            ),
            (r#"{"sk-aaaaaaaaaaaaaaaa":{"weight":2}}"#, "tenant"),
            (
                r#"{"sk-aaaaaaaaaaaaaaaa":{"tenant":"a","wieght":2}}"#,
                "wieght",
            ),
            (r#"{"sk-aaaaaaaaaaaaaaaa":7}"#, "tenant"),
            (
                r#"{"sk-aaaaaaaaaaaaaaaa":{"tenant":"a","weight":2},"sk-aaaaaaaaaaaaaaa2":"a"}"#,
                "weight",
            ),
        ] {
            std::fs::write(&path, text)?;
            let e = Keys::load(&path)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                e.contains("--api-keys-file") && e.contains(field),
                "{text}: {e:?}"
            );
        }
        Ok(())
    }
}
