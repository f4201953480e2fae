//! The general path: a request sent through reqwest. It carries what inferq's own connections
//! do not: a TLS gateway that chose HTTP/2, a URL with user info, and the rest of a redirect
//! chain whose first hop [`super::direct`] made.
//!
//! A target (or a request reqwest already has under way), the headers, the body and the
//! deadline enter; an [`Outcome`] leaves, classified from the response head and the body read
//! up to the client's limit, or from the failure that came before any head.

use bytes::Bytes;
use reqwest::header::HeaderMap;
use tokio::time::Instant;

use super::super::outcome::{classify_response, BodyRead};
use super::super::{error_chain, Outcome};
use super::failure::{expired_before_response, send_error};
use super::response::{response_head, BodyReader};
use super::{within, GatewayClient, Target};

impl GatewayClient {
    /// [`GatewayClient::exchange`] through reqwest.
    pub(super) async fn exchange_general(
        &self,
        target: &Target,
        headers: HeaderMap,
        body: Bytes,
        deadline: Option<Instant>,
    ) -> Outcome {
        let pending = self
            .http
            .post(target.parsed.clone())
            .headers(headers)
            .body(body)
            .send();
        self.answer_to(&target.text, pending, deadline).await
    }

    /// The outcome of a request sent through reqwest (`url`: the gateway URL, for error texts).
    pub(super) async fn answer_to(
        &self,
        url: &str,
        pending: impl std::future::Future<Output = Result<reqwest::Response, reqwest::Error>>,
        deadline: Option<Instant>,
    ) -> Outcome {
        let response = match within(deadline, pending).await {
            None => return expired_before_response(url),
            Some(Err(e)) => return send_error(url, e),
            Some(Ok(response)) => response,
        };

        let head = response_head(response.status().as_u16(), response.headers());
        let body = self.read_body(response, deadline).await;
        classify_response(head, body)
    }

    /// Reads the body to the end, to the limit, to a failure or to the deadline, whichever comes
    /// first, keeping what arrived.
    async fn read_body(
        &self,
        mut response: reqwest::Response,
        deadline: Option<Instant>,
    ) -> BodyRead {
        let mut reader = BodyReader::new(self.body_limit, response.content_length());
        loop {
            if let Some(done) = reader.done() {
                return done;
            }
            match within(deadline, response.chunk()).await {
                None => return reader.timed_out(),
                Some(Err(e)) => return reader.failed(error_chain(&e.without_url())),
                Some(Ok(None)) => {
                    // Let the connection's return to the pool run before the caller sends again.
                    drop(response);
                    tokio::task::yield_now().await;
                    return reader.complete();
                }
                Some(Ok(Some(chunk))) => reader.push(&chunk),
            }
        }
    }
}
