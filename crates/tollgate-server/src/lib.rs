//! The `tollgate` binary's crate: the rate-limit decision service, the limiting
//! reverse proxy, the offline tools and the load generators, over the `tollgate`
//! library. `main.rs` only parses the command line and calls [`cli::run`].
//!
//! Modules (`scripts/import-graph.py` fails on an import cycle among them):
//!
//! - [`cli`]: the command line, parsing and dispatch to the commands below;
//! - [`service`]: `tollgate serve`: descriptor rules, decisions, HTTP/JSON, Envoy RLS
//!   gRPC, metrics;
//! - [`proxy`]: `tollgate proxy`: routes, keys, limits, forwarding;
//! - [`offline`]: `tollgate replay` and `tollgate simulate`, and charts;
//! - [`bench`](mod@bench): `tollgate bench`, load generators;
//! - [`console`]: the web console, mounted by `serve` and the proxy;
//! - [`process_metrics`]: the process's own figures and build information.
//!
//! Below them all, the `tollgate-runtime` crate: configuration, TLS, listeners,
//! workers and connections, traces, logging, reloads and shutdown.

#![forbid(unsafe_code)]

pub mod bench;
pub mod cli;
pub mod console;
pub mod offline;
pub mod process_metrics;
pub mod proxy;
pub mod service;
