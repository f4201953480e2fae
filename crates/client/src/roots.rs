//! The certificate authorities inferq trusts when it checks a server's certificate by default:
//! the gateway's (`--tls-ca-cert` adds to them), a `rediss://` Redis's without
//! `--redis-tls-ca-cert`, and an `https://` OTLP collector's without
//! `OTEL_EXPORTER_OTLP_CERTIFICATE`.
//!
//! They are the machine's system certificate store, as Go's `crypto/x509` trusts it, **plus** the
//! Mozilla roots bundled in the binary (`webpki-root-certs`). On Linux the store is found as Go
//! finds it ([`StorePaths`]): one bundle file, the one `SSL_CERT_FILE` names or else the first of
//! the distributions' bundles that exists (on Debian `/etc/ssl/certs/ca-certificates.crt`), and
//! the directories `SSL_CERT_DIR` names (colon-separated) or else the distributions' directories
//! (`/etc/ssl/certs`, where `update-ca-certificates` puts a private CA, and
//! `/etc/pki/tls/certs`). Each variable replaces only its own half: with `SSL_CERT_FILE` alone the
//! certificate directories are still read, as in Go. `rustls-native-certs` reads the files. The
//! bundled roots go further than Go: an image without a system store still reaches servers with
//! public certificates, where Go trusts nothing.
//!
//! The store is read once per process, on first use ([`Roots::system`]). Reading it never stops
//! inferq: a file or certificate in it that cannot be read or used is skipped with one warning,
//! and a store that cannot be read at all (or a machine without one) leaves the bundled roots.
//!
//! Out: a rustls [`RootCertStore`] (the gateway, the OTLP exporter), the certificates themselves
//! and the same set as one PEM bundle (redis-rs takes its roots only as PEM).

use std::collections::HashSet;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use base64::Engine as _;
use rustls::pki_types::{CertificateDer, TrustAnchor};
use rustls::RootCertStore;
use rustls_native_certs::CertificateResult;

/// A set of trusted roots: the usable certificates of a system store, then the bundled Mozilla
/// roots that are not already among them.
#[derive(Debug)]
pub struct Roots {
    /// Every trusted certificate, those of the system store first (`certs[..system]`): redis-rs
    /// and reqwest take roots as certificates, and Go's short cut for a trusted certificate
    /// served as it is compares them (`gateway::trust`).
    certs: Vec<CertificateDer<'static>>,
    /// How many of `certs` came from the system store.
    system: usize,
    /// `certs` as webpki trust anchors, parsed once.
    store: RootCertStore,
    /// `certs` as one PEM bundle, made on first use (only `rediss://` needs it).
    pem: OnceLock<Vec<u8>>,
}

