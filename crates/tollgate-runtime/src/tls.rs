//! TLS on the listeners (rustls; TLS 1.2 and 1.3): a certificate chain and key from PEM
//! files, mutual TLS when a client CA is given (a client without a certificate that
//! chains to it is refused in the handshake), optionally a name the client
//! certificate must carry. The files are read again when they change (a Kubernetes
//! secret is a swapped symlink): the next connection gets the new certificate, open
//! ones keep theirs; a change that does not load keeps the old configuration and says
//! why.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
};
use serde::Deserialize;

use crate::tls_refusals::{Reason, Refusals};

/// A listener's `tls:` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerTls {
    /// The certificate chain (PEM), the server's first.
    pub cert_file: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// CA certificates (PEM): when given, every client must present a certificate
    /// that chains to one of them (mutual TLS).
    pub client_ca_file: Option<PathBuf>,
    /// With `client_ca_file`: a DNS name the client certificate must also carry
    /// (envoyproxy/ratelimit's `GRPC_CLIENT_TLS_SAN`).
    pub client_san: Option<String>,
    /// More certificates on the same listener: each is served to a client that asks
    /// (SNI) for one of the DNS names it carries (`*.example.com` included); the
    /// first `cert_file` goes to every other client.
    #[serde(default)]
    pub certificates: Vec<SniCertificate>,
}

/// A certificate chosen by the name a client asks for (SNI).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SniCertificate {
    /// The certificate chain (PEM).
    pub cert_file: PathBuf,
    /// Its private key (PEM).
    pub key_file: PathBuf,
}

/// How often the files are looked at for a change.
const WATCH_EVERY: Duration = Duration::from_secs(2);

/// ALPN of an HTTP listener that speaks both versions, HTTP/2 preferred.
pub const HTTP_ALPN: &[&[u8]] = &[b"h2", b"http/1.1"];

/// A listener's TLS configuration, swapped whole when its files change.
#[derive(Clone)]
pub struct ServerTls {
    current: Arc<ArcSwap<Loaded>>,
    source: Arc<Source>,
    refusals: Arc<Refusals>,
}

/// What accepts one connection on a TLS listener: the configuration in force when
/// it came, and where a refused handshake is counted.
pub struct Acceptor {
    /// The configuration in force.
    pub tls: tokio_rustls::TlsAcceptor,
    refusals: Arc<Refusals>,
    source: Arc<Source>,
}

impl Acceptor {
    /// Counts and (rate-bounded) logs a handshake from `peer` that failed.
    pub fn refused(&self, peer: SocketAddr, reason: Reason, detail: &str) {
        (self.refusals).refused(&self.source.setting, peer, reason, detail);
    }
}

/// Where a configuration comes from: the files, the setting that names them, ALPN.
struct Source {
    files: ListenerTls,
    setting: String,
    alpn: Vec<Vec<u8>>,
}

/// What one reading of the files gave.
struct Loaded {
    config: Arc<ServerConfig>,
    /// The files' bytes, to tell a change.
    files: Vec<Vec<u8>>,
    /// The end of validity of the certificate that expires first, and its file.
    not_after: SystemTime,
    earliest: PathBuf,
}

impl ServerTls {
    /// Reads `tls`'s files for the listener `setting` (as the config names it, e.g.
    /// `listen.grpc_tls`), offering `alpn` (e.g. `h2`): an error names the setting
    /// and the file. An expired certificate, or one that expires within 14 days, is
    /// a warning with its date.
    pub fn load(tls: &ListenerTls, setting: &str, alpn: &[&[u8]]) -> anyhow::Result<ServerTls> {
        let loaded = load(tls, setting, alpn)?;
        warn_expiry(setting, &loaded.earliest, loaded.not_after);
        Ok(ServerTls {
            current: Arc::new(ArcSwap::from_pointee(loaded)),
            source: Arc::new(Source {
                files: tls.clone(),
                setting: setting.into(),
                alpn: alpn.iter().map(|a| a.to_vec()).collect(),
            }),
            refusals: Arc::default(),
        })
    }

    /// The acceptor of the configuration in force.
    pub fn acceptor(&self) -> Acceptor {
        Acceptor {
            tls: tokio_rustls::TlsAcceptor::from(self.current.load().config.clone()),
            refusals: self.refusals.clone(),
            source: self.source.clone(),
        }
    }

