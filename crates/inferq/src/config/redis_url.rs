//! The Redis `url` of the transport config, read as Go's go-redis `ParseURL` reads it: a
//! `redis://` / `rediss://` URL (host, port, database in the path) or a `unix://` socket path.
//! [`check_redis_url`] refuses what go-redis refuses and rewrites what go-redis and redis-rs read
//! differently, so a Go deployment's URL reaches the same Redis database:
//!
//! - `?db=N` selects the database in go-redis (over the path); redis-rs ignores it on TCP and
//!   would silently use database 0, so it is moved into the path.
//! - go-redis's connection-tuning options (`pool_size`, `dial_timeout`, ...) are accepted and
//!   ignored with a warning: inferq has its own connection settings.
//! - any other option is refused, as go-redis refuses it (`redis: unexpected option`).
//! - a `unix://user:password@/path/to/socket` URL (go-redis's form) is given to redis-rs as
//!   `unix:///path/to/socket?user=…&pass=…`, the only form it reads credentials from.

use super::redact_url;

/// go-redis `ParseURL` options that tune its connection pool and timeouts; inferq ignores them.
const GO_TUNING_OPTIONS: [&str; 29] = [
    "client_name",
    "max_retries",
    "min_retry_backoff",
    "max_retry_backoff",
    "dial_timeout",
    "read_timeout",
    "write_timeout",
    "pool_fifo",
    "pool_size",
    "pool_timeout",
    "min_idle_conns",
    "max_idle_conns",
    "max_active_conns",
    "max_concurrent_dials",
    "conn_max_idle_time",
    "conn_max_lifetime",
    "conn_max_lifetime_jitter",
    "idle_timeout",
    "idle_check_frequency",
    "max_conn_age",
    "disableIdentity",
    "identitySuffix",
    "unstable_resp3",
    "failing_timeout_seconds",
    "pipeline_pool_size",
    "pipeline_read_buffer_size",
    "pipeline_write_buffer_size",
    "context_timeout_enabled",
    "read_buffer_size",
];

/// Checks a Redis URL and returns it as inferq will use it (`?db=N` moved into the path; a
/// `unix://` URL in redis-rs's form), with warnings (naming `field`, the setting the URL came
/// from) for the go-redis options it ignores. The error is the reason, for the caller to attach
/// to `field`.
pub fn check_redis_url(
    url: &str,
    field: &str,
    warnings: &mut Vec<String>,
) -> Result<String, String> {
    let shown = redact_url(url);
    let Some(sep) = url.find("://") else {
        return Err(format!(
            "{shown:?} is not a URL; use redis://host:port, rediss://host:port or unix:///path/to/socket"
        ));
    };
    let scheme = url[..sep].to_ascii_lowercase();
    if !matches!(scheme.as_str(), "redis" | "rediss" | "unix") {
        return Err(format!(
            "scheme must be redis://, rediss://, or unix://, got {scheme}:// in {shown:?}"
        ));
    }
    if scheme == "unix" {
        return unix_url(&url[sep + 3..], &shown, field, warnings);
    }
    let mut parsed =
        reqwest::Url::parse(url).map_err(|e| format!("cannot parse {shown:?}: {e}"))?;
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(format!("{shown:?} names no host"));
    }
    if scheme == "rediss" && parsed.fragment() == Some("insecure") {
        return Err(format!(
            "{shown:?}: #insecure (accept any server certificate) is not supported; trust the \
             server's CA with --redis-tls-ca-cert instead"
        ));
    }
    let path_db = parsed.path().trim_matches('/').to_owned();
    if !path_db.is_empty() && path_db.parse::<u32>().is_err() {
        return Err(format!(
            "{shown:?}: the path must be a database number, got {:?}",
            parsed.path()
        ));
    }
    let options = read_options(parsed.query_pairs(), &scheme, &shown, field, warnings)?;
    if parsed.query().is_none() {
        return Ok(url.to_owned());
    }
    if let Some(db) = options.db {
        parsed.set_path(&format!("/{db}"));
    }
    if options.kept.is_empty() {
        parsed.set_query(None);
    } else {
        parsed.query_pairs_mut().clear().extend_pairs(options.kept);
    }
    Ok(parsed.to_string())
}