impl Roots {
    /// The process's roots: the system store, read on the first call, plus the bundled roots.
    pub fn system() -> &'static Roots {
        static ROOTS: OnceLock<Roots> = OnceLock::new();
        ROOTS.get_or_init(|| {
            let roots = Roots::with_store(StoreSource::of_this_process().load());
            if roots.system > 0 {
                tracing::debug!(
                    system = roots.system,
                    bundled = roots.certs.len() - roots.system,
                    "trusting the system certificate store and the bundled Mozilla roots"
                );
            }
            roots
        })
    }

    /// The roots a process would have whose `SSL_CERT_FILE` is `file` and `SSL_CERT_DIR` is
    /// `dir` (neither: the bundled roots alone). For tests: [`Roots::system`] reads the
    /// environment, which is the whole process's.
    pub fn from_paths(file: Option<&Path>, dir: Option<&Path>) -> Roots {
        Roots::with_store(rustls_native_certs::load_certs_from_paths(file, dir))
    }

    /// The roots of the store at `paths`, then the bundled roots.
    pub fn from_store(paths: &StorePaths) -> Roots {
        Roots::with_store(paths.load())
    }

    /// The certificates `found` in a store, those webpki can use as roots, then the bundled
    /// roots. What could not be read or used is logged (once: each store is read once).
    fn with_store(found: CertificateResult) -> Roots {
        let mut store = RootCertStore::empty();
        let mut certs = Vec::new();
        let mut seen = HashSet::new();
        let mut unusable = 0usize;
        for cert in found.certs {
            if !seen.insert(cert.as_ref().to_vec()) {
                continue;
            }
            match store.add(cert.clone()) {
                Ok(()) => certs.push(cert),
                Err(e) => {
                    unusable += 1;
                    tracing::debug!(error = %e, "a system certificate is not usable as a root");
                }
            }
        }
        let system = certs.len();
        for e in &found.errors {
            tracing::debug!(error = %e, "reading the system certificate store");
        }
        if unusable > 0 {
            tracing::warn!(
                skipped = unusable,
                "certificates of the system store that are not usable as roots are not trusted"
            );
        }
        match (found.errors.first(), system) {
            (Some(first), 0) => tracing::warn!(
                error = %first,
                "cannot read the system certificate store; trusting the bundled Mozilla roots only"
            ),
            (Some(first), _) => tracing::warn!(
                errors = found.errors.len(),
                first = %first,
                "part of the system certificate store cannot be read; what can be read is trusted"
            ),
            (None, 0) => tracing::info!(
                "the system certificate store is empty; trusting the bundled Mozilla roots only"
            ),
            (None, _) => {}
        }
        for cert in webpki_root_certs::TLS_SERVER_ROOT_CERTS {
            if seen.insert(cert.as_ref().to_vec()) && store.add(cert.clone()).is_ok() {
                certs.push(cert.clone());
            }
        }
        Roots {
            certs,
            system,
            store,
            pem: OnceLock::new(),
        }
    }

    /// The trusted roots as rustls takes them.
    pub fn store(&self) -> &RootCertStore {
        &self.store
    }

    /// The trusted roots as trust anchors (tonic takes them so).
    pub fn anchors(&self) -> impl Iterator<Item = TrustAnchor<'static>> + '_ {
        self.store.roots.iter().cloned()
    }

    /// Every trusted certificate (DER).
    pub fn certs(&self) -> &[CertificateDer<'static>] {
        &self.certs
    }

    /// The certificates that came from the system store (DER).
    pub fn system_certs(&self) -> &[CertificateDer<'static>] {
        &self.certs[..self.system]
    }

    /// Every trusted certificate as one PEM bundle.
    pub fn pem(&self) -> &[u8] {
        self.pem.get_or_init(|| pem_bundle(&self.certs))
    }
}

/// Where the system certificate store is: at most one bundle file and any number of
/// directories of certificate files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorePaths {
    /// The bundle file of the store, if one exists.
    pub file: Option<PathBuf>,
    /// Its directories of certificate files.
    pub dirs: Vec<PathBuf>,
}

/// The bundle files Go's `crypto/x509` looks for on Linux, in its order (Debian and Ubuntu,
/// Fedora and RHEL 6, openSUSE, OpenELEC, CentOS and RHEL 7, Alpine).
const BUNDLE_FILES: [&str; 6] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/tls/cacert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// The certificate directories Go's `crypto/x509` reads on Linux.
const CERT_DIRS: [&str; 2] = ["/etc/ssl/certs", "/etc/pki/tls/certs"];

/// Where a process's store comes from.
enum StoreSource {
    Paths(StorePaths),
    /// The platform's own store, through `rustls-native-certs` (not Linux).
    Native,
}

impl StoreSource {
    /// This process's store: on Linux as Go finds it (see the module comment), elsewhere as
    /// `rustls-native-certs` does.
    fn of_this_process() -> StoreSource {
        if cfg!(target_os = "linux") {
            let file = std::env::var_os("SSL_CERT_FILE");
            let dir = std::env::var_os("SSL_CERT_DIR");
            StoreSource::Paths(StorePaths::as_go_finds_them(
                file.as_deref(),
                dir.as_deref(),
                &BUNDLE_FILES.map(Path::new),
                &CERT_DIRS.map(Path::new),
            ))
        } else {
            StoreSource::Native
        }
    }

    fn load(&self) -> CertificateResult {
        match self {
            StoreSource::Paths(paths) => paths.load(),
            StoreSource::Native => rustls_native_certs::load_native_certs(),
        }
    }
}

impl StorePaths {
    /// The store Go reads when `SSL_CERT_FILE` is `file` and `SSL_CERT_DIR` is `dir` (an empty
    /// value counts as unset): that file, or else the first of `bundles` that exists; the
    /// directories `dir` lists, or else those of `dirs` that exist.
    pub fn as_go_finds_them(
        file: Option<&OsStr>,
        dir: Option<&OsStr>,
        bundles: &[&Path],
        dirs: &[&Path],
    ) -> StorePaths {
        let file = match file.filter(|f| !f.is_empty()) {
            Some(file) => Some(PathBuf::from(file)),
            None => bundles
                .iter()
                .find(|f| f.is_file())
                .map(|f| f.to_path_buf()),
        };
        let dirs = match dir.filter(|d| !d.is_empty()) {
            Some(listed) => std::env::split_paths(listed)
                .filter(|d| !d.as_os_str().is_empty())
                .collect(),
            None => dirs
                .iter()
                .filter(|d| d.is_dir())
                .map(|d| d.to_path_buf())
                .collect(),
        };
        StorePaths { file, dirs }
    }

