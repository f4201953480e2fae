//! Gateway URL construction: `join_url(base, endpoint)` behaves like Go's
//! `url.JoinPath(base, endpoint)`, so a queue configured for the Go processor reaches the same URL.
//!
//! A base URL string and one endpoint path enter; the joined URL string leaves. The rules, as Go
//! documents and tests them:
//! - the base path and the endpoint are joined with exactly one `/` (`http://gw/api` + `v1/x` →
//!   `http://gw/api/v1/x`); an absolute endpoint is appended, not substituted;
//! - the result is cleaned of `.` and `..` segments and repeated slashes (never above the root);
//! - a trailing `/` on the endpoint is kept;
//! - the base's scheme is lower-cased, its query and fragment are kept, and the path is
//!   re-escaped the way Go escapes paths (`?` or a space in an endpoint become `%3F` / `%20`,
//!   existing escapes such as `%2f` are preserved).
//!
//! One deliberate difference: an endpoint with an invalid `%` escape is an error here, where Go
//! silently returns the base URL unchanged (and would POST to the wrong path).
//!
//! This is a small re-implementation of the parts of Go's `net/url` that `JoinPath` depends on
//! (parse, path escaping, `String`), written from Go's documented behaviour and test table. Go
//! 1.25's extra validation of bracketed IPv6 literals (`netip.ParseAddr`) is not reproduced.

use super::GatewayError;

/// Joins `path` onto the path of `base` the way Go's `url.JoinPath(base, path)` does.
///
/// Errors when Go's `url.Parse` would reject `base`, or when the joined path holds an invalid
/// `%` escape (see the module comment).
pub fn join_url(base: &str, path: &str) -> Result<String, GatewayError> {
    join_path(base, &[path])
}

/// Checks that `base` is usable as a gateway base URL: Go would parse it, and it names an
/// `http`/`https` scheme and a host. For configuration validation at startup; `join_url` itself
/// accepts anything Go's parser accepts (as Go does), leaving the failure to the send.
pub fn validate_base_url(base: &str) -> Result<(), GatewayError> {
    let invalid = |reason: &str| GatewayError::InvalidUrl {
        url: base.to_string(),
        reason: reason.to_string(),
    };
    let parsed = GoUrl::parse(base).map_err(|reason| invalid(&reason))?;
    if parsed.scheme != "http" && parsed.scheme != "https" {
        return Err(invalid("the scheme must be http or https"));
    }
    if parsed.host.is_empty() {
        return Err(invalid("the URL has no host"));
    }
    Ok(())
}

/// `url.JoinPath(base, elems...)` for any number of elements (Go's test table uses none, one and
/// several).
fn join_path(base: &str, elems: &[&str]) -> Result<String, GatewayError> {
    let invalid = |reason: String| GatewayError::InvalidUrl {
        url: base.to_string(),
        reason,
    };
    let mut url = GoUrl::parse(base).map_err(invalid)?;

    let mut parts: Vec<String> = Vec::with_capacity(elems.len() + 1);
    parts.push(url.escaped_path());
    parts.extend(elems.iter().map(|e| (*e).to_string()));

    let mut joined = if parts[0].starts_with('/') {
        clean_join(&parts)
    } else {
        // A relative base stays relative, but `..` may still not climb above it: join under a
        // temporary root and take the root off again.
        parts[0].insert(0, '/');
        let rooted = clean_join(&parts);
        rooted.strip_prefix('/').unwrap_or(&rooted).to_string()
    };
    // Joining drops trailing slashes; keep one if the last element had one. (When there are no
    // elements the "last element" is the base path as rooted above: Go's behaviour, kept.)
    let last_has_slash = parts.last().is_some_and(|p| p.ends_with('/'));
    if last_has_slash && !joined.ends_with('/') {
        joined.push('/');
    }
    url.set_path(&joined)
        .map_err(|reason| GatewayError::InvalidUrl {
            url: format!("{base} + {}", elems.join(" + ")),
            reason,
        })?;
    Ok(url.to_string())
}

/// Go's `path.Join`: the non-empty elements joined with `/`, then cleaned; `""` if all are empty.
fn clean_join(parts: &[String]) -> String {
    let non_empty: Vec<&str> = parts
        .iter()
        .map(String::as_str)
        .filter(|p| !p.is_empty())
        .collect();
    if non_empty.is_empty() {
        return String::new();
    }
    clean(&non_empty.join("/"))
}

