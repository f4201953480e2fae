//! Opening Redis connections: a [`client`] for a URL plus optional TLS files (private CA, client
//! certificate), a self-healing multiplexed connection for the moves, and a separate connection
//! without a response timeout for blocking pops (`BRPOP`, `BLMOVE`), and [`refusal`], which
//! finds out why a server turns new connections away (`maxclients` reached).

use std::path::PathBuf;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, ConnectionAddr, IntoConnectionInfo, RedisResult};
#[cfg(feature = "tls")]
use redis::{ClientTlsConfig, TlsCertificates};

#[cfg(feature = "tls")]
use crate::roots::Roots;

/// How long one command may take before it counts as failed (the caller retries).
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(3);

/// A multiplexed connection that reconnects by itself after Redis restarts or blips.
pub async fn manager(client: &Client) -> RedisResult<ConnectionManager> {
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_secs(1));
    client.get_connection_manager_with_config(config).await
}

/// A connection for blocking commands: no response timeout (the command's own timeout rules).
pub async fn blocking(client: &Client) -> RedisResult<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_response_timeout(None)
        .set_connection_timeout(Some(Duration::from_secs(2)));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

/// How long [`refusal`] waits for a server's first words on a new connection.
const GREETING_WAIT: Duration = Duration::from_millis(500);

/// Why Redis turns new connections away, when it says so: a server at `maxclients` (or one in
/// protected mode) writes an error (`ERR max number of clients reached`) to each new
/// connection and closes it before reading anything, so a client sending its first command sees
/// only a reset or a broken pipe. Asked after `e`, an error that lost or could not make a
/// connection, this opens a connection of its own, sends nothing and reads what the server
/// says first. `None` when `e` is of another kind, the server says nothing (a normal server
/// waits for a command), or the connection is TLS (the error would come after the handshake).
pub async fn refusal(client: &Client, e: &redis::RedisError) -> Option<String> {
    if !(e.is_io_error() || e.is_connection_dropped())
        || e.is_connection_refusal()
        || e.is_timeout()
    {
        return None;
    }
    let first = async {
        let mut buf = [0u8; 256];
        let n = match client.get_connection_info().addr() {
            ConnectionAddr::Tcp(host, port) => {
                let mut s = tokio::net::TcpStream::connect((host.as_str(), *port))
                    .await
                    .ok()?;
                tokio::io::AsyncReadExt::read(&mut s, &mut buf).await.ok()?
            }
            #[cfg(unix)]
            ConnectionAddr::Unix(path) => {
                let mut s = tokio::net::UnixStream::connect(path).await.ok()?;
                tokio::io::AsyncReadExt::read(&mut s, &mut buf).await.ok()?
            }
            _ => return None,
        };
        greeting_error(&buf[..n])
    };
    tokio::time::timeout(GREETING_WAIT, first)
        .await
        .ok()
        .flatten()
}

/// The error line a server wrote unasked (`-ERR max number of clients reached\r\n`).
fn greeting_error(bytes: &[u8]) -> Option<String> {
    let line = bytes.strip_prefix(b"-")?;
    let end = line
        .iter()
        .position(|b| *b == b'\r' || *b == b'\n')
        .unwrap_or(line.len());
    let text = String::from_utf8_lossy(&line[..end]).trim().to_owned();
    (!text.is_empty()).then_some(text)
}

/// `e`, followed by why the server refuses new connections when it says so (see [`refusal`]).
pub async fn explained(client: &Client, e: &redis::RedisError) -> String {
    match refusal(client, e).await {
        Some(why) => format!("{e} (Redis refuses new connections: {why})"),
        None => e.to_string(),
    }
}

/// TLS material for a `rediss://` connection beyond the URL: a private CA to trust instead of the
/// default roots (the system store plus the bundled Mozilla roots), and a client certificate for
/// servers that require one (`tls-auth-clients yes`). Paths enter; [`client`] reads them when it
/// builds the client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// CA bundle (PEM) that signed the server's certificate. When set, only these roots are
    /// trusted for Redis (a private CA usually is the only one that matters); when not, the
    /// system store and the bundled Mozilla roots are.
    pub ca_cert: Option<PathBuf>,
    /// Client certificate chain and private key (PEM), for mutual TLS.
    pub client: Option<(PathBuf, PathBuf)>,
}

impl RedisTls {
    /// Whether any file was given.
    pub fn is_configured(&self) -> bool {
        self.ca_cert.is_some() || self.client.is_some()
    }
}

/// Why a Redis client could not be built. No variant ever holds a password: URLs are redacted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL does not parse as a Redis URL.
    #[error("url {shown}: {reason}")]
    Url {
        /// The URL without its password.
        shown: String,
        /// Why it does not parse.
        reason: String,
    },
    /// TLS files were given for a URL that is not `rediss://`.
    #[error("url {shown}: TLS certificates were given, but the URL is not rediss://")]
    NotTls {
        /// The URL without its password.
        shown: String,
    },
    /// `#insecure` asks to accept any server certificate; inferq does not build that in.
    #[error(
        "url {shown}: #insecure (accept any server certificate) is not supported; trust the \
         server's CA with --redis-tls-ca-cert instead"
    )]
    Insecure {
        /// The URL without its password.
        shown: String,
    },
    /// A certificate or key file could not be read.
    #[error("{flag} {path}: {source}")]
    Read {
        /// The flag that named the file.
        flag: &'static str,
        /// The file.
        path: String,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// The files were read but do not make a TLS configuration.
    #[error("TLS certificates for Redis: {0}")]
    Tls(String),
}

