//! TLS for the API (`sluice serve --tls-cert FILE --tls-key FILE`): the
//! certificate chain and its private key come from PEM files, as certbot,
//! cert-manager and most CAs write them, and are read again when either
//! file changes, so a renewed certificate is served without a restart.
//!
//! - **Start** refuses files that cannot be served (unreadable, no
//!   certificate, a key that does not fit the certificate) with an error
//!   that names the file.
//! - **Reload** checks both files' metadata every [`RELOAD_CHECK`] (through
//!   symlinks, so a Kubernetes secret's swapped `..data` link counts as a
//!   change). A change that does not load (a half-written file, a key of
//!   another certificate) is logged and the certificate served before
//!   stays; the next change is tried again. Connections already open keep
//!   the certificate they were opened with.
//! - **Handshakes** are bounded by the server's header-read timeout (see
//!   [`super::server`]): a client that connects and never finishes its
//!   handshake is closed as one that never sends a request is.
//!
//! rustls on ring does the TLS; this module only loads and swaps keys.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls;
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;

/// How often the files are checked for a change.
pub const RELOAD_CHECK: Duration = Duration::from_secs(2);

/// Where the API's certificate chain and private key are.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// PEM: the server's certificate first, then any intermediates.
    pub cert: PathBuf,
    /// PEM: the private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Why the API's certificate could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or holds no PEM of the kind wanted.
    #[error("reading the {what} from {}: {source}", path.display())]
    Read {
        /// "certificate chain" or "private key".
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: rustls_pki_types::pem::Error,
    },
    /// The certificate file holds no certificate.
    #[error("{} holds no PEM certificate", .0.display())]
    NoCertificate(PathBuf),
    /// The key cannot sign, or is not the certificate's.
    #[error("the private key in {} does not serve the certificate in {}: {source}", key.display(), cert.display())]
    Key {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls's reason.
        source: rustls::Error,
    },
    /// rustls refused the configuration.
    #[error("configuring TLS: {0}")]
    Config(#[source] rustls::Error),
}

/// The API's TLS: an acceptor whose certificate follows its files.
#[derive(Clone)]
pub struct Tls {
    acceptor: tokio_rustls::TlsAcceptor,
    serving: Arc<Serving>,
    files: TlsFiles,
}

impl Tls {
    /// Loads `files`, or says why they cannot be served.
    pub fn load(files: TlsFiles) -> Result<Tls, TlsError> {
        let serving = Arc::new(Serving { current: RwLock::new(Arc::new(load(&files)?)) });
        let provider = Arc::new(provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Config)?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(&serving) as Arc<dyn ResolvesServerCert>);
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls { acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)), serving, files })
    }

    /// The acceptor for new connections.
    pub(crate) fn acceptor(&self) -> &tokio_rustls::TlsAcceptor {
        &self.acceptor
    }

    /// Checks the files every [`RELOAD_CHECK`] and serves what they hold
    /// when they change, for as long as the runtime runs.
    pub(crate) fn spawn_reloader(&self) {
        let (serving, files) = (Arc::clone(&self.serving), self.files.clone());
        tokio::spawn(async move {
            let mut seen = Stamp::of(&files);
            loop {
                tokio::time::sleep(RELOAD_CHECK).await;
                let now = Stamp::of(&files);
                if now == seen {
                    continue;
                }
                seen = now;
                match load(&files) {
                    Ok(key) => {
                        *serving.current.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(key);
                        tracing::info!(cert = %files.cert.display(), "serving the API's renewed certificate");
                    }
                    Err(e) => tracing::warn!(
                        "the API's certificate files changed but cannot be served ({e}); still serving the previous certificate"
                    ),
                }
            }
        });
    }
}

/// The certificate handed to every new handshake.
#[derive(Debug)]
struct Serving {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for Serving {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.current.read().unwrap_or_else(|poisoned| poisoned.into_inner())))
    }
}

/// rustls on ring, as the CLI's client (ureq) uses: aws-lc-rs, rustls's
/// other provider and the one with post-quantum key exchange, would add a
/// C library build of minutes to every fresh build. (rustls 0.23.48
/// deprecated ring's provider for that lack.)
#[allow(deprecated)]
fn provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// Reads and checks the chain and key of `files`.
fn load(files: &TlsFiles) -> Result<CertifiedKey, TlsError> {
    let read = |what, path: &Path, source| TlsError::Read { what, path: path.to_owned(), source };
    let chain = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| read("certificate chain", &files.cert, e))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate(files.cert.clone()));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| read("private key", &files.key, e))?;
    CertifiedKey::from_der(chain, key, &provider()).map_err(|source| TlsError::Key {
        cert: files.cert.clone(),
        key: files.key.clone(),
        source,
    })
}

/// What tells a file changed: its modification time, size and inode.
#[derive(Debug, PartialEq, Eq)]
struct Stamp([Option<(SystemTime, u64, u64)>; 2]);

impl Stamp {
    fn of(files: &TlsFiles) -> Stamp {
        use std::os::unix::fs::MetadataExt as _;
        let one = |path: &Path| {
            let meta = std::fs::metadata(path).ok()?;
            Some((meta.modified().ok()?, meta.len(), meta.ino()))
        };
        Stamp([one(&files.cert), one(&files.key)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &Path, cert: &str, key: &str) -> TlsFiles {
        let (cert_path, key_path) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&cert_path, cert).expect("write the certificate");
        std::fs::write(&key_path, key).expect("write the key");
        TlsFiles { cert: cert_path, key: key_path }
    }

    #[test]
    fn files_that_cannot_be_served_are_refused_naming_the_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let missing = TlsFiles { cert: dir.path().join("none.pem"), key: dir.path().join("none.key") };
        let error = Tls::load(missing).err().expect("a missing file is refused").to_string();
        assert!(error.contains("certificate chain") && error.contains("none.pem"), "{error}");

        let empty = files(dir.path(), "not a certificate\n", "");
        let error = Tls::load(empty).err().expect("no certificate is refused").to_string();
        assert!(error.contains("holds no PEM certificate"), "{error}");
    }
}