/// Go's `path.Clean`: lexical clean-up of `.`, `..` and repeated slashes; `..` never climbs above
/// the root of a rooted path; an empty result is `.` (or `/` when rooted).
fn clean(path: &str) -> String {
    let rooted = path.starts_with('/');
    let mut kept: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => match kept.last() {
                Some(last) if *last != ".." => {
                    kept.pop();
                }
                _ if rooted => {}
                _ => kept.push(".."),
            },
            other => kept.push(other),
        }
    }
    let body = kept.join("/");
    if rooted {
        format!("/{body}")
    } else if body.is_empty() {
        ".".to_string()
    } else {
        body
    }
}

/// The URL parts of Go's `url.URL` that parsing and re-serialising need. Decoded parts are bytes
/// because a `%xx` escape may decode to bytes that are not UTF-8; they are always re-escaped on
/// output.
#[derive(Debug, Default)]
struct GoUrl {
    scheme: String,
    /// The rest of a `scheme:rest` URL whose rest does not start with `/` (e.g. `localhost:8000`
    /// parses as scheme `localhost`, opaque `8000`); the path is then ignored on output.
    opaque: String,
    user: Option<UserInfo>,
    /// Decoded host (and `:port`).
    host: Vec<u8>,
    /// Decoded path.
    path: Vec<u8>,
    /// The escaped path as written, when it differs from the default escaping of `path`.
    raw_path: String,
    /// `scheme:/path` (no `//`): the empty authority is not written back.
    omit_host: bool,
    /// The URL ended in a lone `?`.
    force_query: bool,
    raw_query: String,
    fragment: Vec<u8>,
    raw_fragment: String,
}

#[derive(Debug)]
struct UserInfo {
    username: Vec<u8>,
    password: Option<Vec<u8>>,
}

impl GoUrl {
    /// Go's `url.Parse` (not `ParseRequestURI`): relative references are accepted.
    fn parse(raw: &str) -> Result<GoUrl, String> {
        let (before_fragment, fragment) = match raw.split_once('#') {
            Some((u, f)) => (u, f),
            None => (raw, ""),
        };
        let mut url = Self::parse_without_fragment(before_fragment)
            .map_err(|e| format!("parse {before_fragment:?}: {e}"))?;
        if !fragment.is_empty() {
            url.set_fragment(fragment)
                .map_err(|e| format!("parse {raw:?}: {e}"))?;
        }
        Ok(url)
    }

    fn parse_without_fragment(raw: &str) -> Result<GoUrl, String> {
        if raw.bytes().any(|b| b < 0x20 || b == 0x7f) {
            return Err("net/url: invalid control character in URL".to_string());
        }
        let mut url = GoUrl::default();
        if raw == "*" {
            url.path = b"*".to_vec();
            return Ok(url);
        }
        let (scheme, mut rest) = split_scheme(raw)?;
        url.scheme = scheme.to_ascii_lowercase();

        if rest.ends_with('?') && rest.matches('?').count() == 1 {
            url.force_query = true;
            rest = &rest[..rest.len() - 1];
        } else if let Some((before, query)) = rest.split_once('?') {
            url.raw_query = query.to_string();
            rest = before;
        }

        if !rest.starts_with('/') {
            if !url.scheme.is_empty() {
                // A rootless path after a scheme is opaque (RFC 3986).
                url.opaque = rest.to_string();
                return Ok(url);
            }
            let first_segment = rest.split('/').next().unwrap_or("");
            if first_segment.contains(':') {
                return Err("first path segment in URL cannot contain colon".to_string());
            }
        }

        if (!url.scheme.is_empty() || !rest.starts_with("///")) && rest.starts_with("//") {
            let authority_and_path = &rest[2..];
            let (authority, path) = match authority_and_path.find('/') {
                Some(i) => authority_and_path.split_at(i),
                None => (authority_and_path, ""),
            };
            let (user, host) = parse_authority(authority)?;
            url.user = user;
            url.host = host;
            rest = path;
        } else if !url.scheme.is_empty() && rest.starts_with('/') {
            url.omit_host = true;
        }
        url.set_path(rest)?;
        Ok(url)
    }

