//! `tollgate proxy` terminating HTTPS, driven by curl (a client no one here wrote):
//! HTTP/1.1 and HTTP/2 (ALPN), a certificate per name (SNI, wildcards too) with the
//! first as the default, `limit_req` decisions the same over both protocols as nginx's
//! semantics give them, `Forwarded: ...;proto=https` upstream, plaintext refused, bad
//! settings named.

use std::process::{Command, Stdio};

use tollgate_testkit::{Pki, ScratchDir};

/// An upstream that echoes the `Forwarded` and `X-Forwarded-Proto` headers it got.
async fn upstream() -> String {
    let app = axum::Router::new().fallback(|headers: axum::http::HeaderMap| async move {
        let got = |name: &str| {
            let values: Vec<&str> = (headers.get_all(name).iter())
                .filter_map(|v| v.to_str().ok())
                .collect();
            values.join(" | ")
        };
        format!(
            "forwarded: {}; x-forwarded-proto: {}",
            got("forwarded"),
            got("x-forwarded-proto")
        )
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// `tollgate proxy --config FILE`: its child and the banner's first line.
fn start(config: &str) -> (tollgate_testkit::Killed, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["proxy", "--config", config, "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    (tollgate_testkit::Killed(child), line)
}

/// The port of the first `https://127.0.0.1:PORT` a banner names.
fn https_port(banner: &str) -> u16 {
    banner
        .split("https://127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no https port in {banner:?}"))
}

/// curl to `https://NAME:PORT/PATH` resolved to the proxy, verifying with the test
/// CA: (exit code, `http_version status body`).
fn curl(pki: &Pki, port: u16, name: &str, path: &str, extra: &[&str]) -> (i32, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(pki.path("ca.pem"))
        .args(["--resolve", &format!("{name}:{port}:127.0.0.1")])
        .args(["-H", "x-api-key: k1", "-w", " %{http_version} %{http_code}"])
        // What a client says of the scheme is not what the upstream hears.
        .args(["-H", "x-forwarded-proto: gopher"])
        .args(extra)
        .arg(format!("https://{name}:{port}{path}"))
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_terminates_https_for_http1_and_http2_with_a_certificate_per_name() {
    let pki = Pki::new();
    pki.issue("api", "DNS:api.example.test");
    pki.issue("apps", "DNS:*.apps.example.test");
    let up = upstream().await;
    let dir = ScratchDir::new("proxy-tls");
    let p = |n: &str| pki.path(n).display().to_string();
    let config = dir.write(
        "tollgate.yaml",
        &format!(
            "proxy:\n  metrics: 127.0.0.1:{metrics}\n  \
             metrics_tls: {{cert_file: {cert}, key_file: {key}}}\n  \
             tls:\n    cert_file: {cert}\n    key_file: {key}\n    certificates:\n      \
             - {{cert_file: {}, key_file: {}}}\n      - {{cert_file: {}, key_file: {}}}\n  \
             routes:\n    - name: api\n      match: {{path_prefix: /api/}}\n      upstream: {up}\n      \
             key: header:X-Api-Key\n      policies: [\"limit-req:rate=1/m,burst=2,nodelay\"]\n",
            p("api.pem"),
            p("api.key"),
            p("apps.pem"),
            p("apps.key"),
            cert = p("server.pem"),
            key = p("server.key"),
            metrics = tollgate_testkit::free_port(),
        ),
    );
    let (_proxy, banner) = start(&config);
    // The metrics listener speaks TLS too.
    assert!(banner.contains("metrics on https://127.0.0.1:"), "{banner}");
    let metrics_url = banner
        .split("metrics on ")
        .nth(1)
        .and_then(|r| r.split([')', ' ']).next())
        .unwrap()
        .to_string();
    let scrape = || {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "10", "--cacert"])
            .arg(pki.path("ca.pem"))
            .arg(&metrics_url)
            .output()
            .unwrap();
        assert!(out.status.success(), "{metrics_url}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = scrape();
    assert!(text.contains("# EOF"), "{metrics_url}: {text}");
    // Both listeners' certificates, with the days they have left (the test PKI's
    // certificates last 30 days), and the build.
    for listener in ["proxy", "metrics"] {
        let series =
            format!("tollgate_proxy_tls_certificate_expiry_days{{listener=\"{listener}\"}} ");
        let days: f64 = (text.lines())
            .find_map(|l| l.strip_prefix(series.as_str())?.parse().ok())
            .unwrap_or_else(|| panic!("{series} in {text}"));
        assert!(days > 29.0 && days <= 30.0, "{series}{days}");
    }
    assert!(text.contains("tollgate_build_info{"), "{text}");
    assert!(
        banner.contains("listening on https://127.0.0.1:"),
        "{banner}"
    );
    let port = https_port(&banner);

    // Plain HTTP on the HTTPS port is a refused handshake, counted by its reason.
    let plain = Command::new("curl")
        .args([
            "-s",
            "--max-time",
            "10",
            &format!("http://127.0.0.1:{port}/health"),
        ])
        .output()
        .unwrap();
    assert!(!plain.status.success());
    let text = scrape();
    let series =
        "tollgate_proxy_tls_handshake_failures_total{listener=\"proxy\",reason=\"not_tls\"} 1";
    assert!(text.lines().any(|l| l == series), "{series} not in {text}");

    // Each name gets its certificate (curl checks the name); a name without one gets
    // the default, which does not carry it.
    for name in ["localhost", "api.example.test", "x.apps.example.test"] {
        let (code, out) = curl(&pki, port, name, "/health", &["-o", "/dev/null"]);
        assert_eq!(code, 0, "{name}: {out}");
    }
    let (code, out) = curl(&pki, port, "other.example.test", "/health", &[]);
    assert_eq!(code, 60, "no certificate for that name: {out}");
    assert!(
        out.contains("localhost") || out.contains("no alternative"),
        "{out}"
    );

    // limit_req over HTTP/1.1 and HTTP/2 alike, one counter for the key: burst 2 and
    // nodelay admit three at once, then refuse, as nginx does.
    let mut seen = Vec::new();
    for (i, version) in ["--http1.1", "--http2", "--http1.1", "--http2"]
        .iter()
        .enumerate()
    {
        let (code, out) = curl(&pki, port, "api.example.test", "/api/x", &[version]);
        assert_eq!(code, 0, "{out}");
        let tail: Vec<&str> = out.split_whitespace().rev().take(2).collect();
        let expected_version = if *version == "--http2" { "2" } else { "1.1" };
        assert_eq!(tail[1], expected_version, "request {i}: {out}");
        if tail[0] == "200" {
            assert!(
                out.contains("proto=https"),
                "Forwarded tells the upstream: {out}"
            );
            assert!(
                out.contains("x-forwarded-proto: https "),
                "and X-Forwarded-Proto, alone: {out}"
            );
        }
        seen.push(tail[0].to_string());
    }
    assert_eq!(seen, ["200", "200", "200", "429"]);

    // Plaintext on the TLS port gets no HTTP answer.
    let plain = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "5",
            &format!("http://127.0.0.1:{port}/api/x"),
        ])
        .output()
        .unwrap();
    assert!(!plain.status.success(), "plaintext was answered");
}

/// What `tollgate proxy` says on stderr when `config` stops its start.
fn refused_start(dir: &ScratchDir, config: &str) -> String {
    let config = dir.write("tollgate.yaml", config);
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["proxy", "--config", &config, "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn bad_proxy_tls_settings_are_named() {
    let pki = Pki::new();
    let dir = ScratchDir::new("proxy-tls-bad");
    let p = |n: &str| pki.path(n).display().to_string();
    let refused = |tls: &str| {
        refused_start(
            &dir,
            &format!("proxy:\n  tls: {tls}\n  routes:\n    - name: a\n      upstream: http://127.0.0.1:9\n"),
        )
    };
    let e = refused(&format!(
        "{{cert_file: {}, key_file: {}, certificates: [{{cert_file: /nonexistent.pem, key_file: {}}}]}}",
        p("server.pem"),
        p("server.key"),
        p("server.key")
    ));
    assert!(
        e.contains("proxy.tls.certificates[0].cert_file /nonexistent.pem: cannot read it"),
        "{e}"
    );
    let e = refused(&format!(
        "{{cert_file: {}, key_file: {}}}",
        p("server.pem"),
        p("client.key")
    ));
    assert!(e.contains("does not match the certificate"), "{e}");
}

/// `https://` upstreams: the proxy verifies the upstream's certificate with the
/// route's CA and presents its client certificate (the upstream, a `tollgate serve`
/// with mutual TLS on its HTTP listener, refuses a client without one), for
/// HTTP/1.1 and HTTP/2 clients alike; a certificate that does not verify is a 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_speaks_tls_to_https_upstreams() {
    let pki = Pki::new();
    let dir = ScratchDir::new("proxy-tls-up");
    let p = |n: &str| pki.path(n).display().to_string();
    let serve_config = dir.write(
        "serve.yaml",
        &format!(
            "listen:\n  http_tls: {{cert_file: {}, key_file: {}, client_ca_file: {}}}\n",
            p("server.pem"),
            p("server.key"),
            p("ca.pem")
        ),
    );
    let upstream = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args([
            "serve",
            "--config",
            &serve_config,
            "--http",
            "127.0.0.1:0",
            "--grpc",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut upstream = tollgate_testkit::Killed(upstream);
    let mut banner = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(upstream.0.stdout.as_mut().unwrap()),
        &mut banner,
    )
    .unwrap();
    let port = https_port(&banner);
    std::fs::copy(pki.path("stranger.pem"), dir.0.join("proxy.pem")).unwrap();
    std::fs::copy(pki.path("stranger.key"), dir.0.join("proxy.key")).unwrap();
    let config = dir.write(
        "proxy.yaml",
        &format!(
            "proxy:\n  routes:\n    \
             - name: good\n      match: {{path_prefix: /v1/}}\n      upstream: https://localhost:{port}\n      \
               upstream_tls: {{ca_file: {ca}, cert_file: {cert}, key_file: {key}}}\n    \
             - name: stranger\n      match: {{path_prefix: /healthz}}\n      upstream: https://127.0.0.1:{port}\n      \
               upstream_tls: {{ca_file: {other}, cert_file: {cert}, key_file: {key}}}\n",
            ca = p("ca.pem"),
            cert = dir.0.join("proxy.pem").display(),
            key = dir.0.join("proxy.key").display(),
            other = p("other-ca.pem"),
        ),
    );
    let (_proxy, line) = start(&config);
    let base = line
        .split("listening on ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap()
        .to_string();
    let status = |path: &str, version: &str| {
        let out = Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "10",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                version,
            ])
            .arg(format!("{base}{path}"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    // The proxy's client certificate starts as one from another CA: the upstream
    // refuses it. Rotated in place (as a renewed secret), it is used by the next
    // connection, without a reload.
    assert_eq!(status("/v1/config", "--http1.1"), "502");
    std::fs::copy(pki.path("client.pem"), dir.0.join("proxy.pem")).unwrap();
    std::fs::copy(pki.path("client.key"), dir.0.join("proxy.key")).unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    assert_eq!(status("/v1/config", "--http1.1"), "200");
    assert_eq!(status("/v1/config", "--http2-prior-knowledge"), "200");
    assert_eq!(
        status("/v1/config", "--http1.1"),
        "200",
        "a kept TLS connection"
    );
    assert_eq!(
        status("/healthz", "--http1.1"),
        "502",
        "a CA that does not verify the upstream"
    );
}

#[test]
fn bad_upstream_tls_settings_are_named() {
    let pki = Pki::new();
    let dir = ScratchDir::new("proxy-tls-up-bad");
    let refused = |routes: &str| refused_start(&dir, &format!("proxy:\n  routes:\n{routes}"));
    let ca = pki.path("ca.pem").display().to_string();
    let e = refused(&format!(
        "    - {{name: a, upstream: 'http://127.0.0.1:9', upstream_tls: {{ca_file: {ca}}}}}\n"
    ));
    assert!(
        e.contains("proxy.routes[0].upstream_tls: the upstream is http://"),
        "{e}"
    );
    let e = refused("    - {name: a, upstream: 'https://127.0.0.1:9', upstream_tls: {ca_file: /nonexistent/ca.pem}}\n");
    assert!(
        e.contains("proxy.routes[0].upstream_tls.ca_file /nonexistent/ca.pem: cannot read it"),
        "{e}"
    );
    let e = refused(&format!(
        "    - {{name: a, upstream: 'https://127.0.0.1:9', upstream_tls: {{ca_file: {ca}}}}}\n    \
         - {{name: b, upstream: 'https://127.0.0.1:9'}}\n"
    ));
    assert!(
        e.contains("proxy.routes[1].upstream_tls: differs from route 'a'"),
        "{e}"
    );
}
