//! TLS on `serve`'s listeners with certificates made for the test (`openssl`): clients
//! no one here wrote (Python's grpcio and httpx, `openssl s_client`, curl), mutual TLS
//! accepted and refused, a certificate rotated by a symlink swap as Kubernetes does
//! it, and every bad setting refused by name.

#[path = "support/python.rs"]
mod python;
#[path = "support/serve.rs"]
mod serve_process;

use python::run_python;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate_testkit::Pki;

const RULES: &str = "domain: tls\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 2 }\n";

/// A directory with the rules and a config whose `listen:` section is `listen`.
struct Dir(tollgate_testkit::ScratchDir);

impl Dir {
    fn new(name: &str, listen: &str) -> Dir {
        let dir = tollgate_testkit::ScratchDir::new(&format!("tls-{name}"));
        dir.write("rules.yaml", RULES);
        dir.write(
            "tollgate.yaml",
            &format!("rules: [rules.yaml]\nlisten:\n{listen}"),
        );
        Dir(dir)
    }

    fn config(&self) -> String {
        self.0 .0.join("tollgate.yaml").display().to_string()
    }
}

fn file(pki: &Pki, name: &str) -> String {
    pki.path(name).display().to_string()
}

/// envoyproxy/ratelimit's gRPC TLS settings under `--envoy-env` (mutual TLS, as
/// Envoy Gateway sets them) and the config file's `listen.http_tls`, driven by
/// grpcio and httpx (tests/python/tls_clients.py).
#[test]
fn python_clients_speak_grpc_over_mutual_tls_and_https() {
    let pki = Pki::new();
    let dir = Dir::new(
        "python",
        &format!(
            "  http_tls: {{cert_file: {}, key_file: {}}}\n",
            file(&pki, "server.pem"),
            file(&pki, "server.key")
        ),
    );
    let (cert, key, ca) = (
        file(&pki, "server.pem"),
        file(&pki, "server.key"),
        file(&pki, "ca.pem"),
    );
    let server = serve_process::start(
        &["--config", &dir.config(), "--envoy-env"],
        &[
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", &cert),
            ("GRPC_SERVER_TLS_KEY", &key),
            ("GRPC_SERVER_TLS_CA_CERT", &ca),
        ],
    );
    assert!(server.base.starts_with("https://"), "{}", server.banner);
    assert!(server.banner.contains("over TLS"), "{}", server.banner);
    run_python(
        "tls_clients.py",
        &[
            server.grpc.trim_start_matches("http://").to_string(),
            server.base.clone(),
            pki.dir.display().to_string(),
        ],
    );
}

/// `openssl s_client` and curl: the certificate, ALPN (`h2` on gRPC; `h2` and
/// `http/1.1` on HTTP), TLS 1.2 and 1.3 but not 1.1.
#[test]
fn openssl_and_curl_see_the_certificate_and_alpn() {
    let pki = Pki::new();
    let tls = format!(
        "{{cert_file: {}, key_file: {}}}",
        file(&pki, "server.pem"),
        file(&pki, "server.key")
    );
    let dir = Dir::new(
        "openssl",
        &format!("  http_tls: {tls}\n  grpc_tls: {tls}\n"),
    );
    let server = serve_process::start(&["--config", &dir.config()], &[]);
    let http = server.base.trim_start_matches("https://").to_string();
    let grpc = server.grpc.trim_start_matches("http://").to_string();
    let s_client = |addr: &str, extra: &[&str]| {
        let out = Command::new("openssl")
            .args([
                "s_client",
                "-connect",
                addr,
                "-CAfile",
                &file(&pki, "ca.pem"),
            ])
            .args(extra)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("openssl (scripts/test.sh installs it)");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let out = s_client(&grpc, &["-alpn", "h2"]);
    assert!(out.contains("ALPN protocol: h2"), "{out}");
    assert!(out.contains("Verify return code: 0 (ok)"), "{out}");
    assert!(
        out.contains("CN=server") || out.contains("CN = server"),
        "{out}"
    );
    let out = s_client(&http, &["-alpn", "http/1.1"]);
    assert!(out.contains("ALPN protocol: http/1.1"), "{out}");
    let out = s_client(&http, &["-tls1_2"]);
    assert!(
        out.contains("Protocol  : TLSv1.2") || out.contains("TLSv1.2"),
        "{out}"
    );
    let out = s_client(&http, &["-tls1_1"]);
    assert!(
        out.contains("no peer certificate available"),
        "TLS 1.1 accepted: {out}"
    );
    for (flag, version) in [("--http1.1", "1.1"), ("--http2", "2")] {
        let out = Command::new("curl")
            .args(["-s", flag, "--cacert", &file(&pki, "ca.pem")])
            .args(["-o", "/dev/null", "-w", "%{http_version} %{http_code}"])
            .arg(format!("https://localhost:{}/healthcheck", port(&http)))
            .output()
            .expect("curl");
        let out = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(out, format!("{version} 200"), "curl {flag}");
    }
}

fn port(addr: &str) -> &str {
    addr.rsplit(':').next().unwrap()
}

/// A client that trusts `pki`'s CA: the certificate the server shows on a new
/// connection, and that connection.
async fn connect(
    pki: &Pki,
    addr: &str,
) -> (
    Vec<u8>,
    tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
) {
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read(pki.path("ca.pem")).unwrap();
    use rustls::pki_types::pem::PemObject;
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    let shown = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    (shown, tls)
}

/// The DER of the first certificate in a PEM file.
fn der(path: &Path) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_file(path)
        .unwrap()
        .to_vec()
}

