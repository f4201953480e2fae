//! A gateway URL parsed once: [`parse_target`] checks it as [`super::GatewayClient::send`] would
//! and notes whether inferq's own connections serve it; the [`Target`] that leaves is what
//! `send_to` takes, so a queue's default URL costs no parsing per request.

use reqwest::Url;

use super::super::h1::Direct;

/// Parses a gateway URL as [`super::GatewayClient::send`] does. The error is the cause of a
/// "failed to create request" failure: an unparsable URL, or a scheme other than `http`/`https`.
pub fn parse_target(url: &str) -> Result<Target, String> {
    let parsed = Url::parse(url).map_err(|e| format!("parse {url:?}: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!(
            "unsupported protocol scheme {:?} in {url:?}",
            parsed.scheme()
        ));
    }
    Ok(Target {
        direct: Direct::of(&parsed),
        parsed,
        text: url.to_owned(),
    })
}

/// A gateway URL, parsed, and as it was written (error texts quote it as written, like Go's).
#[derive(Debug, Clone)]
pub struct Target {
    pub(super) parsed: Url,
    pub(super) text: String,
    /// Set for a URL that inferq's own connections serve.
    pub(super) direct: Option<Direct>,
}

impl Target {
    /// The parsed URL.
    pub fn url(&self) -> &Url {
        &self.parsed
    }
}