    /// Sets the decoded path from an escaped one, remembering the escaped form when it is not
    /// the default escaping (so `%2f` survives a round trip).
    fn set_path(&mut self, escaped: &str) -> Result<(), String> {
        let path = unescape(escaped, Mode::Path)?;
        self.raw_path = if escape(&path, Mode::Path) == escaped {
            String::new()
        } else {
            escaped.to_string()
        };
        self.path = path;
        Ok(())
    }

    fn set_fragment(&mut self, escaped: &str) -> Result<(), String> {
        let fragment = unescape(escaped, Mode::Fragment)?;
        self.raw_fragment = if escape(&fragment, Mode::Fragment) == escaped {
            String::new()
        } else {
            escaped.to_string()
        };
        self.fragment = fragment;
        Ok(())
    }

    /// The escaped path: the path as written when that is a valid escaping of it, else the
    /// default escaping.
    fn escaped_path(&self) -> String {
        if !self.raw_path.is_empty()
            && valid_encoded(&self.raw_path, Mode::Path)
            && unescape(&self.raw_path, Mode::Path).is_ok_and(|p| p == self.path)
        {
            return self.raw_path.clone();
        }
        if self.path == b"*" {
            return "*".to_string();
        }
        escape(&self.path, Mode::Path)
    }

    fn escaped_fragment(&self) -> String {
        if !self.raw_fragment.is_empty()
            && valid_encoded(&self.raw_fragment, Mode::Fragment)
            && unescape(&self.raw_fragment, Mode::Fragment).is_ok_and(|f| f == self.fragment)
        {
            return self.raw_fragment.clone();
        }
        escape(&self.fragment, Mode::Fragment)
    }
}

impl std::fmt::Display for GoUrl {
    /// Go's `URL.String`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut out = String::new();
        if !self.scheme.is_empty() {
            out.push_str(&self.scheme);
            out.push(':');
        }
        if !self.opaque.is_empty() {
            out.push_str(&self.opaque);
        } else {
            if !self.scheme.is_empty() || !self.host.is_empty() || self.user.is_some() {
                let omit = self.omit_host && self.host.is_empty() && self.user.is_none();
                if !omit {
                    if !self.host.is_empty() || !self.path.is_empty() || self.user.is_some() {
                        out.push_str("//");
                    }
                    if let Some(user) = &self.user {
                        out.push_str(&escape(&user.username, Mode::UserPassword));
                        if let Some(password) = &user.password {
                            out.push(':');
                            out.push_str(&escape(password, Mode::UserPassword));
                        }
                        out.push('@');
                    }
                    if !self.host.is_empty() {
                        out.push_str(&escape(&self.host, Mode::Host));
                    }
                }
            }
            let path = self.escaped_path();
            if !path.is_empty() && !path.starts_with('/') && !self.host.is_empty() {
                out.push('/');
            }
            if out.is_empty() {
                // A relative path whose first segment has a colon would read as a scheme.
                let first_segment = path.split('/').next().unwrap_or("");
                if first_segment.contains(':') {
                    out.push_str("./");
                }
            }
            out.push_str(&path);
        }
        if self.force_query || !self.raw_query.is_empty() {
            out.push('?');
            out.push_str(&self.raw_query);
        }
        if !self.fragment.is_empty() {
            out.push('#');
            out.push_str(&self.escaped_fragment());
        }
        f.write_str(&out)
    }
}

/// Splits a leading `scheme:` off (`[A-Za-z][A-Za-z0-9+.-]*:`). Anything else means "no scheme",
/// except a leading `:`, which Go rejects.
fn split_scheme(raw: &str) -> Result<(&str, &str), String> {
    for (i, c) in raw.bytes().enumerate() {
        match c {
            b'a'..=b'z' | b'A'..=b'Z' => {}
            b'0'..=b'9' | b'+' | b'-' | b'.' if i > 0 => {}
            b':' if i == 0 => return Err("missing protocol scheme".to_string()),
            b':' => return Ok((&raw[..i], &raw[i + 1..])),
            _ => return Ok(("", raw)),
        }
    }
    Ok(("", raw))
}