/// A Redis client for `url` with the TLS material in `tls`. Nothing is connected yet.
///
/// A TLS URL (`rediss://`, `valkeys://`) trusts the `--redis-tls-ca-cert` CA alone when one is
/// given, as the flag promises; otherwise the process's default roots ([`Roots::system`]: the
/// system certificate store plus the bundled Mozilla roots), as go-redis trusts the system pool.
pub fn client(url: &str, tls: &RedisTls) -> Result<Client, ConnectError> {
    let shown = || crate::redact::redact_url(url);
    let info = url.into_connection_info().map_err(|e| ConnectError::Url {
        shown: shown(),
        reason: crate::redact::redact_in_text(&e.to_string()),
    })?;
    match info.addr() {
        ConnectionAddr::TcpTls { insecure: true, .. } => {
            return Err(ConnectError::Insecure { shown: shown() })
        }
        ConnectionAddr::TcpTls { .. } => {}
        _ => {
            if tls.is_configured() {
                return Err(ConnectError::NotTls { shown: shown() });
            }
            return Client::open(info).map_err(|e| ConnectError::Url {
                shown: shown(),
                reason: crate::redact::redact_in_text(&e.to_string()),
            });
        }
    }
    #[cfg(feature = "tls")]
    return Client::build_with_tls(info, certificates(tls)?)
        .map_err(|e| ConnectError::Tls(crate::redact::redact_in_text(&e.to_string())));
    #[cfg(not(feature = "tls"))]
    Err(ConnectError::Tls(
        "this build of inferq-client has no TLS support (its `tls` feature is off)".to_owned(),
    ))
}

#[cfg(feature = "tls")]
/// The TLS material of [`client`] for a TLS client: `--redis-tls-ca-cert`'s CA alone when one
/// is given, otherwise the default roots, and the client certificate when one is given.
fn certificates(tls: &RedisTls) -> Result<TlsCertificates, ConnectError> {
    let read = |flag: &'static str, path: &PathBuf| {
        std::fs::read(path).map_err(|source| ConnectError::Read {
            flag,
            path: path.display().to_string(),
            source,
        })
    };
    let root_cert = match &tls.ca_cert {
        Some(path) => read("--redis-tls-ca-cert", path)?,
        None => Roots::system().pem().to_vec(),
    };
    let client_tls = match &tls.client {
        Some((cert, key)) => Some(ClientTlsConfig {
            client_cert: read("--redis-tls-cert", cert)?,
            client_key: read("--redis-tls-key", key)?,
        }),
        None => None,
    };
    Ok(TlsCertificates {
        client_tls,
        root_cert: Some(root_cert),
    })
}

/// The TLS material a cluster client needs beside its seed URLs: `None` unless `client` (built
/// by [`client`]) speaks TLS.
#[cfg(feature = "tls")]
pub fn tls_certificates(
    client: &Client,
    tls: &RedisTls,
) -> Result<Option<TlsCertificates>, ConnectError> {
    match client.get_connection_info().addr() {
        ConnectionAddr::TcpTls { .. } => Ok(Some(certificates(tls)?)),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_greeting_error_is_read_up_to_its_line_end() {
        assert_eq!(
            greeting_error(b"-ERR max number of clients reached\r\n").as_deref(),
            Some("ERR max number of clients reached")
        );
        assert_eq!(greeting_error(b"+PONG\r\n"), None);
        assert_eq!(greeting_error(b""), None);
    }

    /// A server at `maxclients` is named as such; one that takes connections says nothing.
    #[tokio::test]
    async fn a_server_at_maxclients_is_named() {
        let server = inferq_testkit::RedisServer::start().expect("redis-server");
        let client = server.client().expect("client");
        let dropped =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(refusal(&client, &dropped).await, None);
        let mut admin = server.connection().await.expect("connect");
        inferq_testkit::config_set(&mut admin, "maxclients", 1)
            .await
            .expect("config set");
        assert_eq!(
            refusal(&client, &dropped).await.as_deref(),
            Some("ERR max number of clients reached")
        );
    }

    #[test]
    fn client_errors_name_the_problem_without_the_password() {
        let ca = RedisTls {
            ca_cert: Some(PathBuf::from("/no/such/ca.pem")),
            client: None,
        };
        let e = client("redis://u:pw1@h:1", &ca).unwrap_err().to_string();
        assert_eq!(
            e,
            "url redis://u:***@h:1: TLS certificates were given, but the URL is not rediss://"
        );
        let e = client("rediss://u:pw1@h:1", &ca).unwrap_err().to_string();
        assert!(
            e.starts_with("--redis-tls-ca-cert /no/such/ca.pem: "),
            "{e}"
        );
        let e = client("rediss://u:pw1@h:1/#insecure", &RedisTls::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("#insecure") && !e.contains("pw1"), "{e}");
        let e = client("redis://u:pw1@h:1/x", &RedisTls::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("url redis://u:***@h:1/x: ") && !e.contains("pw1"),
            "{e}"
        );
        assert!(client("rediss://u:pw1@h:1/", &RedisTls::default()).is_ok());
    }
}
