//! How a [`RedisStore`](super::RedisStore) reaches Redis: the URL forms, TLS and
//! credentials turned into redis-rs clients (no I/O here), which connection errors are
//! the configuration's fault, and URLs with their passwords hidden.
//!
//! URL forms: `redis://` and `rediss://` (TLS) for one node; `redis+cluster://` and
//! `rediss+cluster://` with a comma-separated list of seed nodes for a Cluster;
//! `redis+sentinel://` and `rediss+sentinel://` with the Sentinels and the master's
//! name (`sentinel.rs` finds and follows the master). A
//! password in a URL is percent-decoded (`%2F` for `/`, `%2B` for `+`, `%3D` for `=`,
//! `%40` for `@`); one given in [`RedisOptions::password`] needs no encoding and wins.

use std::path::Path;

use redis::cluster::ClusterClientBuilder;
use redis::{ClientTlsConfig, IntoConnectionInfo, TlsCertificates};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::credentials::FileCredentials;
use super::options::{Password, RedisOptions, RedisTls};
use super::sentinel::{SentinelClient, SentinelConn};
use crate::Error;

/// What a URL names, with every setting applied: the clients to connect with.
#[allow(clippy::large_enum_variant)] // made once per store
pub(super) enum Target {
    Single(redis::Client),
    /// The Cluster's client, and a maker of one node's own client (readiness pings go
    /// to each node apart, never through the Cluster client's routing).
    Cluster(redis::cluster::ClusterClient, super::sentinel::MasterClient),
    Sentinel(SentinelConn),
}

/// The clients for `url` under `opts`, checked but not connected: a bad URL, an
/// unreadable or malformed certificate or key, a key that does not match its
/// certificate, or TLS settings on a plain URL are errors naming the setting.
pub(super) fn target(url: &str, opts: &RedisOptions) -> Result<Target, Error> {
    let config = |why: String| Error::Config(format!("{}: {why}", redacted(url)));
    let (scheme, rest, kind) = match url.split_once("://") {
        Some((s @ ("redis" | "rediss"), rest)) => (s, rest, Kind::Single),
        Some(("redis+cluster", rest)) => ("redis", rest, Kind::Cluster),
        Some(("rediss+cluster", rest)) => ("rediss", rest, Kind::Cluster),
        Some(("redis+sentinel", rest)) => ("redis", rest, Kind::Sentinel),
        Some(("rediss+sentinel", rest)) => ("rediss", rest, Kind::Sentinel),
        _ => {
            return Err(config(
                "expected redis://, rediss:// (TLS), redis+cluster://, rediss+cluster://, redis+sentinel:// or rediss+sentinel://".into(),
            ))
        }
    };
    // A password file logs in as `username` (or Redis's default user): a user named
    // in the URL alone would be lost at the first rotation.
    let url_user =
        (rest.rsplit_once('@')).is_some_and(|(u, _)| !u.split(':').next().unwrap_or("").is_empty());
    if opts.password_file.is_some() && opts.username.is_none() && url_user {
        return Err(config(
            "with a password file, name the ACL user in username, not in the URL".into(),
        ));
    }
    let tls = scheme == "rediss";
    if let (false, Some(_)) = (tls, &opts.tls) {
        return Err(config(
            "TLS settings are given but the URL is plain: use rediss:// (or rediss+cluster://, rediss+sentinel://)".into(),
        ));
    }
    let settings = opts.tls.clone().unwrap_or_default();
    let certs = if tls { certificates(&settings)? } else { None };
    let node = Node {
        settings,
        certs,
        tls,
    };
    match kind {
        Kind::Single => Ok(Target::Single(node.client(
            url,
            opts.username.as_deref(),
            opts.password.as_ref(),
        )?)),
        Kind::Cluster => cluster(url, scheme, rest, opts, node),
        Kind::Sentinel => sentinel(url, scheme, rest, opts, node),
    }
}

enum Kind {
    Single,
    Cluster,
    Sentinel,
}

/// How every node of a URL is reached: its TLS settings and certificates.
#[derive(Clone)]
struct Node {
    settings: RedisTls,
    certs: Option<TlsCertificates>,
    tls: bool,
}

