//! What tollgate's parts run on, below the decision service, the proxy, the offline
//! tools and the load generators: it may use the `tollgate` library, never the parts
//! that run on it.
//!
//! Modules, with imports pointing one way (down this list, never up):
//!
//! - [`connections`]: accepting and serving client connections within the
//!   `connections:` bounds (count, header, body and send timeouts);
//! - [`workers`]: the threads that serve connections, and which serves which;
//! - [`traces`]: OpenTelemetry spans of decisions and their export (OTLP);
//! - [`config`]: the main configuration file (listeners, `store:`, `keys:`, `admin:`,
//!   `proxy:`, `traces:`, Envoy's environment) and its validation;
//! - [`tls`]: certificates and keys for the listeners, followed as they rotate;
//! - [`tls_refusals`]: the handshakes a listener refused, counted and logged;
//! - [`lifecycle`]: what reloads a server (SIGHUP, changed files) and what stops it;
//! - [`logging`]: where log lines go and their format (text or JSON);
//! - [`progress`]: the progress line of long offline runs;
//! - [`store_metrics`]: the Redis store's figures as the servers export them;
//! - [`process_metrics`]: what every server exports about itself (its build, the
//!   process's CPU and memory).

#![forbid(unsafe_code)]

pub mod config;
pub mod connections;
pub mod lifecycle;
pub mod logging;
pub mod process_metrics;
pub mod progress;
pub mod store_metrics;
pub mod tls;
pub mod tls_refusals;
pub mod traces;
pub mod workers;