    /// The handshakes it refused.
    pub fn refusals(&self) -> Arc<Refusals> {
        self.refusals.clone()
    }

    /// The end of validity of its certificate that expires first.
    pub fn not_after(&self) -> SystemTime {
        self.current.load().not_after
    }

    /// Looks at the files every 2 s until the process ends, and loads them again when
    /// their bytes change.
    pub fn watch(&self) {
        let (current, source) = (self.current.clone(), self.source.clone());
        tokio::spawn(async move {
            let (tls, setting) = (&source.files, &source.setting);
            let alpn: Vec<&[u8]> = source.alpn.iter().map(Vec::as_slice).collect();
            let mut failed: Option<String> = None;
            loop {
                tokio::time::sleep(WATCH_EVERY).await;
                let files = read_all(tls);
                if files.as_ref().ok() == Some(&current.load().files) {
                    continue;
                }
                match files.and_then(|_| load(tls, setting, &alpn)) {
                    Ok(loaded) => {
                        tracing::info!(
                            listener = %setting,
                            cert_file = %tls.cert_file.display(),
                            not_after = %httpdate::fmt_http_date(loaded.not_after),
                            "tls: the certificate files changed: new connections get the new ones"
                        );
                        warn_expiry(setting, &loaded.earliest, loaded.not_after);
                        current.store(Arc::new(loaded));
                        failed = None;
                    }
                    Err(e) => {
                        // Once per distinct failure: a half-written secret is retried.
                        let why = format!("{e:#}");
                        if failed.as_deref() != Some(&why) {
                            tracing::error!(
                                listener = %setting,
                                error = %why,
                                "tls: the changed certificate files do not load: keeping the ones in force"
                            );
                            failed = Some(why);
                        }
                    }
                }
            }
        });
    }
}

/// The files' bytes: cert, key, client CA.
fn read_all(tls: &ListenerTls) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut files = vec![
        std::fs::read(&tls.cert_file)?,
        std::fs::read(&tls.key_file)?,
    ];
    if let Some(ca) = &tls.client_ca_file {
        files.push(std::fs::read(ca)?);
    }
    for c in &tls.certificates {
        files.push(std::fs::read(&c.cert_file)?);
        files.push(std::fs::read(&c.key_file)?);
    }
    Ok(files)
}

/// Reads a PEM file for `setting.key`, naming both when it cannot be read.
fn read_pem(setting: &str, key: &str, path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path)
        .with_context(|| format!("{setting}.{key} {}: cannot read it", path.display()))
}

/// The certificates of a PEM file (at least one), errors naming the setting.
fn certs_in(
    setting: &str,
    key: &str,
    path: &Path,
    pem: &[u8],
) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            anyhow::anyhow!(
                "{setting}.{key} {}: not PEM certificates: {e}",
                path.display()
            )
        })?;
    anyhow::ensure!(
        !certs.is_empty(),
        "{setting}.{key} {}: no certificate in it (expected PEM: -----BEGIN CERTIFICATE-----)",
        path.display()
    );
    Ok(certs)
}

/// A certificate chain and its key, read and checked to belong together: (chain,
/// key, the two files' bytes, the pair as rustls serves it).
type Identity = (
    Vec<CertificateDer<'static>>,
    PrivateKeyDer<'static>,
    [Vec<u8>; 2],
    Arc<rustls::sign::CertifiedKey>,
);

fn identity(setting: &str, cert_file: &Path, key_file: &Path) -> anyhow::Result<Identity> {
    let cert_pem = read_pem(setting, "cert_file", cert_file)?;
    let key_pem = read_pem(setting, "key_file", key_file)?;
    let certs = certs_in(setting, "cert_file", cert_file, &cert_pem)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        anyhow::anyhow!(
            "{setting}.key_file {}: no private key in it ({e})",
            key_file.display()
        )
    })?;
    let signing = provider()
        .key_provider
        .load_private_key(key.clone_key())
        .map_err(|e| anyhow::anyhow!("{setting}.key_file {}: {e}", key_file.display()))?;
    let certified = rustls::sign::CertifiedKey::new(certs.clone(), signing);
    certified.keys_match().map_err(|_| {
        anyhow::anyhow!(
            "{setting}.key_file {} does not match the certificate in {setting}.cert_file {}",
            key_file.display(),
            cert_file.display()
        )
    })?;
    Ok((certs, key, [cert_pem, key_pem], Arc::new(certified)))
}

