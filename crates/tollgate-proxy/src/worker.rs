//! One proxy worker thread's view: the shared routes, its own upstream connections
//! (hyper's and the fast path's) and the client connection bounds.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use super::routes::RouteTable;
use super::upstream::{StreamPool, UpstreamPool};
use tollgate_runtime::config::Connections;

/// One worker thread's view: the shared routes and its own upstream connections.
pub(super) struct Proxy {
    pub table: Arc<ArcSwap<RouteTable>>,
    /// hyper's connections (HTTP/2 clients, and what the fast path hands over).
    pub upstreams: UpstreamPool,
    /// The fast path's connections.
    pub conns: StreamPool,
    /// The client connection bounds (`connections:`).
    pub bounds: Connections,
    /// Traces, when on.
    pub tracing: Option<Arc<tollgate_runtime::traces::Tracing>>,
}

impl Proxy {
    /// One worker's request handling over the shared routes, with its own upstream
    /// connections.
    pub fn new(
        table: Arc<ArcSwap<RouteTable>>,
        connect_timeout: Duration,
        bounds: Connections,
        tracing: Option<Arc<tollgate_runtime::traces::Tracing>>,
    ) -> Arc<Proxy> {
        Arc::new(Proxy {
            table,
            upstreams: UpstreamPool::new(connect_timeout),
            conns: StreamPool::new(connect_timeout),
            bounds,
            tracing,
        })
    }
}
