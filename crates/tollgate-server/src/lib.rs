//! The `tollgate` binary's crate: the rate-limit decision service, the limiting
//! reverse proxy and the console, and the command line over every part. `main.rs`
//! only parses the command line and calls [`cli::run`].
//!
//! Modules (`scripts/import-graph.py` fails on an import cycle among them):
//!
//! - [`cli`]: the command line, parsing and dispatch to the commands below;
//! - [`serve`]: `tollgate serve` and `check-config`: the settings, the listeners,
//!   the decision service (the `tollgate-service` crate) and the console wired
//!   together;
//! - [`proxy`]: `tollgate proxy`: routes, keys, limits, forwarding;
//! - [`console`]: the web console, mounted by `serve` and the proxy.
//!
//! Below it, the crates of the load generators (`tollgate-bench`) and, under them,
//! the offline tools (`tollgate-offline`: `replay`, `simulate`, charts); below them
//! all, `tollgate-runtime`: configuration, TLS, listeners, workers and connections,
//! traces, logging, reloads and shutdown.

#![forbid(unsafe_code)]

pub mod cli;
pub mod console;
pub mod proxy;
pub mod serve;