/// CA certificates from a PEM file, as trust anchors.
fn roots(setting: &str, key: &str, path: &Path) -> anyhow::Result<(RootCertStore, Vec<u8>)> {
    let pem = read_pem(setting, key, path)?;
    let mut roots = RootCertStore::empty();
    for ca in certs_in(setting, key, path, &pem)? {
        (roots.add(ca)).map_err(|e| anyhow::anyhow!("{setting}.{key} {}: {e}", path.display()))?;
    }
    Ok((roots, pem))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn load(tls: &ListenerTls, setting: &str, alpn: &[&[u8]]) -> anyhow::Result<Loaded> {
    let (certs, _, [cert_pem, key_pem], default) =
        identity(setting, &tls.cert_file, &tls.key_file)?;
    let provider = provider();
    let mut not_after = not_after(&certs[0])
        .with_context(|| format!("{setting}.cert_file {}", tls.cert_file.display()))?;
    let mut earliest = tls.cert_file.clone();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    let mut files = vec![cert_pem, key_pem];
    let builder = match &tls.client_ca_file {
        None => {
            if tls.client_san.is_some() {
                anyhow::bail!("{setting}.client_san needs {setting}.client_ca_file (mutual TLS)");
            }
            builder.with_no_client_auth()
        }
        Some(path) => {
            let (roots, pem) = roots(setting, "client_ca_file", path)?;
            files.push(pem);
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| anyhow::anyhow!("{setting}.client_ca_file {}: {e}", path.display()))?;
            match &tls.client_san {
                None => builder.with_client_cert_verifier(verifier),
                Some(san) => {
                    let name = ServerName::try_from(san.clone()).map_err(|_| {
                        anyhow::anyhow!("{setting}.client_san {san:?}: not a DNS name")
                    })?;
                    builder.with_client_cert_verifier(Arc::new(NamedClients { verifier, name }))
                }
            }
        }
    };
    // The certificates chosen by name, after the default's own names (an exact
    // name the default carries is never served another's wildcard).
    let own = dns_names(&certs[0])
        .with_context(|| format!("{setting}.cert_file {}", tls.cert_file.display()))?;
    let mut named: Vec<_> = own.into_iter().map(|n| (n, default.clone())).collect();
    for (i, c) in tls.certificates.iter().enumerate() {
        let at = format!("{setting}.certificates[{i}]");
        let (chain, _, [cert_pem, key_pem], key) = identity(&at, &c.cert_file, &c.key_file)?;
        let names = dns_names(&chain[0])
            .with_context(|| format!("{at}.cert_file {}", c.cert_file.display()))?;
        anyhow::ensure!(
            !names.is_empty(),
            "{at}.cert_file {}: it names no DNS host (subjectAltName), so no client could ask for it",
            c.cert_file.display()
        );
        let end = self::not_after(&chain[0])
            .with_context(|| format!("{at}.cert_file {}", c.cert_file.display()))?;
        if end < not_after {
            (not_after, earliest) = (end, c.cert_file.clone());
        }
        named.extend(names.into_iter().map(|n| (n, key.clone())));
        files.extend([cert_pem, key_pem]);
    }
    let mut config = builder.with_cert_resolver(Arc::new(BySni { default, named }));
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Loaded {
        config: Arc::new(config),
        files,
        not_after,
        earliest,
    })
}

