//! `tollgate proxy`: a limiting reverse proxy (nginx `limit_req` / `limit_conn`
//! semantics) configured by the `proxy:` section of the main config.
//!
//! A request goes down this list: [`server`] receives it on a worker (`worker`: its
//! routes and connections) — an HTTP/1.1 request on the fast path (`h1`), anything
//! else through hyper; `routes` picks its route; `admission` meets the route: `keys`
//! makes its key, `limits` checks the rate counters and takes a `limit_conn` permit,
//! `adaptive` a permit of the route's adaptive concurrency limit; `h1` or `forwarding`
//! sends it upstream over `upstream`'s kept connections; `cost` reads what the response
//! says it used and charges it; `problem` writes the proxy's own answers; `observe` counts
//! each answer in its route's `route_stats` and traces it (`traces:`); `metrics`
//! serves those counts, the adaptive limits' state and the charges (`proxy.metrics`).
//!
//! It uses the `tollgate` library and the runtime; the console on its metrics listener
//! is mounted by whoever runs it ([`ConsoleMount`]: the binary).

#![forbid(unsafe_code)]

mod adaptive;
mod admission;
mod ask_usage;
mod cost;
mod forwarding;
mod h1;
pub mod keys;
mod limits;
mod metrics;
mod observe;
mod problem;
mod route_stats;
mod routes;
pub mod server;
mod upstream;
mod worker;

pub use server::{command, load, run, ConsoleMount, ConsoleSource, ProxyApp, ProxyArgs};