impl Node {
    /// The client of the one node `url` names, logging in as `user` with `password`
    /// where given (over what the URL says).
    fn client(
        &self,
        url: &str,
        user: Option<&str>,
        password: Option<&Password>,
    ) -> Result<redis::Client, Error> {
        let config = |why: String| Error::Config(format!("{}: {why}", redacted(url)));
        let mut info = url
            .into_connection_info()
            .map_err(|e| config(e.to_string()))?;
        let mut redis = info.redis_settings().clone();
        if let Some(user) = user {
            redis = redis.set_username(user);
        }
        if let Some(password) = password {
            redis = redis.set_password(password.expose());
        }
        info = info.set_redis_settings(redis);
        if let redis::ConnectionAddr::TcpTls {
            host,
            port,
            insecure,
            ..
        } = info.addr().clone()
        {
            info = info.set_addr(redis::ConnectionAddr::TcpTls {
                host,
                port,
                insecure: insecure || self.settings.insecure_skip_verify,
                tls_params: None,
            });
        }
        // With a client certificate, insecure or not, it is still presented.
        let client = match &self.certs {
            Some(certs) => redis::Client::build_with_tls(info, certs.clone()),
            None => redis::Client::open(info),
        }
        .map_err(|e| config(e.to_string()))?;
        if !(self.tls && self.settings.insecure_skip_hostname_verification) {
            return Ok(client);
        }
        // After the certificates: building with them resets the hostname setting.
        let info = client.get_connection_info().clone();
        let mut addr = info.addr().clone();
        addr.set_danger_accept_invalid_hostnames(true);
        redis::Client::open(info.set_addr(addr)).map_err(|e| config(e.to_string()))
    }
}

/// `rest` split at its last `@`: the userinfo with its `@` (or nothing), and the rest.
fn userinfo(rest: &str) -> (String, &str) {
    match rest.rsplit_once('@') {
        Some((userinfo, hosts)) => (format!("{userinfo}@"), hosts),
        None => (String::new(), rest),
    }
}

/// The Sentinels of `redis+sentinel://[user:password@]host:port,.../master[/db]`:
/// the userinfo logs in to the master (and the replica promoted after it); the
/// Sentinels' own login is [`RedisOptions::sentinel_username`] and
/// [`RedisOptions::sentinel_password`]; TLS settings apply to both.
fn sentinel(
    url: &str,
    scheme: &str,
    rest: &str,
    opts: &RedisOptions,
    node: Node,
) -> Result<Target, Error> {
    let form = || {
        Error::Config(format!(
            "{}: expected {scheme}+sentinel://[user:password@]host:port[,host:port...]/master-name[/db]",
            redacted(url)
        ))
    };
    let (userinfo, after) = userinfo(rest);
    let (hosts, path) = after.split_once('/').ok_or_else(form)?;
    let (name, db) = match path.trim_end_matches('/').split_once('/') {
        Some((name, db)) => (name, db.parse::<u16>().map_err(|_| form())?),
        None => (path.trim_end_matches('/'), 0),
    };
    if name.contains(['?', '#', '/']) {
        return Err(form());
    }
    // The Sentinels' password file, followed as it rotates: read for each new
    // connection to a Sentinel.
    let file = (opts.sentinel_password_file.clone())
        .map(|path| FileCredentials::new(path, opts.sentinel_username.as_deref()));
    let sentinels = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| {
            // A Sentinel's port is 26379 unless given.
            let h = if h.ends_with(']') || !h.contains(':') {
                format!("{h}:26379")
            } else {
                h.to_string()
            };
            let (url, node, file) = (format!("{scheme}://{h}"), node.clone(), file.clone());
            let (user, password) = (
                opts.sentinel_username.clone(),
                opts.sentinel_password.clone(),
            );
            let client = move || {
                let password = match &file {
                    Some(file) => Some(Password::new(
                        (file.password()).map_err(|e| Error::Config(e.to_string()))?,
                    )),
                    None => password.clone(),
                };
                node.client(&url, user.as_deref(), password.as_ref())
            };
            // Checked now (a URL that does not parse, a file that cannot be read).
            client()?;
            Ok((h, Box::new(client) as SentinelClient))
        })
        .collect::<Result<Vec<_>, Error>>()?;
    if name.is_empty() || sentinels.is_empty() {
        return Err(form());
    }
    let (scheme, user, password) = (
        scheme.to_string(),
        opts.username.clone(),
        opts.password.clone(),
    );
    let master = move |host: &str, port: u16| {
        let addr = super::sentinel::address(host, port);
        node.client(
            &format!("{scheme}://{userinfo}{addr}/{db}"),
            user.as_deref(),
            password.as_ref(),
        )
    };
    // The master's settings are checked now (a userinfo that does not decode), not at
    // the first search.
    master("127.0.0.1", 6379)?;
    Ok(Target::Sentinel(SentinelConn::new(
        name.to_string(),
        sentinels,
        Box::new(master),
        i64::from(db),
        opts.connect_timeout.max(opts.timeout),
        opts.timeout,
        super::credentials::of(opts),
    )))
}