/// The TLS of a client connection (TLS 1.2 and 1.3, ALPN `alpn`): the server's
/// certificate must chain to `ca_file`'s CAs (default: the system's); with
/// `identity` (certificate chain, key), the client presents that certificate. The
/// files are read now: a caller that builds one per connection follows rotations.
/// Errors name `setting` and the file.
pub fn client_config(
    setting: &str,
    ca_file: Option<&Path>,
    identity_files: Option<(&Path, &Path)>,
    alpn: &[&[u8]],
) -> anyhow::Result<rustls::ClientConfig> {
    let roots = match ca_file {
        Some(path) => roots(setting, "ca_file", path)?.0,
        None => {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = RootCertStore::empty();
            roots.add_parsable_certificates(found.certs);
            anyhow::ensure!(
                !roots.is_empty(),
                "{setting}.ca_file: not given, and the system has no CA certificates to verify the server with"
            );
            roots
        }
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_root_certificates(roots);
    let mut config = match identity_files {
        None => builder.with_no_client_auth(),
        Some((cert_file, key_file)) => {
            let (certs, key, _, _) = identity(setting, cert_file, key_file)?;
            (builder.with_client_auth_cert(certs, key))
                .map_err(|e| anyhow::anyhow!("{setting}: {e}"))?
        }
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// A client's TLS configuration ([`client_config`]) that follows its files: when a
/// connection asks for it, at most every [`WATCH_EVERY`], the files are read again and
/// a change (a rotated client certificate, a new CA) builds a new configuration for the
/// connections from then on. A change that does not load keeps the one in force and
/// says why, once per distinct error.
#[derive(Clone)]
pub struct ClientTls {
    inner: Arc<ClientSource>,
}

/// A client configuration and the bytes of the files it was built from.
type Built = (Arc<rustls::ClientConfig>, Vec<Vec<u8>>);

struct ClientSource {
    setting: String,
    ca_file: Option<PathBuf>,
    identity: Option<(PathBuf, PathBuf)>,
    alpn: Vec<Vec<u8>>,
    /// The configuration in force and the bytes of the files it was built from
    /// (always `Some` once loaded).
    current: ArcSwap<Option<Built>>,
    /// When the files were last looked at, and the last error (said once).
    checked: std::sync::Mutex<(tokio::time::Instant, Option<String>)>,
}

impl ClientTls {
    /// Reads the files now (errors name `setting` and the file).
    pub fn load(
        setting: &str,
        ca_file: Option<&Path>,
        identity: Option<(&Path, &Path)>,
        alpn: &[&[u8]],
    ) -> anyhow::Result<ClientTls> {
        let mut source = ClientSource {
            setting: setting.to_string(),
            ca_file: ca_file.map(Path::to_path_buf),
            identity: identity.map(|(c, k)| (c.to_path_buf(), k.to_path_buf())),
            alpn: alpn.iter().map(|a| a.to_vec()).collect(),
            current: ArcSwap::from_pointee(None),
            checked: std::sync::Mutex::new((tokio::time::Instant::now(), None)),
        };
        source.current = ArcSwap::from_pointee(Some(source.build()?));
        Ok(ClientTls {
            inner: Arc::new(source),
        })
    }

    /// The configuration for a new connection (the files looked at again when due).
    pub fn config(&self) -> Arc<rustls::ClientConfig> {
        let s = &self.inner;
        let due = {
            let mut checked = s.checked.lock().unwrap_or_else(|e| e.into_inner());
            let now = tokio::time::Instant::now();
            let due = now.duration_since(checked.0) >= WATCH_EVERY;
            if due {
                checked.0 = now;
            }
            due
        };
        let in_force = s.current.load_full();
        let unchanged =
            |files: &Vec<Vec<u8>>| in_force.as_ref().as_ref().is_some_and(|b| &b.1 == files);
        if due && !s.read().is_ok_and(|files| unchanged(&files)) {
            match s.build() {
                Ok(built) => {
                    tracing::info!(setting = %s.setting, "tls: the client certificate files changed: new connections use them");
                    s.current.store(Arc::new(Some(built)));
                }
                Err(e) => {
                    let why = format!("{e:#}");
                    let mut checked = s.checked.lock().unwrap_or_else(|e| e.into_inner());
                    if checked.1.as_deref() != Some(&why) {
                        tracing::error!(setting = %s.setting, error = %why, "tls: the changed files do not load: keeping the ones in force");
                        checked.1 = Some(why);
                    }
                }
            }
        }
        let in_force: Arc<Option<Built>> = s.current.load_full();
        let built: Option<&Built> = Option::as_ref(&in_force);
        built.expect("loaded at start").0.clone()
    }
}

impl ClientTls {
    /// A TLS connection to `host:port` (TCP without Nagle's delay), checked against
    /// `server_name`, with the configuration in force.
    pub async fn connect(
        &self,
        server_name: ServerName<'static>,
        host: &str,
        port: u16,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let connector = tokio_rustls::TlsConnector::from(self.config());
        let tcp = tokio::net::TcpStream::connect((host, port)).await?;
        tcp.set_nodelay(true)?;
        connector.connect(server_name, tcp).await
    }
}

impl ClientSource {
    /// The files' bytes, to tell a change.
    fn read(&self) -> std::io::Result<Vec<Vec<u8>>> {
        let mut files = Vec::new();
        for path in self
            .ca_file
            .iter()
            .chain(self.identity.iter().flat_map(|(c, k)| [c, k]))
        {
            files.push(std::fs::read(path)?);
        }
        Ok(files)
    }

    fn build(&self) -> anyhow::Result<Built> {
        let files = self.read().unwrap_or_default();
        let alpn: Vec<&[u8]> = self.alpn.iter().map(Vec::as_slice).collect();
        let identity = self
            .identity
            .as_ref()
            .map(|(c, k)| (c.as_path(), k.as_path()));
        let config = client_config(&self.setting, self.ca_file.as_deref(), identity, &alpn)?;
        Ok((Arc::new(config), files))
    }
}

/// The end of a certificate's validity.
fn not_after(cert: &CertificateDer<'_>) -> anyhow::Result<SystemTime> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert)
        .map_err(|e| anyhow::anyhow!("the certificate does not parse: {e}"))?;
    let secs = parsed.validity().not_after.timestamp();
    Ok(SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).unwrap_or(0)))
}

/// The wall clock: a certificate's validity is wall-clock time by definition; no
/// limiter reads it.
#[allow(clippy::disallowed_methods)]
fn wall_now() -> SystemTime {
    SystemTime::now()
}

/// Warns when the certificate has expired or expires within 14 days.
fn warn_expiry(setting: &str, path: &Path, not_after: SystemTime) {
    let date = httpdate::fmt_http_date(not_after);
    match not_after.duration_since(wall_now()) {
        Err(_) => tracing::warn!(
            listener = %setting,
            cert_file = %path.display(),
            "tls: the certificate expired on {date}: clients will refuse it"
        ),
        Ok(left) if left < Duration::from_secs(14 * 86_400) => tracing::warn!(
            listener = %setting,
            cert_file = %path.display(),
            "tls: the certificate expires on {date} ({} days left)",
            left.as_secs() / 86_400
        ),
        Ok(_) => {}
    }
}

/// Days until `not_after` (negative once past), for the metrics.
pub fn days_left(not_after: SystemTime) -> f64 {
    match not_after.duration_since(wall_now()) {
        Ok(left) => left.as_secs_f64() / 86_400.0,
        Err(past) => -past.duration().as_secs_f64() / 86_400.0,
    }
}

/// The DNS names a certificate carries (subjectAltName), lowercase.
fn dns_names(cert: &CertificateDer<'_>) -> anyhow::Result<Vec<String>> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert)
        .map_err(|e| anyhow::anyhow!("the certificate does not parse: {e}"))?;
    let Some(san) = parsed
        .subject_alternative_name()
        .map_err(|e| anyhow::anyhow!("its subjectAltName does not parse: {e}"))?
    else {
        return Ok(Vec::new());
    };
    Ok((san.value.general_names.iter())
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_ascii_lowercase()),
            _ => None,
        })
        .collect())
}