/// What a URL's query asks for, once read as go-redis reads it.
struct Options {
    /// `db=N`.
    db: Option<u32>,
    /// Options passed on to redis-rs as they are (`protocol`).
    kept: Vec<(String, String)>,
    /// redis-rs's own spellings of a unix socket's credentials (`user=`, `pass=`).
    user: Option<String>,
    pass: Option<String>,
}

/// Reads the options of a URL's query: `db` and `protocol`, go-redis's connection settings
/// (ignored with a warning), and on a unix socket redis-rs's `user` and `pass`; anything else
/// is refused, as go-redis refuses it.
fn read_options<'a>(
    pairs: impl Iterator<Item = (std::borrow::Cow<'a, str>, std::borrow::Cow<'a, str>)>,
    scheme: &str,
    shown: &str,
    field: &str,
    warnings: &mut Vec<String>,
) -> Result<Options, String> {
    let mut options = Options {
        db: None,
        kept: Vec::new(),
        user: None,
        pass: None,
    };
    let mut ignored: Vec<String> = Vec::new();
    let mut unexpected: Vec<String> = Vec::new();
    for (key, value) in pairs {
        match key.as_ref() {
            "db" => {
                let db = value.parse::<u32>().map_err(|_| {
                    format!("{shown:?}: db must be a database number, got {value:?}")
                })?;
                options.db = Some(db);
            }
            "protocol" => options.kept.push((key.into_owned(), value.into_owned())),
            "user" if scheme == "unix" => options.user = Some(value.into_owned()),
            "pass" if scheme == "unix" => options.pass = Some(value.into_owned()),
            "skip_verify" if scheme == "rediss" => {
                if matches!(value.as_ref(), "1" | "t" | "T" | "TRUE" | "true" | "True") {
                    return Err(format!(
                        "{shown:?}: skip_verify (accept any server certificate) is not \
                         supported; trust the server's CA with --redis-tls-ca-cert instead"
                    ));
                }
                ignored.push(key.into_owned());
            }
            k if GO_TUNING_OPTIONS.contains(&k) => ignored.push(key.into_owned()),
            _ => unexpected.push(key.into_owned()),
        }
    }
    if !unexpected.is_empty() {
        return Err(format!(
            "{shown:?}: unexpected option {} (go-redis refuses it too; the options are db, \
             protocol and go-redis's connection settings)",
            unexpected.join(", ")
        ));
    }
    if !ignored.is_empty() {
        warnings.push(format!(
            "{field}: ignoring the go-redis connection option {} of {shown}: inferq has its own \
             connection settings",
            ignored.join(", ")
        ));
    }
    Ok(options)
}

/// A `unix://` URL as go-redis reads it, `unix://[user:password@]/path/to/socket[?db=N&…]`,
/// rewritten as redis-rs reads one (`unix:///path?db=N&user=…&pass=…`), which takes no
/// credentials before the path. `rest` is what follows `unix://`.
fn unix_url(
    rest: &str,
    shown: &str,
    field: &str,
    warnings: &mut Vec<String>,
) -> Result<String, String> {
    let rest = rest.split_once('#').map_or(rest, |(before, _)| before);
    let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (userinfo, path) = match before_query.rsplit_once('@') {
        Some((userinfo, path)) => (Some(userinfo), path),
        None => (None, before_query),
    };
    if !path.starts_with('/') || path.trim_matches('/').is_empty() {
        return Err(format!("{shown:?} names no socket path"));
    }
    let mut options = read_options(
        url::form_urlencoded::parse(query.as_bytes()),
        "unix",
        shown,
        field,
        warnings,
    )?;
    if let Some(userinfo) = userinfo {
        let (user, pass) = match userinfo.split_once(':') {
            Some((user, pass)) => (user, Some(pass)),
            None => (userinfo, None),
        };
        let both = |what: &str| {
            format!("{shown:?} names the {what} twice, before the path and as an option")
        };
        if !user.is_empty() {
            if options.user.is_some() {
                return Err(both("user"));
            }
            options.user = Some(percent_decode(user));
        }
        if let Some(pass) = pass {
            if options.pass.is_some() {
                return Err(both("password"));
            }
            options.pass = Some(percent_decode(pass));
        }
    }
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    if let Some(db) = options.db {
        query.append_pair("db", &db.to_string());
    }
    if let Some(user) = &options.user {
        query.append_pair("user", user);
    }
    if let Some(pass) = &options.pass {
        query.append_pair("pass", pass);
    }
    query.extend_pairs(&options.kept);
    let query = query.finish();
    Ok(if query.is_empty() {
        format!("unix://{path}")
    } else {
        format!("unix://{path}?{query}")
    })
}