/// A Cluster: the same credentials for every seed (and every node it discovers).
fn cluster(
    url: &str,
    scheme: &str,
    rest: &str,
    opts: &RedisOptions,
    node: Node,
) -> Result<Target, Error> {
    let config = |why: String| Error::Config(format!("{}: {why}", redacted(url)));
    let (userinfo, hosts) = userinfo(rest.trim_end_matches('/'));
    let nodes: Vec<String> = hosts
        .split(',')
        .filter(|n| !n.is_empty())
        .map(|n| format!("{scheme}://{userinfo}{n}"))
        .collect();
    if nodes.is_empty() {
        return Err(config(format!(
            "expected {scheme}+cluster://host:port[,host:port...]"
        )));
    }
    // The store's own timeout fires first (a call it times out is what replaces a
    // silent connection); the client's only bounds a call past it.
    let mut builder = ClusterClientBuilder::new(nodes)
        .connection_timeout(opts.connect_timeout.max(opts.timeout))
        .response_timeout(opts.timeout * 2)
        .retries(2);
    if let Some(user) = &opts.username {
        builder = builder.username(user);
    }
    if let Some(password) = &opts.password {
        builder = builder.password(password.expose());
    }
    if let Some(file) = super::credentials::of(opts) {
        builder = builder.set_credentials_provider(file);
    }
    let (user, password) = (opts.username.clone(), opts.password.clone());
    let one = node.clone();
    let scheme_of_one = scheme.to_string();
    let node_client = move |host: &str, port: u16| {
        let addr = super::sentinel::address(host, port);
        one.client(
            &format!("{scheme_of_one}://{userinfo}{addr}"),
            user.as_deref(),
            password.as_ref(),
        )
    };
    let Node {
        settings,
        certs,
        tls,
    } = node;
    if tls {
        if settings.insecure_skip_verify {
            builder = builder.tls(redis::cluster::TlsMode::Insecure);
        } else {
            builder = builder
                .tls(redis::cluster::TlsMode::Secure)
                .danger_accept_invalid_hostnames(settings.insecure_skip_hostname_verification);
        }
        if let Some(certs) = certs {
            builder = builder.certs(certs);
        }
    }
    let client = builder.build().map_err(|e| config(e.to_string()))?;
    Ok(Target::Cluster(client, Box::new(node_client)))
}

/// The PEM files of `tls`, read and checked; `None` when none is given (the system's
/// roots, no client certificate).
fn certificates(tls: &RedisTls) -> Result<Option<TlsCertificates>, Error> {
    let read = |setting: &str, path: &Path| {
        std::fs::read(path).map_err(|e| {
            Error::Config(format!(
                "redis tls {setting} {}: cannot read it: {e}",
                path.display()
            ))
        })
    };
    let chain = |setting: &str, path: &Path, pem: &[u8]| {
        let certs = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                Error::Config(format!(
                    "redis tls {setting} {}: not PEM certificates: {e}",
                    path.display()
                ))
            })?;
        if certs.is_empty() {
            return Err(Error::Config(format!(
                "redis tls {setting} {}: no certificate in it (expected PEM: -----BEGIN CERTIFICATE-----)",
                path.display()
            )));
        }
        Ok(certs)
    };
    let root_cert = match &tls.ca_file {
        Some(path) => {
            let pem = read("ca_file", path)?;
            chain("ca_file", path, &pem)?;
            Some(pem)
        }
        None => None,
    };
    let client_tls =
        match (&tls.cert_file, &tls.key_file) {
            (None, None) => None,
            (Some(_), None) | (None, Some(_)) => return Err(Error::Config(
                "redis tls: cert_file and key_file go together (a client certificate and its key)"
                    .into(),
            )),
            (Some(cert_path), Some(key_path)) => {
                let cert = read("cert_file", cert_path)?;
                let key = read("key_file", key_path)?;
                let certs = chain("cert_file", cert_path, &cert)?;
                let private = PrivateKeyDer::from_pem_slice(&key).map_err(|e| {
                    Error::Config(format!(
                        "redis tls key_file {}: no private key in it ({e})",
                        key_path.display()
                    ))
                })?;
                let signing =
                    rustls::crypto::ring::sign::any_supported_type(&private).map_err(|e| {
                        Error::Config(format!("redis tls key_file {}: {e}", key_path.display()))
                    })?;
                rustls::sign::CertifiedKey::new(certs, signing)
                    .keys_match()
                    .map_err(|_| {
                        Error::Config(format!(
                            "redis tls key_file {} does not match the certificate in cert_file {}",
                            key_path.display(),
                            cert_path.display()
                        ))
                    })?;
                Some(ClientTlsConfig {
                    client_cert: cert,
                    client_key: key,
                })
            }
        };
    Ok(
        (root_cert.is_some() || client_tls.is_some()).then_some(TlsCertificates {
            client_tls,
            root_cert,
        }),
    )
}

