//! The `tollgate` binary's crate, the composition root: the command line over every
//! part, and `serve`'s wiring. `main.rs` only parses the command line and calls
//! [`cli::run`].
//!
//! - [`cli`]: the command line, parsing and dispatch to every part (the proxy with
//!   the console mounted on it);
//! - [`serve`]: `tollgate serve` and `check-config`: the settings, the listeners,
//!   the decision service and the console wired together.
//!
//! The parts are crates below it, each of its own (`scripts/import-graph.py` checks
//! that every arrow points down): `tollgate-console` over `tollgate-service` and
//! `tollgate-offline`; `tollgate-proxy`; `tollgate-bench` over `tollgate-offline`;
//! all of them over `tollgate-runtime` (configuration, TLS, listeners, workers and
//! connections, traces, logging, metrics plumbing) and the `tollgate` library.

#![forbid(unsafe_code)]

pub mod cli;
pub mod serve;