/// `%XX` escapes of a URL's user or password decoded (a `+` stays a `+`, as in a URL's
/// userinfo).
fn percent_decode(text: &str) -> String {
    let escaped = text.replace('+', "%2B").replace('&', "%26");
    url::form_urlencoded::parse(format!("v={escaped}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(url: &str) -> (Result<String, String>, Vec<String>) {
        let mut warnings = Vec::new();
        (check_redis_url(url, "url", &mut warnings), warnings)
    }

    #[test]
    fn go_redis_db_option_selects_the_database() {
        assert_eq!(check("redis://h:1?db=3").0.as_deref(), Ok("redis://h:1/3"));
        // go-redis: the option wins over the path.
        assert_eq!(
            check("redis://h:1/2?db=3").0.as_deref(),
            Ok("redis://h:1/3")
        );
        assert_eq!(
            check("rediss://u:p@h:1/?db=4&protocol=3").0.as_deref(),
            Ok("rediss://u:p@h:1/4?protocol=3")
        );
        assert_eq!(check("redis://h:1/5").0.as_deref(), Ok("redis://h:1/5"));
        assert!(check("redis://h?db=x")
            .0
            .is_err_and(|e| e.contains("db must be a database number")));
    }

    #[test]
    fn other_options_are_ignored_or_refused_as_go_redis_does() {
        let (url, warnings) = check("redis://:pw@h?pool_size=10&dial_timeout=5s");
        assert_eq!(url.as_deref(), Ok("redis://:pw@h"));
        assert_eq!(warnings.len(), 1);
        assert!(
            warnings[0].contains("pool_size, dial_timeout"),
            "{warnings:?}"
        );
        assert!(!warnings[0].contains("pw"), "{warnings:?}");
        let (url, _) = check("redis://:pw@h?foo=1&pool_size=2");
        let err = url.unwrap_err();
        assert!(err.contains("unexpected option foo"), "{err}");
        assert!(!err.contains(":pw@"), "{err}");
        assert!(check("redis://h?skip_verify=true").0.is_err());
        assert!(check("rediss://h?skip_verify=true")
            .0
            .is_err_and(|e| e.contains("skip_verify")));
        assert_eq!(
            check("rediss://h?skip_verify=false").0.as_deref(),
            Ok("rediss://h")
        );
    }

    #[test]
    fn a_url_without_a_host_is_refused() {
        assert!(check("redis://")
            .0
            .is_err_and(|e| e.contains("names no host")));
        // The parser itself refuses credentials without a host.
        let (url, _) = check("redis://:pw@/0");
        assert!(url.is_err_and(|e| !e.contains(":pw@")));
    }

    /// go-redis's unix URL, credentials before the path, becomes redis-rs's, with them as
    /// options; escapes are decoded once and re-encoded for the query.
    #[test]
    fn go_redis_unix_urls_keep_their_credentials_and_database() {
        assert_eq!(
            check("unix://:pw@/var/run/redis.sock").0.as_deref(),
            Ok("unix:///var/run/redis.sock?pass=pw")
        );
        assert_eq!(
            check("unix://app:p%40ss+1@/run/r.sock?db=2&pool_size=3")
                .0
                .as_deref(),
            Ok("unix:///run/r.sock?db=2&user=app&pass=p%40ss%2B1")
        );
        assert_eq!(
            check("unix:///run/r.sock?pass=pw&db=1").0.as_deref(),
            Ok("unix:///run/r.sock?db=1&pass=pw")
        );
        assert_eq!(
            check("unix:///run/r.sock").0.as_deref(),
            Ok("unix:///run/r.sock")
        );
        let refused = |url: &str| check(url).0.unwrap_err();
        assert!(refused("unix://:pw@").contains("names no socket path"));
        assert!(refused("unix:///r.sock?password=pw").contains("unexpected option password"));
        assert!(refused("unix://:a@/r.sock?pass=b").contains("password twice"));
        assert!(!refused("unix://:secret@/r.sock?x=1").contains("secret"));
    }
}
