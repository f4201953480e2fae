//! Password redaction: every message that may echo a Redis URL passes through here, so no
//! error, log line or `Debug` output shows a password. Text enters, the same text with each
//! URL's password (and password-like query parameters) replaced by `***` leaves.

/// Query parameters whose values are treated as secrets.
const SECRET_PARAMS: [&str; 5] = ["password", "pass", "pwd", "auth", "token"];

/// A URL with its password (and any password-like query parameter) replaced by `***`.
///
/// `redis://user:secret@host:6379/0` → `redis://user:***@host:6379/0`. A userinfo without a
/// colon is a user name and is kept. Works on anything, URL or not: it never fails.
pub fn redact_url(url: &str) -> String {
    let authority_start = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[authority_start..];
    let authority_len = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_len];
    let mut out = String::with_capacity(url.len());
    out.push_str(&url[..authority_start]);
    match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            match userinfo.find(':') {
                Some(colon) => {
                    out.push_str(&userinfo[..colon]);
                    out.push_str(":***");
                }
                None => out.push_str(userinfo),
            }
            out.push_str(&authority[at..]);
        }
        None => out.push_str(authority),
    }
    let tail = &rest[authority_len..];
    match tail.find('?') {
        Some(q) => {
            out.push_str(&tail[..=q]);
            let query_and_fragment = &tail[q + 1..];
            let (query, fragment) = match query_and_fragment.find('#') {
                Some(h) => query_and_fragment.split_at(h),
                None => (query_and_fragment, ""),
            };
            let redacted: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, _))
                        if SECRET_PARAMS.contains(&key.to_ascii_lowercase().as_str()) =>
                    {
                        format!("{key}=***")
                    }
                    _ => pair.to_owned(),
                })
                .collect();
            out.push_str(&redacted.join("&"));
            out.push_str(fragment);
        }
        None => out.push_str(tail),
    }
    out
}

/// Free text with every `scheme://…` URL in it passed through [`redact_url`].
///
/// A URL ends at whitespace, a quote, a backtick, a comma, a closing bracket or `>`; that covers
/// URLs inside JSON strings and inside parser messages.
pub fn redact_in_text(text: &str) -> String {
    let is_scheme_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.');
    let is_end = |c: char| {
        c.is_whitespace() || matches!(c, '"' | '\'' | '`' | ',' | ')' | ']' | '}' | '>' | '\\')
    };
    let mut out = String::with_capacity(text.len());
    let mut done = 0;
    let mut search_from = 0;
    while let Some(found) = text[search_from..].find("://") {
        let sep = search_from + found;
        let start = text[..sep]
            .char_indices()
            .rev()
            .take_while(|&(_, c)| is_scheme_char(c))
            .last()
            .map_or(sep, |(i, _)| i);
        let after = sep + 3;
        let end = text[after..].find(is_end).map_or(text.len(), |i| after + i);
        if start < done {
            // Part of a URL already copied; move on.
            search_from = after;
            continue;
        }
        out.push_str(&text[done..start]);
        out.push_str(&redact_url(&text[start..end]));
        done = end;
        search_from = end.max(after);
    }
    out.push_str(&text[done..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_url_hides_the_password_only() {
        assert_eq!(
            redact_url("redis://user:s3cret@host:6379/0"),
            "redis://user:***@host:6379/0"
        );
        assert_eq!(redact_url("rediss://:s3cret@host"), "rediss://:***@host");
        assert_eq!(redact_url("redis://host:6379"), "redis://host:6379");
        assert_eq!(redact_url("redis://alice@host"), "redis://alice@host");
        assert_eq!(
            redact_url("unix://:pw@/var/run/redis.sock?db=1"),
            "unix://:***@/var/run/redis.sock?db=1"
        );
        assert_eq!(
            redact_url("redis://h/0?password=s3cret&db=2#x"),
            "redis://h/0?password=***&db=2#x"
        );
        assert_eq!(redact_url("u:p@host:1"), "u:***@host:1");
        assert_eq!(redact_url(""), "");
    }

    #[test]
    fn redact_in_text_finds_urls_in_json_and_messages() {
        let text = r#"{"url":"redis://u:topsecret@r:6379","x":"http://a:b@c/d"}"#;
        let red = redact_in_text(text);
        assert!(!red.contains("topsecret"), "{red}");
        assert!(red.contains("redis://u:***@r:6379"), "{red}");
        assert!(red.contains("http://a:***@c/d"), "{red}");
        let msg = "invalid type: string \"redis://:pw1@h\", expected u32";
        assert_eq!(
            redact_in_text(msg),
            "invalid type: string \"redis://:***@h\", expected u32"
        );
        assert_eq!(redact_in_text("no urls here"), "no urls here");
    }
}
