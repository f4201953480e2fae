//! The direct path: a request on inferq's own keep-alive HTTP/1.1 connections
//! ([`super::super::h1`]), for `http` and `https` URLs without user info.
//!
//! A target with its connections' address, the headers (made on demand), the body and the
//! deadline enter; an [`Outcome`] leaves. From the response head on there are three ways:
//! - the gateway chose HTTP/2: nothing was sent, and the request goes through reqwest
//!   ([`super::general`]);
//! - a redirect: its first hop is made here as reqwest would make it
//!   ([`super::super::redirect`]), and reqwest follows the rest, so the redirecting endpoint sees
//!   the request once;
//! - any other answer: its body is read here, up to the client's limit, and classified.
//!
//! A connection whose answer was read to its end (a redirect's too) is handed back for the next
//! request; any other is not kept.

use bytes::Bytes;
use hyper::body::Incoming;
use reqwest::header::HeaderMap;
use tokio::time::Instant;

use super::super::h1::{Direct, Held, Sent};
use super::super::outcome::{classify_response, BodyRead};
use super::super::redirect::{self, Hop};
use super::super::{error_chain, Outcome};
use super::failure::{direct_send_error, expired_before_response};
use super::response::{response_head, BodyReader};
use super::{within, GatewayClient, Target};

/// The most of a redirect's body read so that its connection can be kept (a redirect's body is
/// a line or a short page; a longer one costs its connection instead).
const REDIRECT_BODY_READ: usize = 64 * 1024;

impl GatewayClient {
    /// [`GatewayClient::exchange`] on inferq's own connections. A redirect's first hop is made
    /// here, as reqwest would make it ([`super::super::redirect`]), and reqwest follows the rest.
    pub(super) async fn exchange_direct<H: Fn() -> HeaderMap>(
        &self,
        target: &Target,
        direct: &Direct,
        headers: &H,
        body: Bytes,
        deadline: Option<Instant>,
    ) -> Outcome {
        let url = target.text.as_str();
        let (response, held) =
            match within(deadline, self.direct.send(direct, headers(), body.clone())).await {
                None => return expired_before_response(url),
                Some(Err(failure)) => return direct_send_error(url, &failure),
                Some(Ok(Sent::Response(response, held))) => (response, held),
                Some(Ok(Sent::Http2)) => {
                    return Box::pin(self.exchange_general(target, headers(), body, deadline)).await
                }
            };
        let exchange = DirectExchange {
            client: self,
            target,
            direct,
            headers,
            deadline,
        };
        if let Some(hop) = redirect::first_hop(
            &target.parsed,
            response.status().as_u16(),
            response.headers(),
        ) {
            return exchange.follow_redirect(hop, response, held, body).await;
        }
        let head = response_head(response.status().as_u16(), response.headers());
        let read = exchange.read_body(response, held).await;
        classify_response(head, read)
    }
}

/// One request on inferq's own connections, once its response head is in: what each step
/// after it needs.
struct DirectExchange<'a, H> {
    client: &'a GatewayClient,
    target: &'a Target,
    /// Where `target` is in the client's connections (to hand a connection back).
    direct: &'a Direct,
    /// Makes the request's header set again, for a redirect's next hop.
    headers: &'a H,
    deadline: Option<Instant>,
}

impl<H: Fn() -> HeaderMap> DirectExchange<'_, H> {
    /// Makes a redirect's first hop on the client's onward reqwest client, which follows the
    /// rest of the chain. `held` is the connection the redirect came on.
    async fn follow_redirect(
        &self,
        hop: Hop,
        response: hyper::Response<Incoming>,
        held: Held,
        body: Bytes,
    ) -> Outcome {
        // A redirect read to its end leaves its connection ready for the next request.
        if drain_redirect(response, self.deadline).await {
            self.client.direct.keep(self.direct, held);
        }
        let mut headers = (self.headers)();
        hop.prepare(&mut headers, &self.target.parsed);
        let request = self
            .client
            .onward
            .request(hop.method, hop.url)
            .headers(headers);
        let request = if hop.with_body {
            request.body(body)
        } else {
            request
        };
        Box::pin(
            self.client
                .answer_to(&self.target.text, request.send(), self.deadline),
        )
        .await
    }

    /// Reads the body to the end, to the limit, to a failure or to the deadline, whichever comes
    /// first, keeping what arrived; a body read to its end hands `held`, its connection, back.
    async fn read_body(&self, response: hyper::Response<Incoming>, held: Held) -> BodyRead {
        let announced = hyper::body::Body::size_hint(response.body()).exact();
        let mut incoming = response.into_body();
        let mut reader = BodyReader::new(self.client.body_limit, announced);
        loop {
            if let Some(done) = reader.done() {
                return done;
            }
            match within(self.deadline, http_body_util::BodyExt::frame(&mut incoming)).await {
                None => return reader.timed_out(),
                Some(Some(Err(e))) => return reader.failed(error_chain(&e)),
                Some(None) => {
                    drop(incoming);
                    self.client.direct.keep(self.direct, held);
                    return reader.complete();
                }
                Some(Some(Ok(frame))) => {
                    if let Ok(chunk) = frame.into_data() {
                        reader.push(&chunk);
                    }
                }
            }
        }
    }
}

/// Reads a redirect's body to its end; true if it ended within [`REDIRECT_BODY_READ`] bytes and
/// the deadline, so that its connection can carry the next request.
async fn drain_redirect(response: hyper::Response<Incoming>, deadline: Option<Instant>) -> bool {
    let mut body = response.into_body();
    let mut read = 0usize;
    loop {
        if hyper::body::Body::is_end_stream(&body) {
            return true;
        }
        match within(deadline, http_body_util::BodyExt::frame(&mut body)).await {
            Some(None) => return true,
            Some(Some(Ok(frame))) => {
                read += frame.data_ref().map_or(0, |data| data.len());
                if read > REDIRECT_BODY_READ {
                    return false;
                }
            }
            Some(Some(Err(_))) | None => return false,
        }
    }
}
