//! Reaching Redis where production runs it: TLS (standalone, mutual, Cluster), ACL
//! users and passwords that need encoding, and every way connecting can go wrong,
//! each against a real redis-server with certificates made for the test.

use std::time::Duration;

use tollgate::redis::{Password, RedisLimiter, RedisOptions, RedisStore, RedisTls};
use tollgate::{RateLimiter, RuleSet};
use tollgate_testkit::{rt, Pki, RedisServers};

#[path = "support/connect.rs"]
mod connect;

use connect::{config_error, three_of_a_burst_of_two};

fn tls(pki: &Pki, ca: &str, client: Option<&str>) -> RedisOptions {
    RedisOptions {
        tls: Some(RedisTls {
            ca_file: Some(pki.path(ca)),
            cert_file: client.map(|c| pki.path(&format!("{c}.pem"))),
            key_file: client.map(|c| pki.path(&format!("{c}.key"))),
            ..Default::default()
        }),
        timeout: Duration::from_secs(2),
        ..Default::default()
    }
}

#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts redis-server: run scripts/test.sh, or cargo test --all-features"
)]
#[test]
fn tls_standalone_decides_as_plain_and_each_bad_certificate_is_named() {
    let pki = Pki::new();
    let server = RedisServers::standalone_tls(&pki, false, &[]);
    let url = server.url();
    assert!(url.starts_with("rediss://"), "{url}");
    rt().block_on(async {
        let ok = three_of_a_burst_of_two(&url, tls(&pki, "ca.pem", None)).await;
        assert_eq!(ok.unwrap(), [true, true, false]);

        // The system's roots do not know the test CA; nor does another CA.
        let opts = RedisOptions {
            tls: None,
            timeout: Duration::from_secs(2),
            ..Default::default()
        };
        let e = config_error(three_of_a_burst_of_two(&url, opts).await);
        assert!(e.contains("certificate does not verify"), "{e}");
        let e = config_error(three_of_a_burst_of_two(&url, tls(&pki, "other-ca.pem", None)).await);
        assert!(e.contains("certificate does not verify"), "{e}");

        // Plain text to the TLS port: the connection ends, and the error says why.
        let plain = url.replace("rediss://", "redis://");
        let opts = RedisOptions {
            timeout: Duration::from_secs(2),
            ..Default::default()
        };
        let e = three_of_a_burst_of_two(&plain, opts).await.unwrap_err();
        assert!(e.to_string().contains("rediss://"), "{e}");

        // TLS settings with a plain URL; missing and malformed files; a key that is
        // not the certificate's.
        let e = config_error(three_of_a_burst_of_two(&plain, tls(&pki, "ca.pem", None)).await);
        assert!(e.contains("use rediss://"), "{e}");
        let e = config_error(three_of_a_burst_of_two(&url, tls(&pki, "nope.pem", None)).await);
        assert!(
            e.contains("ca_file") && e.contains("nope.pem: cannot read it"),
            "{e}"
        );
        let e = config_error(three_of_a_burst_of_two(&url, tls(&pki, "ca.key", None)).await);
        assert!(e.contains("no certificate in it"), "{e}");
        let mut mismatched = tls(&pki, "ca.pem", Some("client"));
        mismatched.tls.as_mut().unwrap().key_file = Some(pki.path("server.key"));
        let e = config_error(three_of_a_burst_of_two(&url, mismatched).await);
        assert!(e.contains("does not match the certificate"), "{e}");
        let mut half = tls(&pki, "ca.pem", Some("client"));
        half.tls.as_mut().unwrap().key_file = None;
        let e = config_error(three_of_a_burst_of_two(&url, half).await);
        assert!(e.contains("go together"), "{e}");
    });

    // A server whose certificate expired, or names another host.
    for (cert, expect) in [("expired", "expired"), ("wrong-name", "not valid for")] {
        let pem = pki.path(&format!("{cert}.pem")).display().to_string();
        let key = pki.path(&format!("{cert}.key")).display().to_string();
        let server = RedisServers::standalone_tls(
            &pki,
            false,
            &["--tls-cert-file", &pem, "--tls-key-file", &key],
        );
        rt().block_on(async {
            let r = three_of_a_burst_of_two(&server.url(), tls(&pki, "ca.pem", None)).await;
            let e = config_error(r).to_lowercase();
            assert!(e.contains(expect), "{cert}: {e}");
            if cert == "wrong-name" {
                // Verified up to the CA, not the name: allowed when asked, loudly.
                let mut opts = tls(&pki, "ca.pem", None);
                opts.tls
                    .as_mut()
                    .unwrap()
                    .insecure_skip_hostname_verification = true;
                let ok = three_of_a_burst_of_two(&server.url(), opts).await;
                assert_eq!(ok.unwrap(), [true, true, false]);
            }
        });
    }
}

#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts redis-server: run scripts/test.sh, or cargo test --all-features"
)]
#[test]
fn mutual_tls_needs_a_client_certificate_from_the_servers_ca() {
    let pki = Pki::new();
    let server = RedisServers::standalone_tls(&pki, true, &[]);
    let url = server.url();
    rt().block_on(async {
        let ok = three_of_a_burst_of_two(&url, tls(&pki, "ca.pem", Some("client"))).await;
        assert_eq!(ok.unwrap(), [true, true, false]);
        let e = config_error(three_of_a_burst_of_two(&url, tls(&pki, "ca.pem", None)).await);
        assert!(e.contains("client certificate"), "{e}");
        let stranger = tls(&pki, "ca.pem", Some("stranger"));
        let e = config_error(three_of_a_burst_of_two(&url, stranger).await);
        assert!(e.contains("client certificate"), "{e}");
    });
}