/// What a failed first contact means: the configuration's fault (a refused login, an
/// unknown ACL user, a bad database index, a certificate that does not verify, TLS to
/// a plain port or plain to a TLS port, an unknown Sentinel master name) is
/// [`Error::Config`], naming the cause; an unreachable server stays
/// [`Error::Unavailable`] (transient). By the error's kind and code where Redis gives
/// one; TLS failures reach us only as the text of an I/O error.
pub(super) fn first_contact(url: &str, tls: bool, e: redis::RedisError) -> Error {
    use redis::{ErrorKind as K, ServerErrorKind as S};
    let msg = e.to_string();
    let lower = msg.to_ascii_lowercase();
    let config = |why: &str| Error::Config(format!("{}: {why} ({msg})", redacted(url)));
    let has = |marks: &[&str]| marks.iter().any(|m| lower.contains(m));
    // A Redis that is full, loading or busy answers the login with its error, which
    // the client reports as a failed login: waiting helps, so it is no configuration.
    let busy = matches!(
        e.kind(),
        K::Server(S::BusyLoading | S::TryAgain | S::MasterDown | S::ClusterDown)
    ) || has(&[
        "max number of clients",
        "loading",
        "busy",
        "tryagain",
        "masterdown",
    ]);
    if e.kind() == K::MasterNameNotFoundBySentinel {
        return Error::Config(format!(
            "{}: no Sentinel knows this master name: {} (the name after the hosts in the URL)",
            redacted(url),
            e.detail().unwrap_or_default()
        ));
    }
    let code = e.code().unwrap_or_default();
    let why = match e.kind() {
        _ if busy => None,
        _ if has(&[super::sentinel::SENTINEL_REFUSED_LOGIN]) => Some(
            "a Sentinel refused the login: check sentinel_username and sentinel_password",
        ),
        K::Server(S::NoPerm) => Some(
            "the Redis user lacks a permission tollgate needs (FCALL, EVALSHA, FUNCTION, SCRIPT, TIME, PING; ROLE with Sentinel)",
        ),
        _ if code == "NOAUTH" || has(&["noauth"]) => {
            Some("Redis requires a login: give a password (and a username for an ACL user)")
        }
        K::AuthenticationFailed => Some("Redis refused the login: check the username and password"),
        _ if code == "WRONGPASS" || has(&["wrongpass", "invalid username-password"]) => {
            Some("Redis refused the login: check the username and password")
        }
        _ if has(&["switch database", "db index"]) => {
            Some("Redis refused the database index in the URL")
        }
        _ if has(&["certificaterequired", "certificate required"]) => {
            Some("the server requires a client certificate (cert_file and key_file)")
        }
        _ if has(&["unknownca", "badcertificate", "bad certificate"]) => Some(
            "the server refused our client certificate (is it signed by a CA the server trusts?)",
        ),
        _ if has(&["certificate", "unknownissuer"]) => {
            Some("the server's certificate does not verify against the CA and server name")
        }
        _ if tls && has(&["corrupt message", "invalidcontenttype"]) => {
            Some("the server does not speak TLS on this port (rediss:// to a plain port?)")
        }
        _ => None,
    };
    if let Some(why) = why {
        return config(why);
    }
    if !tls
        && has(&[
            "connection reset",
            "broken pipe",
            "unexpected end",
            "connection closed",
        ])
    {
        return Error::Unavailable(format!(
            "redis: {msg} (a TLS port answered plain text? use rediss:// for a TLS server)"
        ));
    }
    Error::from(e)
}