/// One keep-alive request on an open connection: its status line.
async fn get(tls: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>) -> String {
    tls.write_all(b"GET /healthcheck HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0; 4096];
    let n = tls.read(&mut buf).await.unwrap();
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Kubernetes renews a secret by pointing `..data` at a new directory: the next
/// connection gets the new certificate, the open one goes on, no restart; a broken
/// renewal (a key of another certificate) keeps the one in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_renewed_by_a_symlink_swap_is_served_to_the_next_connection() {
    let pki = Pki::new();
    pki.issue("renewed", "DNS:localhost,IP:127.0.0.1");
    let secret = pki.dir.join("secret");
    for (version, cert) in [("v1", "server"), ("v2", "renewed"), ("v3", "broken")] {
        let d = secret.join(version);
        std::fs::create_dir_all(&d).unwrap();
        let (pem, key) = match cert {
            "broken" => ("renewed.pem".to_string(), "server.key".to_string()),
            c => (format!("{c}.pem"), format!("{c}.key")),
        };
        std::fs::copy(pki.path(&pem), d.join("tls.crt")).unwrap();
        std::fs::copy(pki.path(&key), d.join("tls.key")).unwrap();
    }
    let swap = |to: &str| {
        let tmp = secret.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(to, &tmp).unwrap();
        std::fs::rename(&tmp, secret.join("..data")).unwrap();
    };
    swap("v1");
    for f in ["tls.crt", "tls.key"] {
        std::os::unix::fs::symlink(format!("..data/{f}"), secret.join(f)).unwrap();
    }
    let dir = Dir::new(
        "rotate",
        &format!(
            "  http_tls: {{cert_file: {}, key_file: {}}}\n",
            secret.join("tls.crt").display(),
            secret.join("tls.key").display()
        ),
    );
    let server = serve_process::start(&["--config", &dir.config()], &[]);
    let addr = server.base.trim_start_matches("https://").to_string();
    let (shown, mut open) = connect(&pki, &addr).await;
    assert_eq!(shown, der(&pki.path("server.pem")));
    assert_eq!(get(&mut open).await, "HTTP/1.1 200 OK");

    swap("v2");
    let renewed = der(&pki.path("renewed.pem"));
    let mut seen = false;
    for _ in 0..100 {
        if connect(&pki, &addr).await.0 == renewed {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen, "the renewed certificate was never served");
    // The connection opened before goes on with the old one.
    assert_eq!(get(&mut open).await, "HTTP/1.1 200 OK");

    // A renewal whose key does not match: refused, the renewed one stays.
    swap("v3");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(connect(&pki, &addr).await.0, renewed);
}

/// Each bad setting refuses to start, naming the setting and the file; an expired
/// certificate starts with a warning giving its date.
#[test]
fn bad_tls_settings_are_refused_by_name() {
    let pki = Pki::new();
    std::fs::write(pki.path("not-pem.txt"), "hello").unwrap();
    let (cert, key) = (file(&pki, "server.pem"), file(&pki, "server.key"));
    for (tls, expect) in [
        (
            format!("{{cert_file: /nonexistent/tls.crt, key_file: {key}}}"),
            "listen.grpc_tls.cert_file /nonexistent/tls.crt: cannot read it",
        ),
        (
            format!(
                "{{cert_file: {cert}, key_file: {}}}",
                file(&pki, "client.key")
            ),
            "does not match the certificate in listen.grpc_tls.cert_file",
        ),
        (
            format!(
                "{{cert_file: {cert}, key_file: {key}, client_ca_file: {}}}",
                file(&pki, "not-pem.txt")
            ),
            "listen.grpc_tls.client_ca_file",
        ),
        (
            format!("{{cert_file: {cert}, key_file: {key}, client_san: envoy}}"),
            "listen.grpc_tls.client_san needs listen.grpc_tls.client_ca_file",
        ),
        (
            format!(
                "{{cert_file: {}, key_file: {key}}}",
                file(&pki, "not-pem.txt")
            ),
            "no certificate in it",
        ),
    ] {
        let dir = Dir::new("bad", &format!("  grpc_tls: {tls}\n"));
        let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["check-config", "--config", &dir.config()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{tls}: accepted");
        assert!(err.contains(expect), "{tls}: {err}");
    }
    // The proxy's section: its TLS files are read as `tollgate proxy` reads them.
    let dir = Dir::new("proxy", "  {}\n");
    for (proxy, expect) in [
        (
            format!("  metrics_tls: {{cert_file: {cert}, key_file: {key}}}\n"),
            "proxy.metrics_tls: needs proxy.metrics",
        ),
        (
            "  tls: {cert_file: /nonexistent/tls.crt, key_file: /nonexistent/tls.key}\n".into(),
            "proxy.tls.cert_file /nonexistent/tls.crt: cannot read it",
        ),
    ] {
        let config = dir.0.write(
            "proxy.yaml",
            &format!("proxy:\n{proxy}  routes:\n    - name: r\n      upstream: http://127.0.0.1:9\n      policies: [\"fixed-window:limit=1,window=1s\"]\n"),
        );
        let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["check-config", "--config", &config])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{proxy}: accepted");
        assert!(err.contains(expect), "{proxy}: {err}");
    }
    let dir = Dir::new(
        "expired",
        &format!(
            "  grpc_tls: {{cert_file: {}, key_file: {}}}\n",
            file(&pki, "expired.pem"),
            file(&pki, "expired.key")
        ),
    );
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check-config", "--config", &dir.config()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("the certificate expired on") && err.contains("2020"),
        "{err}"
    );
}

/// The binary invoked as `ratelimit` (envoyproxy/ratelimit's image runs
/// `/bin/ratelimit`, no arguments) is `tollgate serve --envoy-env`: here with Envoy
/// Gateway's gRPC TLS settings, its rules from `RUNTIME_ROOT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invoked_as_ratelimit_it_serves_envoys_environment() {
    let pki = Pki::new();
    let dir = Dir::new("ratelimit", "  {}\n");
    let config = dir.0 .0.join("srv/ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("rules.yaml"), RULES).unwrap();
    let bin = dir.0 .0.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_tollgate"), bin.join("ratelimit")).unwrap();
    let (cert, key, ca) = (
        file(&pki, "server.pem"),
        file(&pki, "server.key"),
        file(&pki, "ca.pem"),
    );
    let root = dir.0 .0.join("srv").display().to_string();
    let child = Command::new(bin.join("ratelimit"))
        .envs([
            ("HOST", "127.0.0.1"),
            ("PORT", "0"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "0"),
            ("RUNTIME_ROOT", &root),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("LOG_LEVEL", "info"),
            ("USE_STATSD", "false"),
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", &cert),
            ("GRPC_SERVER_TLS_KEY", &key),
            ("GRPC_SERVER_TLS_CA_CERT", &ca),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let server = serve_process::attach(child);
    let banner = &server.banner;
    assert!(
        banner.starts_with("tollgate serve: HTTP on http://127.0.0.1:"),
        "{banner}"
    );
    assert!(banner.contains("over TLS"), "{banner}");
    let base = server.base.as_str();
    let (status, _, body) = serve_process::request_to(base, "GET", "/healthcheck", "", None).await;
    assert_eq!((status, body.as_str()), (200, Some("OK\n")));
    let (_, _, rules) = serve_process::request_to(base, "GET", "/rlconfig", "", None).await;
    assert!(
        rules.as_str().unwrap_or_default().contains("tls.user"),
        "{rules}"
    );
}

/// `tollgate serve ARGS` with `env`: the process (killed on drop) and the first
/// `lines` lines it printed.
fn serve_lines(
    args: &[&str],
    env: &[(&str, &str)],
    lines: usize,
) -> (tollgate_testkit::Killed, Vec<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("serve")
        .args(args)
        .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut printed = Vec::new();
    for _ in 0..lines {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        printed.push(line.trim_end().to_string());
    }
    // Its output is not read again: dropped, a write would fail, and it prints no more.
    std::mem::forget(out);
    (tollgate_testkit::Killed(child), printed)
}

/// The metrics on a listener of their own: the config's `listen.metrics` over TLS,
/// and envoyproxy/ratelimit's `USE_PROMETHEUS`, `PROMETHEUS_ADDR` and
/// `PROMETHEUS_PATH`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_have_a_listener_of_their_own_over_tls_or_as_envoys_settings_say() {
    let pki = Pki::new();
    let dir = Dir::new(
        "metrics",
        &format!(
            "  metrics: 127.0.0.1:0\n  metrics_tls: {{cert_file: {}, key_file: {}}}\n",
            file(&pki, "server.pem"),
            file(&pki, "server.key")
        ),
    );
    let (_server, lines) = serve_lines(&["--config", &dir.config()], &[], 2);
    let url = lines[1]
        .strip_prefix("  metrics: ")
        .unwrap_or_else(|| panic!("{lines:?}"));
    assert!(
        url.starts_with("https://127.0.0.1:") && url.ends_with("/metrics"),
        "{url}"
    );
    let out = Command::new("curl")
        .args(["-s", "--cacert", &file(&pki, "ca.pem")])
        .arg(url.replace("127.0.0.1", "localhost"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("tollgate_decision_duration_seconds"),
        "{text}"
    );
    // The certificate's days left (the test's certificates are made for 30 days).
    let days: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("tollgate_tls_certificate_expiry_days{listener=\"metrics\"} "))
        .unwrap_or_else(|| panic!("{text}"))
        .parse()
        .unwrap();
    assert!((29.0..=30.0).contains(&days), "{days}");

    let (_envoy, lines) = serve_lines(
        &["--envoy-env"],
        &[
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", "127.0.0.1:0"),
            ("PROMETHEUS_PATH", "/stats/prometheus"),
        ],
        2,
    );
    let url = lines[1]
        .strip_prefix("  metrics: ")
        .unwrap_or_else(|| panic!("{lines:?}"));
    assert!(
        url.starts_with("http://") && url.ends_with("/stats/prometheus"),
        "{url}"
    );
    let (base, path) = url.split_at(url.find("/stats").unwrap());
    let (status, _, body) = serve_process::request_to(base, "GET", path, "", None).await;
    assert_eq!(status, 200);
    assert!(
        body.as_str()
            .unwrap_or_default()
            .contains("tollgate_decision_duration_seconds"),
        "{body}"
    );
    let (status, _, _) = serve_process::request_to(base, "GET", "/v1/config", "", None).await;
    assert_eq!(status, 404, "the metrics listener serves the metrics only");
}

/// A client that completes the TLS handshake and then says nothing is closed after
/// the header timeout, as one that never starts it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_after_the_handshake_is_closed_at_the_header_timeout() {
    let pki = Pki::new();
    let dir = Dir::new(
        "silent",
        &format!(
            "  http_tls: {{cert_file: {}, key_file: {}}}\nconnections: {{header_timeout: 1s}}\n",
            file(&pki, "server.pem"),
            file(&pki, "server.key")
        ),
    );
    let server = serve_process::start(&["--config", &dir.config()], &[]);
    let addr = server.base.trim_start_matches("https://").to_string();
    let (_, mut silent) = connect(&pki, &addr).await;
    let start = tokio::time::Instant::now();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut buf)).await;
    let closed = start.elapsed();
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
    assert!(
        closed >= Duration::from_millis(900) && closed < Duration::from_secs(5),
        "{closed:?}"
    );
}

