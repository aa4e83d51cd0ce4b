//! The `tollgate` binary's crate: the rate-limit decision service, the limiting
//! reverse proxy, the offline tools and the load generators, over the `tollgate`
//! library. `main.rs` only parses the command line and calls [`cli::run`].
//!
//! Modules, with imports pointing one way (down this list, never up):
//!
//! - [`cli`]: the command line, parsing and dispatch to the commands below;
//! - [`service`]: `tollgate serve`: descriptor rules, decisions, HTTP/JSON, Envoy RLS
//!   gRPC, metrics;
//! - [`proxy`]: `tollgate proxy`: routes, keys, limits, forwarding;
//! - [`offline`]: `tollgate replay` and `tollgate simulate`, and charts;
//! - [`bench`](mod@bench): `tollgate bench`, load generators;
//! - [`connections`]: accepting and serving client connections within the
//!   `connections:` bounds (count, header, body and send timeouts);
//! - [`workers`]: the threads that serve connections, and which serves which;
//! - [`config`]: the main configuration file (listeners, `store:`, `keys:`, `admin:`,
//!   `proxy:`) and its validation;
//! - [`lifecycle`]: what reloads a server (SIGHUP, changed files) and what stops it;
//! - [`logging`]: where log lines go and their format (text or JSON).

#![forbid(unsafe_code)]

pub mod bench;
pub mod cli;
pub mod config;
pub mod connections;
pub mod console;
pub mod lifecycle;
pub mod logging;
pub mod offline;
pub mod process_metrics;
pub mod progress;
pub mod proxy;
pub mod service;
pub mod tls;
pub mod traces;
pub mod workers;
