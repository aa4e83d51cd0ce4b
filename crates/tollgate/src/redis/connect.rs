//! How a [`RedisStore`](super::RedisStore) reaches Redis: the URL forms, TLS and
//! credentials turned into redis-rs clients (no I/O here), which connection errors are
//! the configuration's fault, and URLs with their passwords hidden.
//!
//! URL forms: `redis://` and `rediss://` (TLS) for one node; `redis+cluster://` and
//! `rediss+cluster://` with a comma-separated list of seed nodes for a Cluster. A
//! password in a URL is percent-decoded (`%2F` for `/`, `%2B` for `+`, `%3D` for `=`,
//! `%40` for `@`); one given in [`RedisOptions::password`] needs no encoding and wins.

use std::path::Path;

use redis::cluster::ClusterClientBuilder;
use redis::{ClientTlsConfig, IntoConnectionInfo, TlsCertificates};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::options::{RedisOptions, RedisTls};
use crate::Error;

/// What a URL names, with every setting applied: the clients to connect with.
#[allow(clippy::large_enum_variant)] // made once per store
pub(super) enum Target {
    Single(redis::Client),
    Cluster(redis::cluster::ClusterClient),
}

/// The clients for `url` under `opts`, checked but not connected: a bad URL, an
/// unreadable or malformed certificate or key, a key that does not match its
/// certificate, or TLS settings on a plain URL are errors naming the setting.
pub(super) fn target(url: &str, opts: &RedisOptions) -> Result<Target, Error> {
    let config = |why: String| Error::Config(format!("{}: {why}", redacted(url)));
    let (scheme, rest, cluster) = match url.split_once("://") {
        Some((s @ ("redis" | "rediss"), rest)) => (s, rest, false),
        Some(("redis+cluster", rest)) => ("redis", rest, true),
        Some(("rediss+cluster", rest)) => ("rediss", rest, true),
        _ => {
            return Err(config(
                "expected redis://, rediss:// (TLS), redis+cluster:// or rediss+cluster://".into(),
            ))
        }
    };
    let tls = scheme == "rediss";
    if let (false, Some(_)) = (tls, &opts.tls) {
        return Err(config(
            "TLS settings are given but the URL is plain: use rediss:// (or rediss+cluster://)"
                .into(),
        ));
    }
    let default_tls = RedisTls::default();
    let settings = opts.tls.as_ref().unwrap_or(&default_tls);
    let certs = if tls { certificates(settings)? } else { None };
    if !cluster {
        let mut info = url
            .into_connection_info()
            .map_err(|e| config(e.to_string()))?;
        let mut redis = info.redis_settings().clone();
        if let Some(user) = &opts.username {
            redis = redis.set_username(user);
        }
        if let Some(password) = &opts.password {
            redis = redis.set_password(password.expose());
        }
        info = info.set_redis_settings(redis);
        let url_insecure = matches!(
            info.addr(),
            redis::ConnectionAddr::TcpTls { insecure: true, .. }
        );
        if tls && (settings.insecure_skip_verify || url_insecure) {
            let addr = info.addr().clone();
            info = info.set_addr(match addr {
                redis::ConnectionAddr::TcpTls { host, port, .. } => redis::ConnectionAddr::TcpTls {
                    host,
                    port,
                    insecure: true,
                    tls_params: None,
                },
                other => other,
            });
        }
        // With a client certificate, insecure or not, it is still presented.
        let client = match certs {
            Some(certs) => redis::Client::build_with_tls(info, certs),
            None => redis::Client::open(info),
        }
        .map_err(|e| config(e.to_string()))?;
        if !(tls && settings.insecure_skip_hostname_verification) {
            return Ok(Target::Single(client));
        }
        // After the certificates: building with them resets the hostname setting.
        let info = client.get_connection_info().clone();
        let mut addr = info.addr().clone();
        addr.set_danger_accept_invalid_hostnames(true);
        let client = redis::Client::open(info.set_addr(addr)).map_err(|e| config(e.to_string()))?;
        return Ok(Target::Single(client));
    }
    // A Cluster: the same credentials for every seed (and every node it discovers).
    let rest = rest.trim_end_matches('/');
    let (userinfo, hosts) = match rest.rsplit_once('@') {
        Some((userinfo, hosts)) => (format!("{userinfo}@"), hosts),
        None => (String::new(), rest),
    };
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
    let mut builder = ClusterClientBuilder::new(nodes)
        .connection_timeout(opts.connect_timeout.max(opts.timeout))
        .response_timeout(opts.timeout)
        .retries(2);
    if let Some(user) = &opts.username {
        builder = builder.username(user);
    }
    if let Some(password) = &opts.password {
        builder = builder.password(password.expose());
    }
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
    Ok(Target::Cluster(client))
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
/// a plain port or plain to a TLS port) is [`Error::Config`], naming the cause; an
/// unreachable server stays [`Error::Unavailable`] (transient).
pub(super) fn first_contact(url: &str, tls: bool, e: Error) -> Error {
    let Error::Unavailable(msg) = &e else {
        return e;
    };
    let lower = msg.to_ascii_lowercase();
    let config = |why: &str| Error::Config(format!("{}: {why} ({msg})", redacted(url)));
    // A Redis that is full, loading or busy answers the login with its error, which
    // the client reports as a failed login: waiting helps, so it is no configuration.
    if [
        "max number of clients",
        "loading",
        "busy",
        "tryagain",
        "masterdown",
    ]
    .iter()
    .any(|m| lower.contains(m))
    {
        return e;
    }
    if lower.contains("noauth") {
        return config("Redis requires a login: give a password (and a username for an ACL user)");
    }
    if lower.contains("authentication failed")
        || lower.contains("wrongpass")
        || lower.contains("invalid username-password")
    {
        return config("Redis refused the login: check the username and password");
    }
    if lower.contains("certificaterequired") || lower.contains("certificate required") {
        return config("the server requires a client certificate (cert_file and key_file)");
    }
    if lower.contains("unknownca")
        || lower.contains("badcertificate")
        || lower.contains("bad certificate")
    {
        return config(
            "the server refused our client certificate (is it signed by a CA the server trusts?)",
        );
    }
    if lower.contains("switch database") || lower.contains("db index") {
        return config("Redis refused the database index in the URL");
    }
    if lower.contains("noperm") {
        return config("the Redis user lacks a permission tollgate needs (FCALL, EVALSHA, FUNCTION, SCRIPT, TIME, PING)");
    }
    if lower.contains("certificate") || lower.contains("unknownissuer") {
        return config("the server's certificate does not verify against the CA and server name");
    }
    if tls && (lower.contains("corrupt message") || lower.contains("invalidcontenttype")) {
        return config("the server does not speak TLS on this port (rediss:// to a plain port?)");
    }
    if !tls
        && (lower.contains("connection reset")
            || lower.contains("broken pipe")
            || lower.contains("unexpected end")
            || lower.contains("connection closed"))
    {
        return Error::Unavailable(format!(
            "{msg} (a TLS port answered plain text? use rediss:// for a TLS server)"
        ));
    }
    e
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
        let full = Error::Unavailable(
            "redis: Password authentication failed - AuthenticationFailed: ERR max number of clients reached".into(),
        );
        assert!(first_contact("redis://:pw@h:1", false, full).is_transient());
        let wrong = Error::Unavailable(
            "redis: Password authentication failed - AuthenticationFailed".into(),
        );
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
        assert!(matches!(t, Ok(Target::Cluster(_))), "{:?}", t.err());
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
