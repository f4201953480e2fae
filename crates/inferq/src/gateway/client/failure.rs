//! How an exchange that failed before any response head becomes an [`Outcome`], with Go's
//! error text: the deadline coming first, a failure of inferq's own connections
//! ([`direct_send_error`]), or a reqwest error ([`send_error`]). Which failures are retried and
//! which end the request is decided here (go-compat §5.3, and §12 item 5 where inferq retries
//! what Go did not).

use super::super::h1::SendFailure;
use super::super::outcome::{request_failure, transport_failure, unusable_exchange};
use super::super::{error_chain, Outcome, RetryReason};
use super::redirect_limit::{too_many_redirects, TooManyRedirects, MAX_REDIRECTS};

/// The per-attempt timeout ran out before a response head arrived.
pub(super) fn expired_before_response(url: &str) -> Outcome {
    transport_failure(
        RetryReason::Timeout,
        format!("Post {url:?}: per-attempt timeout expired before the response"),
    )
}

/// Classifies a failure of inferq's own connections before any response head, as
/// [`send_error`] classifies reqwest's.
pub(super) fn direct_send_error(url: &str, failure: &SendFailure) -> Outcome {
    let url = crate::config::redact_url(url);
    match failure {
        SendFailure::Connect(e) => transport_failure(
            RetryReason::Connect,
            format!("Post {url:?}: error sending request: tcp connect error: {e}"),
        ),
        // Go ends a request whose TLS handshake was refused at once: retrying cannot fix it.
        SendFailure::Tls(e) if is_tls_failure(e) => unusable_exchange(format!(
            "Post {url:?}: error sending request: client error (Connect): {}",
            error_chain(e)
        )),
        // The connection lost during the handshake (reset, closed): a connect failure.
        SendFailure::Tls(e) => transport_failure(
            RetryReason::Connect,
            format!(
                "Post {url:?}: error sending request: client error (Connect): {}",
                error_chain(e)
            ),
        ),
        // With TLS 1.3 a refused client certificate shows only once the request is out.
        SendFailure::Transport(e) if is_tls_failure(e) => unusable_exchange(format!(
            "Post {url:?}: error sending request: {}",
            error_chain(e)
        )),
        SendFailure::Transport(e) => transport_failure(
            RetryReason::Transport,
            format!("Post {url:?}: error sending request: {}", error_chain(e)),
        ),
    }
}

/// Classifies a failure before any response head.
pub(super) fn send_error(url: &str, err: reqwest::Error) -> Outcome {
    if let Some(TooManyRedirects(refused)) = too_many_redirects(&err) {
        // Go's words, naming the Location it would not go to.
        return unusable_exchange(format!(
            "Post {:?}: stopped after {} redirects",
            crate::config::redact_url(refused),
            MAX_REDIRECTS + 1
        ));
    }
    // reqwest errors embed the URL in their text; the cause names it once, Go-style.
    let err = err.without_url();
    let cause = format!(
        "Post {:?}: {}",
        crate::config::redact_url(url),
        error_chain(&err)
    );
    if err.is_builder() {
        request_failure(cause)
    } else if is_tls_failure(&err) {
        // An untrusted certificate or a refused client certificate: retrying cannot fix it, and
        // Go ends such a request at once with INFERENCE_ERROR.
        unusable_exchange(cause)
    } else if err.is_redirect() {
        // Too many redirects or an unusable Location: the gateway answered, and will again.
        unusable_exchange(cause)
    } else if err.is_timeout() {
        transport_failure(RetryReason::Timeout, cause)
    } else if err.is_connect() {
        transport_failure(RetryReason::Connect, cause)
    } else {
        transport_failure(RetryReason::Transport, cause)
    }
}

/// Whether a TLS handshake failed (certificate not trusted, expired or for another name; client
/// certificate refused). rustls reports through `io::Error`s (nested: the connector wraps the
/// TLS stream's) whose `source()` skips what they wrap, so each one is unwrapped by hand.
fn is_tls_failure(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut level = Some(err);
    while let Some(e) = level {
        let mut inner = e;
        while let Some(io) = inner.downcast_ref::<std::io::Error>() {
            match io.get_ref() {
                Some(wrapped) => inner = wrapped,
                None => break,
            }
        }
        if inner.downcast_ref::<rustls::Error>().is_some() {
            return true;
        }
        level = e.source();
    }
    false
}
