//! The proxy's whole request path on raw bytes: its HTTP/1.1 path (and hyper's, for
//! what that path hands over: HTTP/1.0, HTTP/2, upgrades), then routing,
//! key extraction (forwarded headers from a trusted peer, cookies, headers, path),
//! `limit_req` / `limit_conn`, tiers and the upstream request. Any bytes get an HTTP
//! answer or a closed connection, never a panic or a 500 (the upstream is a closed
//! port, so a forwarded request is a 502; a transfer coding other than chunked is a
//! 501).
#![no_main]

use std::net::SocketAddr;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate_proxy::ProxyApp;

const CONFIG: &str = r#"
proxy:
  trusted_proxies: [127.0.0.1/32, 10.0.0.0/8]
  connect_timeout: 50ms
  upstream_timeout: 50ms
  routes:
    - name: api
      match: { path_prefix: /api/ }
      upstream: http://127.0.0.1:9
      key: header:X-Api-Key+client_ip
      policies: ["limit-req:rate=10/s,burst=5,nodelay", "fixed-window:limit=50,window=1m"]
      limit_conn: 2
      tiers:
        - name: vip
          values: ["vip"]
          policies: ["gcra:rate=100/s,burst=50"]
      headers: both
    - name: site
      match: { host: example.com }
      upstream: http://127.0.0.1:9/base
      key: cookie:session+path
      policies: ["limit-req:rate=1/s,burst=2,nodelay"]
    - name: exact
      match: { path: /login }
      upstream: http://127.0.0.1:9
      key: client_ip
      policies: ["sliding-log:limit=3,window=1s"]
      dry_run: true
"#;

fn app() -> &'static (tokio::runtime::Runtime, ProxyApp) {
    static APP: OnceLock<(tokio::runtime::Runtime, ProxyApp)> = OnceLock::new();
    APP.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut main =
            tollgate_runtime::config::MainConfig::parse(CONFIG, std::path::Path::new(".")).unwrap();
        let options = main.key_options();
        let config = main.proxy.take().unwrap();
        let app = runtime.block_on(async { ProxyApp::new(config, options).unwrap() });
        (runtime, app)
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&peer, raw)) = data.split_first() else {
        return;
    };
    // A trusted peer (its forwarded headers believed) or not.
    let peer: SocketAddr = if peer % 2 == 0 {
        "127.0.0.1:4000".parse().unwrap()
    } else {
        "192.0.2.7:4000".parse().unwrap()
    };
    let (runtime, app) = app();
    let answer = runtime.block_on(async {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let served = async move { app.serve(server, peer).await };
        // The app lives as long as the process: the task may borrow it.
        let served = tokio::spawn(served);
        client.write_all(raw).await.unwrap();
        client.shutdown().await.unwrap();
        let mut answer = Vec::new();
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            client.read_to_end(&mut answer),
        )
        .await;
        served.abort();
        assert!(read.is_ok(), "no answer within 5 s to {:?}", String::from_utf8_lossy(raw));
        answer
    });
    let text = String::from_utf8_lossy(&answer);
    for (i, _) in text
        .match_indices("HTTP/1.1 5")
        .chain(text.match_indices("HTTP/1.0 5"))
    {
        let code = text.get(i + 9..i + 12).unwrap_or("");
        // 501: a transfer coding the proxy does not take (RFC 9112 6.1).
        assert!(
            matches!(code, "501" | "502" | "503" | "504"),
            "answered {code} to {:?}",
            String::from_utf8_lossy(raw)
        );
    }
});