/// `url` with any password replaced by `***`, for logs, errors and `/v1/config`.
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        // Not a URL (a mistyped one is reported): still no password.
        return match url.rsplit_once('@') {
            Some((_, hosts)) => format!("***@{hosts}"),
            None => url.to_string(),
        };
    };
    match rest.rsplit_once('@') {
        Some((userinfo, hosts)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{hosts}"),
            // A lone userinfo is read as a username, but people write passwords there.
            None => format!("{scheme}://***@{hosts}"),
        },
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        assert_eq!(
            redacted("redis://user:p%2Fw@h:1/0"),
            "redis://user:***@h:1/0"
        );
        assert_eq!(
            redacted("rediss+cluster://:pw@h1:1,h2:2"),
            "rediss+cluster://:***@h1:1,h2:2"
        );
        assert_eq!(redacted("redis://h:1"), "redis://h:1");
        assert_eq!(redacted("redis://pw@h:1"), "redis://***@h:1");
        assert_eq!(redacted("user:secret@redis:6379"), "***@redis:6379");
    }

    #[test]
    fn a_full_redis_is_no_bad_login() {
        let failed = "Password authentication failed";
        let full = redis::RedisError::from((
            redis::ErrorKind::AuthenticationFailed,
            failed,
            "ERR max number of clients reached".to_string(),
        ));
        assert!(first_contact("redis://:pw@h:1", false, full).is_transient());
        let wrong = redis::RedisError::from((redis::ErrorKind::AuthenticationFailed, failed));
        let e = first_contact("redis://:pw@h:1", false, wrong);
        assert!(!e.is_transient() && !e.to_string().contains("pw@"), "{e}");
    }

    #[test]
    fn a_cluster_with_a_password_gives_it_to_every_seed() {
        let opts = RedisOptions::default();
        let t = target(
            "redis+cluster://user:p%2Bw%3D@127.0.0.1:1,127.0.0.1:2",
            &opts,
        );
        assert!(matches!(t, Ok(Target::Cluster(..))), "{:?}", t.err());
    }

    #[test]
    fn sentinel_urls_name_the_master_after_the_sentinels() {
        let opts = RedisOptions::default();
        for good in [
            "redis+sentinel://u:p%2F@127.0.0.1:26379,127.0.0.1:26380/orders/2",
            "rediss+sentinel://s1,s2/orders",
        ] {
            let tls = good.starts_with("rediss");
            let opts = RedisOptions {
                tls: tls.then(RedisTls::default),
                ..opts.clone()
            };
            assert!(
                matches!(target(good, &opts), Ok(Target::Sentinel(_))),
                "{good}"
            );
        }
        for bad in [
            "redis+sentinel://127.0.0.1:26379",
            "redis+sentinel://127.0.0.1:26379/",
            "redis+sentinel://127.0.0.1:26379/orders/-1",
            "redis+sentinel://127.0.0.1:26379/orders?x=1",
            "redis+sentinel:///orders",
        ] {
            let e = target(bad, &opts)
                .err()
                .unwrap_or_else(|| panic!("{bad} accepted"));
            assert!(e.to_string().contains("/master-name[/db]"), "{bad}: {e}");
        }
        let e = target("redis+sentinel://u:%FF@s1/orders", &opts)
            .err()
            .unwrap();
        assert!(!e.to_string().contains("%FF"), "{e}");
    }

    #[test]
    fn tls_settings_on_a_plain_url_are_refused_by_name() {
        let opts = RedisOptions {
            tls: Some(RedisTls::default()),
            ..Default::default()
        };
        let e = target("redis://127.0.0.1:1", &opts).err().unwrap();
        assert!(e.to_string().contains("use rediss://"), "{e}");
        let opts = RedisOptions {
            tls: Some(RedisTls {
                ca_file: Some("/nonexistent/ca.pem".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = target("rediss://127.0.0.1:1", &opts).err().unwrap();
        assert!(
            e.to_string()
                .contains("ca_file /nonexistent/ca.pem: cannot read it"),
            "{e}"
        );
    }
}