    /// The certificates of the file and of each directory.
    fn load(&self) -> CertificateResult {
        let mut dirs = self.dirs.iter();
        // One call for the file and the first directory, which on Debian holds the file: the
        // crate reads a file it has read once only once.
        let mut found = rustls_native_certs::load_certs_from_paths(
            self.file.as_deref(),
            dirs.next().map(PathBuf::as_path),
        );
        for dir in dirs {
            let more = rustls_native_certs::load_certs_from_paths(None, Some(dir));
            found.certs.extend(more.certs);
            found.errors.extend(more.errors);
        }
        found
    }
}

/// `certs` as `CERTIFICATE` PEM blocks, 64 base64 characters a line.
fn pem_bundle(certs: &[CertificateDer<'_>]) -> Vec<u8> {
    let mut out = String::new();
    for cert in certs {
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        let text = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
        for (i, c) in text.chars().enumerate() {
            if i > 0 && i % 64 == 0 {
                out.push('\n');
            }
            out.push(c);
        }
        out.push_str("\n-----END CERTIFICATE-----\n");
    }
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferq_testkit::certs::{temp_file, TEST_CA_PEM, TEST_CLIENT_CERT_PEM};
    use rustls::pki_types::pem::PemObject;

    fn der(pem: &str) -> CertificateDer<'static> {
        match CertificateDer::from_pem_slice(pem.as_bytes()) {
            Ok(der) => der,
            Err(e) => panic!("test certificate: {e}"),
        }
    }

    fn tempdir() -> tempfile::TempDir {
        match tempfile::tempdir() {
            Ok(dir) => dir,
            Err(e) => panic!("tempdir: {e}"),
        }
    }

    fn bundled() -> usize {
        Roots::from_paths(None, None).certs().len()
    }

    #[test]
    fn a_store_file_adds_its_cas_to_the_bundled_roots() {
        let dir = tempdir();
        let file = temp_file(
            &dir,
            "bundle.pem",
            &format!("{TEST_CA_PEM}some text between\n{TEST_CLIENT_CERT_PEM}"),
        );
        let roots = Roots::from_paths(Some(&file), None);
        assert_eq!(
            roots.system_certs(),
            [der(TEST_CA_PEM), der(TEST_CLIENT_CERT_PEM)].as_slice()
        );
        assert!(bundled() > 100, "the Mozilla roots are bundled");
        assert_eq!(roots.certs().len(), 2 + bundled());
        assert_eq!(roots.store().len(), roots.certs().len());
        assert_eq!(roots.anchors().count(), roots.certs().len());
    }

    #[test]
    fn a_store_directory_is_read_as_ssl_cert_dir_names_it() {
        let dir = tempdir();
        temp_file(&dir, "one.pem", TEST_CA_PEM);
        temp_file(&dir, "two.crt", TEST_CLIENT_CERT_PEM);
        let roots = Roots::from_paths(None, Some(dir.path()));
        assert_eq!(roots.system_certs().len(), 2);
        assert!(roots.system_certs().contains(&der(TEST_CLIENT_CERT_PEM)));
    }

    /// Each variable replaces only its own half of the store, as in Go: `SSL_CERT_FILE` the
    /// bundle file (the first distribution bundle that exists otherwise), `SSL_CERT_DIR` the
    /// directories (a colon-separated list; the distribution directories that exist otherwise).
    #[test]
    fn the_store_is_found_as_go_finds_it() {
        let machine = tempdir();
        let bundle = temp_file(&machine, "bundle.pem", TEST_CA_PEM);
        let certs = machine.path().join("certs");
        assert!(std::fs::create_dir(&certs).is_ok());
        let absent = machine.path().join("absent");
        let bundles = [absent.join("a.pem"), bundle.clone()];
        let bundles = [bundles[0].as_path(), bundles[1].as_path()];
        let dirs = [absent.as_path(), certs.as_path()];
        let find = |file: Option<&str>, dir: Option<&str>| {
            StorePaths::as_go_finds_them(file.map(OsStr::new), dir.map(OsStr::new), &bundles, &dirs)
        };
        let machine_store = StorePaths {
            file: Some(bundle.clone()),
            dirs: vec![certs.clone()],
        };
        assert_eq!(find(None, None), machine_store);
        assert_eq!(
            find(Some(""), Some("")),
            machine_store,
            "empty counts as unset"
        );
        assert_eq!(
            find(Some("/my/ca.pem"), None),
            StorePaths {
                file: Some(PathBuf::from("/my/ca.pem")),
                dirs: vec![certs.clone()],
            }
        );
        assert_eq!(
            find(None, Some("/one:/two::")),
            StorePaths {
                file: Some(bundle.clone()),
                dirs: vec![PathBuf::from("/one"), PathBuf::from("/two")],
            }
        );
        assert_eq!(
            StorePaths::as_go_finds_them(None, None, &[absent.as_path()], &[absent.as_path()]),
            StorePaths {
                file: None,
                dirs: Vec::new(),
            },
            "a machine without a store"
        );
    }

    /// With `SSL_CERT_FILE` naming a private bundle, a CA installed in the certificate
    /// directory (as `update-ca-certificates` installs one) stays trusted, as in Go.
    #[test]
    fn ssl_cert_file_alone_keeps_the_certificate_directories() {
        let machine = tempdir();
        let certs = machine.path().join("certs");
        assert!(std::fs::create_dir(&certs).is_ok());
        temp_file(&machine, "certs/installed.pem", TEST_CLIENT_CERT_PEM);
        let private = temp_file(&machine, "private.pem", TEST_CA_PEM);
        let paths = StorePaths::as_go_finds_them(
            Some(private.as_os_str()),
            None,
            &[],
            &[certs.as_path(), machine.path().join("absent").as_path()],
        );
        let roots = Roots::from_store(&paths);
        assert_eq!(roots.system_certs().len(), 2);
        assert!(roots.system_certs().contains(&der(TEST_CA_PEM)));
        assert!(roots.system_certs().contains(&der(TEST_CLIENT_CERT_PEM)));
    }

    #[test]
    fn what_cannot_be_read_or_used_is_skipped_without_failing() {
        let dir = tempdir();
        let broken = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let file = temp_file(&dir, "mixed.pem", &format!("{broken}{TEST_CA_PEM}"));
        let roots = Roots::from_paths(Some(&file), None);
        assert_eq!(roots.system_certs(), [der(TEST_CA_PEM)].as_slice());

        // A store that cannot be read at all: the bundled roots alone.
        let missing = dir.path().join("missing.pem");
        let roots = Roots::from_paths(Some(&missing), Some(&dir.path().join("no-such-dir")));
        assert!(roots.system_certs().is_empty());
        assert_eq!(roots.certs().len(), bundled());
    }

    #[test]
    fn a_bundled_root_in_the_store_is_trusted_once() {
        let dir = tempdir();
        let mozilla = match webpki_root_certs::TLS_SERVER_ROOT_CERTS.first() {
            Some(cert) => cert.clone(),
            None => panic!("no bundled roots"),
        };
        let file = temp_file(
            &dir,
            "bundle.pem",
            &String::from_utf8_lossy(&pem_bundle(&[mozilla])),
        );
        let roots = Roots::from_paths(Some(&file), None);
        assert_eq!(roots.system_certs().len(), 1);
        assert_eq!(roots.certs().len(), bundled());
    }

    /// The PEM bundle holds exactly the trusted certificates, and redis-rs takes it whole (it
    /// refuses a bundle if any one certificate is not a usable root).
    #[test]
    fn the_pem_bundle_is_the_same_set_and_redis_takes_it() {
        let dir = tempdir();
        let file = temp_file(&dir, "bundle.pem", TEST_CA_PEM);
        let roots = Roots::from_paths(Some(&file), None);
        let parsed = CertificateDer::pem_slice_iter(roots.pem()).collect::<Result<Vec<_>, _>>();
        match parsed {
            Ok(parsed) => assert_eq!(parsed, roots.certs()),
            Err(e) => panic!("the bundle does not parse: {e}"),
        }
        let built = redis::Client::build_with_tls(
            "rediss://127.0.0.1:1/",
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(roots.pem().to_vec()),
            },
        );
        assert!(built.is_ok(), "{built:?}");
    }
}
