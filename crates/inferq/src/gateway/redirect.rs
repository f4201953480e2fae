//! The first hop of a redirect a gateway answers inferq's own connections with
//! ([`super::h1`] follows none). In: the URL the POST went to and the response's status and
//! headers; out: the [`Hop`] to make next (method, resolved `Location`, whether the body goes
//! along) and, through [`Hop::prepare`], the request's headers changed for it.
//!
//! Every change is the one reqwest's redirect policy (tower-http's follow-redirect, and Go's
//! client alike) makes on each hop, so the caller sends the hop through reqwest and leaves the
//! rest of the chain to it, and a redirect costs the redirecting endpoint one request, as on the
//! HTTPS path:
//! - 301 and 302 turn the POST into a GET, and 303 always does; the body and the headers that
//!   describe it (`Content-Type`, `Content-Length`, `Content-Encoding`, `Transfer-Encoding`)
//!   stay behind. 307 and 308 resend the POST with its body.
//! - A `Location` that is not UTF-8 or does not resolve against the URL is no redirect: the 3xx
//!   is the answer.
//! - Going to another host or port drops the credentials (`Authorization`, `Cookie`, `Cookie2`,
//!   `Proxy-Authorization`, `WWW-Authenticate`).
//! - `Referer` names the URL left, unless that would leak an `https` URL to `http`.

use reqwest::header::{
    HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, COOKIE,
    LOCATION, PROXY_AUTHORIZATION, REFERER, TRANSFER_ENCODING, WWW_AUTHENTICATE,
};
use reqwest::{Method, Url};

/// Where and how a redirected POST goes next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    pub method: Method,
    pub url: Url,
    /// Whether the request's body goes along (307 and 308 only).
    pub with_body: bool,
}

/// The hop a response to a POST to `from` asks for; `None` when it asks for none (not one of
/// the statuses followed, or no usable `Location`).
pub fn first_hop(from: &Url, status: u16, response: &HeaderMap) -> Option<Hop> {
    let (method, with_body) = match status {
        301..=303 => (Method::GET, false),
        307 | 308 => (Method::POST, true),
        _ => return None,
    };
    let location = response.get(LOCATION)?.to_str().ok()?;
    let url = from.join(location).ok()?;
    Some(Hop {
        method,
        url,
        with_body,
    })
}

impl Hop {
    /// Changes the headers of the request that went to `from` into the ones this hop sends.
    pub fn prepare(&self, headers: &mut HeaderMap, from: &Url) {
        if !self.with_body {
            for name in [
                CONTENT_TYPE,
                CONTENT_LENGTH,
                CONTENT_ENCODING,
                TRANSFER_ENCODING,
            ] {
                headers.remove(name);
            }
        }
        let cross_host = self.url.host_str() != from.host_str()
            || self.url.port_or_known_default() != from.port_or_known_default();
        if cross_host {
            headers.remove(AUTHORIZATION);
            headers.remove(COOKIE);
            headers.remove("cookie2");
            headers.remove(PROXY_AUTHORIZATION);
            headers.remove(WWW_AUTHENTICATE);
        }
        if let Some(referer) = referer(&self.url, from) {
            headers.insert(REFERER, referer);
        }
    }
}

