//! Test certificates for TLS Redis and Sentinel fixtures, made with the `openssl` command line in
//! a temporary directory (removed on drop).
//!
//! Nothing enters but the choice of names; out come file paths to hand to `redis-server`
//! (`--tls-cert-file` …) and PEM bytes for a client ([`TestCerts::redis_certificates`]).
//!
//! ```text
//! TestCerts::new() -> Result<TestCerts, TestkitError>
//! certs.ca_cert()     -> PathBuf   // ca.crt: the private CA every certificate below is signed by
//! certs.node_cert()   -> PathBuf   // node.crt: for 127.0.0.1 / localhost, serverAuth + clientAuth
//! certs.node_key()    -> PathBuf   //   (nodes and sentinels use it both to serve and to connect)
//! certs.client_cert() -> PathBuf   // client.crt / client.key: clientAuth, for mutual TLS
//! certs.client_key()  -> PathBuf
//! certs.redis_certificates(with_client_cert) -> Result<redis::TlsCertificates, TestkitError>
//! certs.node_files() -> TlsFiles  // { ca_cert, cert, key }: what a TLS node or sentinel serves
//! TlsFiles::server_args(tls_port) -> Vec<String>  // --tls-port … --tls-auth-clients optional
//! ```

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::TestkitError;

/// The files a TLS node or sentinel is started with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca_cert: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TlsFiles {
    /// `redis-server` arguments serving TLS on `tls_port` (next to the plain port) with these
    /// files, client certificates optional (checked against the CA when presented), and
    /// replication over TLS.
    pub fn server_args(&self, tls_port: u16) -> Vec<String> {
        vec![
            "--tls-port".into(),
            tls_port.to_string(),
            "--tls-cert-file".into(),
            self.cert.display().to_string(),
            "--tls-key-file".into(),
            self.key.display().to_string(),
            "--tls-ca-cert-file".into(),
            self.ca_cert.display().to_string(),
            "--tls-auth-clients".into(),
            "optional".into(),
            "--tls-replication".into(),
            "yes".into(),
        ]
    }
}

/// A private CA and the certificates it signed, in a temporary directory.
#[derive(Debug)]
pub struct TestCerts {
    dir: tempfile::TempDir,
}

impl TestCerts {
    /// Makes the CA, the node certificate and the client certificate (EC P-256, valid 2 days).
    pub fn new() -> Result<TestCerts, TestkitError> {
        let dir = tempfile::Builder::new().prefix("inferq-certs-").tempdir()?;
        let certs = TestCerts { dir };
        certs.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=inferq testkit CA",
        ])?;
        certs.signed(
            "node",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
        )?;
        certs.signed("client", "extendedKeyUsage=clientAuth\n")?;
        Ok(certs)
    }

    /// The directory holding every file.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn ca_cert(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    pub fn node_cert(&self) -> PathBuf {
        self.dir.path().join("node.crt")
    }

    pub fn node_key(&self) -> PathBuf {
        self.dir.path().join("node.key")
    }

    pub fn client_cert(&self) -> PathBuf {
        self.dir.path().join("client.crt")
    }

    pub fn client_key(&self) -> PathBuf {
        self.dir.path().join("client.key")
    }

    /// The CA and the node certificate and key, for TLS nodes and sentinels.
    pub fn node_files(&self) -> TlsFiles {
        TlsFiles {
            ca_cert: self.ca_cert(),
            cert: self.node_cert(),
            key: self.node_key(),
        }
    }

    /// What a redis-rs client needs to trust the nodes (the CA) and, when `with_client_cert`,
    /// to present the client certificate.
    pub fn redis_certificates(
        &self,
        with_client_cert: bool,
    ) -> Result<redis::TlsCertificates, TestkitError> {
        let client_tls = if with_client_cert {
            Some(redis::ClientTlsConfig {
                client_cert: std::fs::read(self.client_cert())?,
                client_key: std::fs::read(self.client_key())?,
            })
        } else {
            None
        };
        Ok(redis::TlsCertificates {
            client_tls,
            root_cert: Some(std::fs::read(self.ca_cert())?),
        })
    }

    /// `name.key` and `name.crt` signed by the CA, with `extensions` (an `-extfile`).
    fn signed(&self, name: &str, extensions: &str) -> Result<(), TestkitError> {
        let ext = format!("{name}.ext");
        std::fs::write(self.dir.path().join(&ext), extensions)?;
        let (key, csr, crt) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
        );
        let subject = format!("/CN=inferq testkit {name}");
        self.openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &subject,
        ])?;
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
            "-extfile",
            &ext,
        ])
    }

    fn openssl(&self, args: &[&str]) -> Result<(), TestkitError> {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .output()
            .map_err(|e| TestkitError::Openssl {
                args: args.join(" "),
                output: format!("cannot run openssl (install Debian's openssl): {e}"),
            })?;
        if out.status.success() {
            return Ok(());
        }
        Err(TestkitError::Openssl {
            args: args.join(" "),
            output: format!(
                "{}: {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn makes_a_ca_and_certificates_it_signed() {
        let certs = TestCerts::new().unwrap();
        for path in [
            certs.ca_cert(),
            certs.node_cert(),
            certs.node_key(),
            certs.client_cert(),
            certs.client_key(),
        ] {
            assert!(path.is_file(), "{}", path.display());
        }
        let out = Command::new("openssl")
            .arg("verify")
            .arg("-CAfile")
            .arg(certs.ca_cert())
            .arg(certs.node_cert())
            .arg(certs.client_cert())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let tls = certs.redis_certificates(true).unwrap();
        assert!(tls.client_tls.is_some() && tls.root_cert.is_some());
    }
}
