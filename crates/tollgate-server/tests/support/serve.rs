//! `tollgate serve` as a real process for tests: started on port 0, its addresses read
//! from its first line, killed on drop; and requests from a real HTTP client.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// A running `tollgate serve`.
pub struct Server {
    child: Child,
    /// `http://ADDR` of the HTTP API (`https://` over TLS).
    pub base: String,
    /// `http://ADDR` of the gRPC API.
    pub grpc: String,
    /// The first line it printed.
    pub banner: String,
}

impl Server {
    /// The process id (to signal it).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `tollgate serve ARGS --http 127.0.0.1:0 --grpc 127.0.0.1:0` with `env`.
pub fn start(args: &[&str], env: &[(&str, &str)]) -> Server {
    let child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .envs(env.iter().copied())
        .arg("serve")
        .args(args)
        .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    attach(child)
}

/// The server `child` runs (started with its stdout piped): its addresses read from
/// the banner; killed on drop.
pub fn attach(mut child: Child) -> Server {
    let mut banner = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut banner)
        .unwrap();
    let after = |marker: &str| {
        banner
            .split(marker)
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("no {marker} address in {banner:?}"))
            .to_string()
    };
    let (http, grpc) = (after("HTTP on "), after("gRPC on "));
    Server {
        child,
        base: http,
        grpc: format!("http://{grpc}"),
        banner,
    }
}

/// One HTTP request (JSON body, optional bearer token): status, headers, and the body
/// as JSON (or as a JSON string when it is not JSON).
pub async fn request(
    server: &Server,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> (u16, http::HeaderMap, Value) {
    request_to(&server.base, method, path, body, token).await
}

/// [`request`] to the HTTP API at `base` (`http://ADDR`).
pub async fn request_to(
    base: &str,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> (u16, http::HeaderMap, Value) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
    let mut req = http::Request::builder()
        .method(method)
        .uri(format!("{base}{path}"))
        .header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req
        .body(Full::new(bytes::Bytes::from(body.to_string())))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, headers, value)
}