/// The `Referer` a hop from `from` to `next` carries: `from` without user info or fragment, and
/// none from `https` to `http`.
fn referer(next: &Url, from: &Url) -> Option<HeaderValue> {
    if next.scheme() == "http" && from.scheme() == "https" {
        return None;
    }
    let mut from = from.clone();
    let _ = from.set_username("");
    let _ = from.set_password(None);
    from.set_fragment(None);
    HeaderValue::from_str(from.as_str()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> Url {
        match Url::parse(text) {
            Ok(url) => url,
            Err(e) => panic!("{text}: {e}"),
        }
    }

    fn answer(location: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        match HeaderValue::from_str(location) {
            Ok(value) => headers.insert(LOCATION, value),
            Err(e) => panic!("{location}: {e}"),
        };
        headers
    }

    fn sent() -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("content-type", "application/json"),
            ("content-length", "2"),
            ("authorization", "Bearer secret"),
            ("cookie", "a=b"),
            ("x-request-id", "req-1"),
        ] {
            headers.insert(name, HeaderValue::from_static(value));
        }
        headers
    }

    #[test]
    fn the_status_decides_the_method_and_the_body() {
        let from = url("http://gw:8000/v1/chat/completions");
        let to = answer("/v2/chat");
        let expect = |method: Method, with_body| Hop {
            method,
            url: url("http://gw:8000/v2/chat"),
            with_body,
        };
        assert_eq!(first_hop(&from, 301, &to), Some(expect(Method::GET, false)));
        assert_eq!(first_hop(&from, 302, &to), Some(expect(Method::GET, false)));
        assert_eq!(first_hop(&from, 303, &to), Some(expect(Method::GET, false)));
        assert_eq!(first_hop(&from, 307, &to), Some(expect(Method::POST, true)));
        assert_eq!(first_hop(&from, 308, &to), Some(expect(Method::POST, true)));
        for other in [200, 300, 304, 305, 306, 400, 503] {
            assert_eq!(first_hop(&from, other, &to), None, "{other}");
        }
    }

    #[test]
    fn a_location_resolves_against_the_url_left() {
        let from = url("http://gw:8000/v1/chat/completions?x=1");
        let hop = |location: &str| first_hop(&from, 307, &answer(location)).map(|h| h.url);
        assert_eq!(
            hop("completions2"),
            Some(url("http://gw:8000/v1/chat/completions2"))
        );
        assert_eq!(hop("//other:9/p"), Some(url("http://other:9/p")));
        assert_eq!(
            hop("https://tls.example/p"),
            Some(url("https://tls.example/p"))
        );
    }

    #[test]
    fn no_usable_location_is_no_redirect() {
        let from = url("http://gw:8000/v1");
        assert_eq!(first_hop(&from, 307, &HeaderMap::new()), None);
        assert_eq!(first_hop(&from, 307, &answer("http://[::1")), None);
        let mut not_utf8 = HeaderMap::new();
        match HeaderValue::from_bytes(b"/caf\xe9") {
            Ok(value) => not_utf8.insert(LOCATION, value),
            Err(e) => panic!("{e}"),
        };
        assert_eq!(first_hop(&from, 307, &not_utf8), None);
    }

    #[test]
    fn a_get_leaves_the_body_headers_behind_and_a_post_keeps_them() {
        let from = url("http://gw:8000/v1");
        let get = first_hop(&from, 303, &answer("/v2"));
        let post = first_hop(&from, 307, &answer("/v2"));
        let (Some(get), Some(post)) = (get, post) else {
            panic!("both are redirects");
        };
        let mut headers = sent();
        get.prepare(&mut headers, &from);
        assert!(headers.get(CONTENT_TYPE).is_none());
        assert!(headers.get(CONTENT_LENGTH).is_none());
        assert_eq!(
            headers.get("x-request-id"),
            Some(&HeaderValue::from_static("req-1"))
        );
        let mut headers = sent();
        post.prepare(&mut headers, &from);
        assert!(headers.get(CONTENT_TYPE).is_some());
        assert!(headers.get(CONTENT_LENGTH).is_some());
    }

    #[test]
    fn credentials_stay_with_the_host_and_port_they_were_for() {
        let from = url("http://gw:8000/v1");
        let prepared = |location: &str| {
            let Some(hop) = first_hop(&from, 307, &answer(location)) else {
                panic!("{location} is a redirect");
            };
            let mut headers = sent();
            hop.prepare(&mut headers, &from);
            headers
        };
        let same = prepared("/v2");
        assert!(same.get(AUTHORIZATION).is_some());
        assert!(same.get(COOKIE).is_some());
        for elsewhere in ["http://gw:8001/v2", "http://other:8000/v2", "https://gw/v2"] {
            let headers = prepared(elsewhere);
            assert!(headers.get(AUTHORIZATION).is_none(), "{elsewhere}");
            assert!(headers.get(COOKIE).is_none(), "{elsewhere}");
            assert!(headers.get("x-request-id").is_some(), "{elsewhere}");
        }
    }

    #[test]
    fn the_referer_names_the_url_left_without_user_info() {
        let from = url("http://user:pw@gw:8000/v1?x=1#frag");
        let Some(hop) = first_hop(&from, 307, &answer("/v2")) else {
            panic!("a redirect");
        };
        let mut headers = HeaderMap::new();
        hop.prepare(&mut headers, &from);
        assert_eq!(
            headers.get(REFERER),
            Some(&HeaderValue::from_static("http://gw:8000/v1?x=1"))
        );
        let from = url("https://gw/v1");
        let Some(down) = first_hop(&from, 307, &answer("http://gw/v2")) else {
            panic!("a redirect");
        };
        let mut headers = HeaderMap::new();
        down.prepare(&mut headers, &from);
        assert!(headers.get(REFERER).is_none());
    }
}