/// Refused handshakes are counted by listener and reason and logged (with the peer
/// and the reason): plain HTTP on a TLS port, a client that does not trust the
/// listener's CA or finds another name on its certificate, and on a mutual-TLS
/// listener a client with no certificate or one from another CA; curl and
/// `openssl s_client` are the clients.
#[test]
fn refused_handshakes_are_counted_by_reason_and_logged() {
    let pki = Pki::new();
    let (cert, key) = (file(&pki, "server.pem"), file(&pki, "server.key"));
    let dir = Dir::new(
        "refusals",
        &format!(
            "  http_tls: {{cert_file: {cert}, key_file: {key}}}\n  grpc_tls: {{cert_file: {cert}, key_file: {key}, client_ca_file: {}}}\n",
            file(&pki, "ca.pem")
        ),
    );
    let log = dir.0 .0.join("serve.log");
    let child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--config", &dir.config()])
        .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let server = serve_process::attach(child);
    let http = port(server.base.trim_start_matches("https://")).to_string();
    let grpc = port(server.grpc.trim_start_matches("http://")).to_string();
    let curl = |args: &[&str]| {
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "--max-time", "10"])
            .args(args)
            .output()
            .expect("curl");
        assert!(!out.status.success(), "curl {args:?} was served");
    };
    let (ca, other_ca) = (file(&pki, "ca.pem"), file(&pki, "other-ca.pem"));
    curl(&[&format!("http://127.0.0.1:{http}/healthcheck")]);
    curl(&[
        "--cacert",
        &other_ca,
        &format!("https://localhost:{http}/healthcheck"),
    ]);
    // A client that checks the name within the handshake (curl checks it after,
    // and just closes a handshake the listener completed).
    let s_client = Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{http}")])
        .args(["-CAfile", &ca, "-verify_hostname", "elsewhere.example"])
        .arg("-verify_return_error")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("openssl");
    assert!(!s_client.status.success());
    let grpc_url = format!("https://localhost:{grpc}/");
    curl(&["--http2", "--cacert", &ca, &grpc_url]);
    let (stranger, stranger_key) = (file(&pki, "stranger.pem"), file(&pki, "stranger.key"));
    curl(&[
        "--http2",
        "--cacert",
        &ca,
        "--cert",
        &stranger,
        "--key",
        &stranger_key,
        &grpc_url,
    ]);
    let out = Command::new("curl")
        .args(["-s", "--cacert", &ca])
        .arg(format!("https://localhost:{http}/metrics"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let count = |listener: &str, reason: &str| -> f64 {
        let series = format!(
            "tollgate_tls_handshake_failures_total{{listener=\"{listener}\",reason=\"{reason}\"}} "
        );
        (text.lines().find_map(|l| l.strip_prefix(&series)))
            .unwrap_or_else(|| panic!("{series} not in {text}"))
            .parse()
            .unwrap()
    };
    assert_eq!(count("http", "not_tls"), 1.0);
    assert_eq!(count("http", "refused_by_client"), 2.0);
    assert_eq!(count("grpc", "no_client_certificate"), 1.0);
    assert_eq!(count("grpc", "client_certificate_unknown_ca"), 1.0);
    assert_eq!(count("http", "timeout"), 0.0);
    // The first refusal of each listener is logged (the rest within a second are
    // counted only), with the peer and the reason.
    let logged = std::fs::read_to_string(&log).unwrap();
    let refused: Vec<&str> = (logged.lines())
        .filter(|l| l.contains("tls: handshake refused"))
        .collect();
    assert!(
        refused.iter().any(|l| l.contains("listen.http_tls")
            && l.contains("not_tls")
            && l.contains("127.0.0.1:")),
        "{logged}"
    );
    assert!(
        refused.iter().any(|l| l.contains("listen.grpc_tls")),
        "{logged}"
    );
    drop(server);
}