fn parse_authority(authority: &str) -> Result<(Option<UserInfo>, Vec<u8>), String> {
    let Some(at) = authority.rfind('@') else {
        return Ok((None, parse_host(authority)?));
    };
    let host = parse_host(&authority[at + 1..])?;
    let userinfo = &authority[..at];
    if !userinfo
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-._:~!$&'()*+,;=%@".contains(c))
    {
        return Err("net/url: invalid userinfo".to_string());
    }
    let user = match userinfo.split_once(':') {
        None => UserInfo {
            username: unescape(userinfo, Mode::UserPassword)?,
            password: None,
        },
        Some((name, password)) => UserInfo {
            username: unescape(name, Mode::UserPassword)?,
            password: Some(unescape(password, Mode::UserPassword)?),
        },
    };
    Ok((Some(user), host))
}

/// `host[:port]` or `[ipv6[%25zone]][:port]`, decoded. Ports must be digits.
fn parse_host(host: &str) -> Result<Vec<u8>, String> {
    if host.starts_with('[') {
        let close = host.rfind(']').ok_or("missing ']' in host")?;
        let colon_port = &host[close + 1..];
        if !valid_optional_port(colon_port) {
            return Err(format!("invalid port {colon_port:?} after host"));
        }
        if let Some(zone) = host[..close].find("%25") {
            let mut decoded = unescape(&host[..zone], Mode::Host)?;
            decoded.extend(unescape(&host[zone..close], Mode::Zone)?);
            decoded.extend(unescape(&host[close..], Mode::Host)?);
            return Ok(decoded);
        }
    } else if let Some(colon) = host.rfind(':') {
        let colon_port = &host[colon..];
        if !valid_optional_port(colon_port) {
            return Err(format!("invalid port {colon_port:?} after host"));
        }
    }
    unescape(host, Mode::Host)
}

/// `""` or `:` followed by digits only.
fn valid_optional_port(port: &str) -> bool {
    match port.strip_prefix(':') {
        None => port.is_empty(),
        Some(digits) => digits.bytes().all(|b| b.is_ascii_digit()),
    }
}

/// Which part of a URL a byte is escaped for (Go's `encoding` modes that `JoinPath` touches).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Path,
    Host,
    Zone,
    UserPassword,
    Fragment,
}

/// Whether byte `c` must be `%XX`-escaped in the given part (Go's `shouldEscape`).
fn should_escape(c: u8, mode: Mode) -> bool {
    if c.is_ascii_alphanumeric() {
        return false;
    }
    if matches!(mode, Mode::Host | Mode::Zone)
        && matches!(
            c,
            b'!' | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'['
                | b']'
                | b'<'
                | b'>'
                | b'"'
        )
    {
        return false;
    }
    match c {
        b'-' | b'_' | b'.' | b'~' => false,
        b'$' | b'&' | b'+' | b',' | b'/' | b':' | b';' | b'=' | b'?' | b'@' => match mode {
            Mode::Path => c == b'?',
            Mode::UserPassword => matches!(c, b'@' | b'/' | b'?' | b':'),
            Mode::Fragment => false,
            Mode::Host | Mode::Zone => true,
        },
        b'!' | b'(' | b')' | b'*' if mode == Mode::Fragment => false,
        _ => true,
    }
}

/// Whether `s` is already a valid escaped form for `mode`: no byte that would need escaping,
/// with RFC 3986 sub-delimiters, `:`, `@`, brackets and `%` allowed as they are.
fn valid_encoded(s: &str, mode: Mode) -> bool {
    s.bytes().all(|b| {
        matches!(
            b,
            b'!' | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
                | b'['
                | b']'
                | b'%'
        ) || !should_escape(b, mode)
    })
}

fn escape(bytes: &[u8], mode: Mode) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        if should_escape(b, mode) {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 15)]));
        } else {
            out.push(char::from(b));
        }
    }
    out
}

fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Decodes `%XX` escapes. Hosts may only escape non-ASCII bytes (and `%25`); zones may escape
/// anything a host could hold literally (and spaces); hosts and zones reject literal bytes that
/// would need escaping.
fn unescape(s: &str, mode: Mode) -> Result<Vec<u8>, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'%' {
            let escape_text = || {
                let end = (i + 3).min(bytes.len());
                format!(
                    "invalid URL escape {:?}",
                    String::from_utf8_lossy(&bytes[i..end])
                )
            };
            let (Some(hi), Some(lo)) = (
                bytes.get(i + 1).copied().and_then(hex_value),
                bytes.get(i + 2).copied().and_then(hex_value),
            ) else {
                return Err(escape_text());
            };
            let is_pct25 = &bytes[i..i + 3] == b"%25";
            let value = (hi << 4) | lo;
            if mode == Mode::Host && hi < 8 && !is_pct25 {
                return Err(escape_text());
            }
            if mode == Mode::Zone && !is_pct25 && value != b' ' && should_escape(value, Mode::Host)
            {
                return Err(escape_text());
            }
            out.push(value);
            i += 3;
        } else {
            if matches!(mode, Mode::Host | Mode::Zone) && c < 0x80 && should_escape(c, mode) {
                return Err(format!(
                    "invalid character {:?} in host name",
                    char::from(c).to_string()
                ));
            }
            out.push(c);
            i += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (base, elements, expected); `None` = an error is expected.
    type Case = (&'static str, &'static [&'static str], Option<&'static str>);

    const CASES: &[Case] = &[
        // The brief's and the spec's examples.
        ("http://gw/api", &["v1/x"], Some("http://gw/api/v1/x")),
        ("http://gw/", &["/v1/x"], Some("http://gw/v1/x")),
        (
            "http://gw:8000",
            &["/v1/completions"],
            Some("http://gw:8000/v1/completions"),
        ),
        (
            "http://gw/api/",
            &["/v1/completions"],
            Some("http://gw/api/v1/completions"),
        ),
        ("http://gw/api", &[""], Some("http://gw/api")),
        ("http://gw", &[""], Some("http://gw")),
        ("http://gw/", &[""], Some("http://gw/")),
        ("http://gw", &["v1//x"], Some("http://gw/v1/x")),
        (
            "http://gw/v1/",
            &["chat/completions/"],
            Some("http://gw/v1/chat/completions/"),
        ),
        ("http://gw/a/b", &["../../../x"], Some("http://gw/x")),
        ("http://gw/a/./b", &["./c/."], Some("http://gw/a/b/c")),
        // Query and fragment of the base survive; `?` and spaces in an endpoint are escaped.
        (
            "http://gw/api?key=1",
            &["v1"],
            Some("http://gw/api/v1?key=1"),
        ),
        ("http://gw/api#top", &["v1"], Some("http://gw/api/v1#top")),
        ("http://gw/api?", &["v1"], Some("http://gw/api/v1?")),
        ("http://gw", &["v1/x?y=1"], Some("http://gw/v1/x%3Fy=1")),
        ("http://gw", &["a b"], Some("http://gw/a%20b")),
        ("http://gw", &["caf\u{e9}"], Some("http://gw/caf%C3%A9")),
        ("http://gw", &["a:b@c;d=e"], Some("http://gw/a:b@c;d=e")),
        // Scheme lower-cased, host, port, user info and IPv6 literals kept.
        ("HTTP://gw", &["v1"], Some("http://gw/v1")),
        ("http://GW.example", &["v1"], Some("http://GW.example/v1")),
        ("http://u:p%40ss@gw", &["v1"], Some("http://u:p%40ss@gw/v1")),
        ("http://[::1]:8000", &["/v1"], Some("http://[::1]:8000/v1")),
        (
            "http://[fe80::1%25en0]/",
            &["v1"],
            Some("http://[fe80::1%25en0]/v1"),
        ),
        // Go's own JoinPath test table.
        (
            "https://go.googlesource.com",
            &["go"],
            Some("https://go.googlesource.com/go"),
        ),
        (
            "https://go.googlesource.com/a/b/c",
            &["../../../go"],
            Some("https://go.googlesource.com/go"),
        ),
        (
            "https://go.googlesource.com/",
            &["../go"],
            Some("https://go.googlesource.com/go"),
        ),
        (
            "https://go.googlesource.com",
            &["../go"],
            Some("https://go.googlesource.com/go"),
        ),
        (
            "https://go.googlesource.com",
            &["../go", "../../go", "../../../go"],
            Some("https://go.googlesource.com/go"),
        ),
        (
            "https://go.googlesource.com/../go",
            &[],
            Some("https://go.googlesource.com/go"),
        ),
        (
            "https://go.googlesource.com/",
            &["./go"],
            Some("https://go.googlesource.com/go"),
        ),
        (
            "https://go.googlesource.com//",
            &["/go"],
            Some("https://go.googlesource.com/go"),
        ),
        (
            "https://go.googlesource.com//",
            &["/go", "a", "b", "c"],
            Some("https://go.googlesource.com/go/a/b/c"),
        ),
        ("http://[fe80::1%en0]:8080/", &["/go"], None),
        (
            "https://go.googlesource.com",
            &["go/"],
            Some("https://go.googlesource.com/go/"),
        ),
        (
            "https://go.googlesource.com",
            &["go//"],
            Some("https://go.googlesource.com/go/"),
        ),
        (
            "https://go.googlesource.com",
            &[],
            Some("https://go.googlesource.com/"),
        ),
        (
            "https://go.googlesource.com/",
            &[],
            Some("https://go.googlesource.com/"),
        ),
        (
            "https://go.googlesource.com/a%2fb",
            &["c"],
            Some("https://go.googlesource.com/a%2fb/c"),
        ),
        (
            "https://go.googlesource.com/a%2fb",
            &["c%2fd"],
            Some("https://go.googlesource.com/a%2fb/c%2fd"),
        ),
        (
            "https://go.googlesource.com/a/b",
            &["/go"],
            Some("https://go.googlesource.com/a/b/go"),
        ),
        ("/", &[], Some("/")),
        ("a", &[], Some("a")),
        ("a", &["b"], Some("a/b")),
        ("a", &["../b"], Some("b")),
        ("a", &["../../b"], Some("b")),
        ("", &["a"], Some("a")),
        ("", &["../a"], Some("a")),
        // Relative and opaque bases behave as in Go (the send then fails on them).
        ("/api", &["v1"], Some("/api/v1")),
        (
            "localhost:8000",
            &["/v1/completions"],
            Some("localhost:8000"),
        ),
        ("http:/gw", &["v1"], Some("http:/gw/v1")),
        // Bases Go refuses to parse.
        (":foo", &["v1"], None),
        ("1http://gw", &["v1"], None),
        ("http://gw:port/", &["v1"], None),
        ("http://gw/%zz", &["v1"], None),
        ("http://gw/\n", &["v1"], None),
        ("http://g w/", &["v1"], None),
        ("http://%41:8080/", &["v1"], None),
        ("http://u^@gw/", &["v1"], None),
        ("http://[::1/", &["v1"], None),
        ("http://gw/#%zz", &["v1"], None),
        // The deliberate difference: Go would return the base unchanged here.
        ("http://gw/api", &["v1/%zz"], None),
    ];

    #[test]
    fn join_path_matches_go_table() {
        for (base, elems, expected) in CASES {
            let got = join_path(base, elems);
            match (expected, &got) {
                (Some(want), Ok(have)) => {
                    assert_eq!(have, want, "join_path({base:?}, {elems:?})");
                }
                (None, Err(_)) => {}
                _ => panic!("join_path({base:?}, {elems:?}) = {got:?}, want {expected:?}"),
            }
        }
    }

    #[test]
    fn join_url_is_join_path_with_one_element() {
        assert_eq!(
            join_url("http://gw:8000", "/v1/completions")
                .ok()
                .as_deref(),
            Some("http://gw:8000/v1/completions")
        );
        let err = join_url("http://gw:port", "/v1")
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref().is_some_and(|e| e.contains("invalid port")),
            "{err:?}"
        );
    }

    #[test]
    fn clean_follows_go_path_clean() {
        for (input, want) in [
            ("", "."),
            ("/", "/"),
            ("a/../..", ".."),
            ("/../a", "/a"),
            ("a//b/./c/", "a/b/c"),
            ("../../x", "../../x"),
            ("/a/b/../../..", "/"),
        ] {
            assert_eq!(clean(input), want, "clean({input:?})");
        }
    }

    #[test]
    fn validate_base_url_wants_http_and_a_host() {
        assert!(validate_base_url("http://gw:8000").is_ok());
        assert!(validate_base_url("https://gw/api").is_ok());
        assert!(validate_base_url("localhost:8000").is_err());
        assert!(validate_base_url("/api").is_err());
        assert!(validate_base_url("ftp://gw").is_err());
        assert!(validate_base_url("http://gw:x").is_err());
    }
}