#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts redis-server: run scripts/test.sh, or cargo test --all-features"
)]
#[test]
fn a_tls_cluster_reaches_every_node_with_the_same_settings() {
    let pki = Pki::new();
    let cluster = RedisServers::cluster_tls(&pki);
    let url = cluster.url();
    assert!(url.starts_with("rediss+cluster://"), "{url}");
    rt().block_on(async {
        let store = RedisStore::connect_with(&url, tls(&pki, "ca.pem", None))
            .await
            .unwrap();
        let rules = RuleSet::parse(&["fixed-window:limit=2,window=1h,align=first"]).unwrap();
        let limiter = RedisLimiter::new(store, "tls-cluster", rules).unwrap();
        // Keys on every master (60 keys cover the three slot ranges).
        for k in 0..60 {
            let key = format!("key-{k}");
            let got: Vec<bool> = futures::future::join_all((0..3).map(|_| limiter.check(&key, 1)))
                .await
                .into_iter()
                .map(|d| d.unwrap().allowed)
                .collect();
            assert_eq!(got.iter().filter(|&&a| a).count(), 2, "{key}: {got:?}");
        }
        for port in &cluster.ports {
            let keys = cluster.cli(
                cluster.ports.iter().position(|p| p == port).unwrap(),
                &["dbsize"],
            );
            assert!(
                keys.trim().parse::<u64>().unwrap() > 0,
                "node {port}: {keys}"
            );
        }
        let e = config_error(three_of_a_burst_of_two(&url, tls(&pki, "other-ca.pem", None)).await);
        assert!(e.contains("certificate does not verify"), "{e}");
    });
}

/// An ACL user whose password holds `/+=@:` (an Azure key's alphabet and more).
const AWKWARD: &str = "p/a+s=s@w:rd";

#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts redis-server: run scripts/test.sh, or cargo test --all-features"
)]
#[test]
fn acl_users_and_awkward_passwords_log_in_and_refusals_are_configuration_errors() {
    let server = RedisServers::standalone_with(&["--requirepass", "admin-secret"]);
    let port = server.ports[0];
    let password = format!(">{AWKWARD}");
    let set = ["ACL", "SETUSER", "app", "on", &password, "~*", "+@all"];
    assert_eq!(server.cli(0, &set).trim(), "OK");
    rt().block_on(async {
        // Percent-encoded in the URL.
        let url = format!("redis://app:p%2Fa%2Bs%3Ds%40w%3Ard@127.0.0.1:{port}/");
        let ok = three_of_a_burst_of_two(&url, RedisOptions::default()).await;
        assert_eq!(ok.unwrap(), [true, true, false]);
        // Or as it is, beside the URL (from a file or the environment).
        let opts = RedisOptions {
            username: Some("app".into()),
            password: Some(Password::new(AWKWARD)),
            ..Default::default()
        };
        let plain = format!("redis://127.0.0.1:{port}/");
        assert!(three_of_a_burst_of_two(&plain, opts.clone()).await.is_ok());
        // The password never shows, not even in Debug.
        assert!(!format!("{opts:?}").contains(AWKWARD));

        for (url, opts, expect) in [
            (
                format!("redis://app:wrong@127.0.0.1:{port}/"),
                RedisOptions::default(),
                "refused the login",
            ),
            (
                format!("redis://nobody:secret@127.0.0.1:{port}/"),
                RedisOptions::default(),
                "refused the login",
            ),
            (plain.clone(), RedisOptions::default(), "requires a login"),
            (
                format!("redis://127.0.0.1:{port}/99"),
                RedisOptions {
                    password: Some(Password::new("admin-secret")),
                    ..Default::default()
                },
                "database index",
            ),
        ] {
            let e = config_error(three_of_a_burst_of_two(&url, opts).await);
            assert!(e.contains(expect), "{url}: {e}");
            assert!(!e.contains(AWKWARD) && !e.contains("wrong@"), "{e}");
        }
    });
}

#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts redis-server: run scripts/test.sh, or cargo test --all-features"
)]
#[test]
fn a_store_made_before_redis_starts_connects_when_it_answers() {
    let mut server = RedisServers::standalone();
    let url = server.url();
    server.stop(0);
    rt().block_on(async {
        let opts = RedisOptions {
            timeout: Duration::from_millis(500),
            ..Default::default()
        };
        // Connecting now fails (transient); connecting later is a store at once.
        let e = RedisStore::connect_with(&url, opts.clone())
            .await
            .unwrap_err();
        assert!(e.is_transient(), "{e}");
        let store = RedisStore::connect_later(&url, opts).unwrap();
        let rules = RuleSet::parse(&["fixed-window:limit=5,window=1h,align=first"]).unwrap();
        let limiter = RedisLimiter::new(store.clone(), "later", rules).unwrap();
        let e = limiter.check("k", 1).await.unwrap_err();
        assert!(e.is_transient(), "{e}");
        assert!(store.ping().await.is_err());
        server.restart(0);
        // Answered once the store has reconnected (its first try may still be the
        // one that failed while Redis was away).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while let Err(e) = store.ping().await {
            assert!(tokio::time::Instant::now() < deadline, "{e}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The limiter tries Redis again at its next probe (every 500 ms while failing).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            match limiter.check("k", 1).await {
                Ok(d) => break assert!(d.allowed),
                Err(e) => assert!(tokio::time::Instant::now() < deadline, "{e}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}