/// The certificate for the name a client asks for: an exact name first, then a
/// wildcard one label deep (`*.example.com` for `a.example.com`), else the default.
#[derive(Debug)]
struct BySni {
    default: Arc<rustls::sign::CertifiedKey>,
    named: Vec<(String, Arc<rustls::sign::CertifiedKey>)>,
}

impl BySni {
    fn pick(&self, name: Option<&str>) -> Arc<rustls::sign::CertifiedKey> {
        let Some(name) = name.map(str::to_ascii_lowercase) else {
            return self.default.clone();
        };
        let wildcard = name.split_once('.').map(|(_, rest)| format!("*.{rest}"));
        let find = |wanted: &str| self.named.iter().find(|(n, _)| n == wanted);
        (find(&name).or_else(|| wildcard.as_deref().and_then(find)))
            .map_or_else(|| self.default.clone(), |(_, key)| key.clone())
    }
}

impl rustls::server::ResolvesServerCert for BySni {
    fn resolve(
        &self,
        hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.pick(hello.server_name()))
    }
}

/// A client verifier that also wants a DNS name in the client certificate.
#[derive(Debug)]
struct NamedClients {
    verifier: Arc<dyn ClientCertVerifier>,
    name: ServerName<'static>,
}

impl ClientCertVerifier for NamedClients {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.verifier.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .verifier
            .verify_client_cert(end_entity, intermediates, now)?;
        let parsed = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_name(&parsed, &self.name)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.verifier.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.verifier.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.verifier.supported_verify_schemes()
    }
}
