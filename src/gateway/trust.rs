//! Whether inferq trusts a TLS gateway's certificate, decided as Go's `crypto/x509` decides it.
//!
//! The certificate a gateway presents enters a [`ServerCertVerifier`] during the handshake; a
//! verdict leaves. [`GoVerifier`] has webpki check the chain to the bundled Mozilla roots or the
//! `--tls-ca-cert` certificates, as before, and adds Go's one short cut: a presented certificate
//! that is itself one of the `--tls-ca-cert` certificates is trusted as it stands (Go's `Verify`
//! answers with a chain of that one certificate when the root pool holds it), once its validity
//! dates, its names and its extended key usage fit. That is the gateway started with a
//! certificate from `openssl req -x509`, which is marked as a CA: webpki refuses it as an end
//! entity (`CaUsedAsEndEntity`), so without the short cut every request failed where the Go
//! processor given the same `--tls-ca-cert` succeeds.
//!
//! [`AnyCertificate`] is `--tls-insecure-skip-verify`: any certificate is accepted, but the
//! handshake's signatures are still checked against the key it carries, as Go checks them.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_name, WebPkiServerVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, DigitallySignedStruct, Error, SignatureScheme};

use super::leaf::LeafFacts;

/// webpki's verdict, and Go's short cut for a listed certificate served as it is.
#[derive(Debug)]
pub(crate) struct GoVerifier {
    webpki: Arc<WebPkiServerVerifier>,
    /// The `--tls-ca-cert` certificates.
    listed: Vec<CertificateDer<'static>>,
}

impl GoVerifier {
    pub(crate) fn new(
        webpki: Arc<WebPkiServerVerifier>,
        listed: Vec<CertificateDer<'static>>,
    ) -> GoVerifier {
        GoVerifier { webpki, listed }
    }
}

impl ServerCertVerifier for GoVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let refused = match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Ok(verified) => return Ok(verified),
            Err(refused) => refused,
        };
        if !self
            .listed
            .iter()
            .any(|listed| listed.as_ref() == end_entity.as_ref())
        {
            return Err(refused);
        }
        trust_as_listed(end_entity, server_name, now)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// Go's checks of a certificate its root pool holds, when it is the one served: valid now, made
/// for the name dialled, and not limited to usages other than a TLS server's.
fn trust_as_listed(
    end_entity: &CertificateDer<'_>,
    server_name: &ServerName<'_>,
    now: UnixTime,
) -> Result<(), Error> {
    let facts = LeafFacts::read(end_entity.as_ref())
        .ok_or(Error::InvalidCertificate(CertificateError::BadEncoding))?;
    let now = now.as_secs();
    if now < facts.not_before {
        return Err(Error::InvalidCertificate(CertificateError::NotValidYet));
    }
    if now > facts.not_after {
        return Err(Error::InvalidCertificate(CertificateError::Expired));
    }
    if !facts.serves_tls {
        return Err(Error::InvalidCertificate(CertificateError::InvalidPurpose));
    }
    verify_server_name(&ParsedCertificate::try_from(end_entity)?, server_name)
}

/// `--tls-insecure-skip-verify`: every certificate, with the handshake signed by its key.
#[derive(Debug)]
pub(crate) struct AnyCertificate {
    algorithms: WebPkiSupportedAlgorithms,
}

impl AnyCertificate {
    pub(crate) fn new(algorithms: WebPkiSupportedAlgorithms) -> AnyCertificate {
        AnyCertificate { algorithms }
    }
}

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::leaf::tests::{der, CLIENT_ONLY_PEM, SELF_SIGNED_PEM};
    use rustls::RootCertStore;

    /// A verifier whose `--tls-ca-cert` lists `listed`, as [`crate::gateway::GatewayTls`] builds it.
    fn verifier(listed: &[&str]) -> GoVerifier {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        let listed: Vec<_> = listed.iter().map(|pem| der(pem)).collect();
        for cert in &listed {
            if let Err(e) = roots.add(cert.clone()) {
                panic!("root: {e}");
            }
        }
        match WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider).build() {
            Ok(webpki) => GoVerifier::new(webpki, listed),
            Err(e) => panic!("verifier: {e}"),
        }
    }

    fn name(text: &str) -> ServerName<'static> {
        match ServerName::try_from(text.to_owned()) {
            Ok(name) => name,
            Err(e) => panic!("{text}: {e}"),
        }
    }

    /// 2027-01-01, inside the test certificates' validity.
    const IN_2027: u64 = 1_798_761_600;

    fn check(verifier: &GoVerifier, pem: &str, host: &str, at: u64) -> Result<(), Error> {
        verifier
            .verify_server_cert(
                &der(pem),
                &[],
                &name(host),
                &[],
                UnixTime::since_unix_epoch(std::time::Duration::from_secs(at)),
            )
            .map(|_| ())
    }

    fn refusal(result: Result<(), Error>) -> CertificateError {
        match result {
            Err(Error::InvalidCertificate(e)) => e,
            other => panic!("expected a certificate error, got {other:?}"),
        }
    }

    #[test]
    fn a_listed_self_signed_ca_served_as_the_leaf_is_trusted_as_go_trusts_it() {
        let listed = verifier(&[SELF_SIGNED_PEM]);
        for host in ["127.0.0.1", "localhost"] {
            if let Err(e) = check(&listed, SELF_SIGNED_PEM, host, IN_2027) {
                panic!("{host}: {e}");
            }
        }
        // webpki alone refuses it, though it is a root: the case the short cut exists for.
        let alone = listed.webpki.verify_server_cert(
            &der(SELF_SIGNED_PEM),
            &[],
            &name("127.0.0.1"),
            &[],
            UnixTime::since_unix_epoch(std::time::Duration::from_secs(IN_2027)),
        );
        assert!(alone.is_err());
    }

    #[test]
    fn the_short_cut_still_checks_name_dates_usage_and_listing() {
        let listed = verifier(&[SELF_SIGNED_PEM, CLIENT_ONLY_PEM]);
        assert!(matches!(
            refusal(check(&listed, SELF_SIGNED_PEM, "gateway.example", IN_2027)),
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }
        ));
        // Valid from 2026-11-29 20:56:33 to 2126-11-05 20:56:33 UTC.
        assert_eq!(
            refusal(check(&listed, SELF_SIGNED_PEM, "127.0.0.1", 1_795_985_792)),
            CertificateError::NotValidYet
        );
        assert_eq!(
            refusal(check(&listed, SELF_SIGNED_PEM, "127.0.0.1", 4_949_585_794)),
            CertificateError::Expired
        );
        assert_eq!(
            refusal(check(&listed, CLIENT_ONLY_PEM, "127.0.0.1", IN_2027)),
            CertificateError::InvalidPurpose
        );
        // Not listed: webpki's refusal stands.
        let other = verifier(&[CLIENT_ONLY_PEM]);
        assert!(check(&other, SELF_SIGNED_PEM, "127.0.0.1", IN_2027).is_err());
    }
}
