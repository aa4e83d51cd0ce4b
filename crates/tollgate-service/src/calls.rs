//! What the servers in front of the decision service answer, named once for them and
//! their metrics: the gRPC methods, the HTTP routes, a call's code. A leaf.

use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};

/// The gRPC methods served.
#[derive(Debug, Clone, Copy)]
pub enum Method {
    /// Envoy's `ShouldRateLimit`.
    ShouldRateLimit,
    /// gRPC's health check (`grpc.health.v1.Health/Check`).
    HealthCheck,
    /// Envoy's `StreamRateLimitQuotas` (a stream, not a unary call).
    StreamRateLimitQuotas,
}

impl Method {
    /// Every method, in declaration order (`method as usize` indexes it).
    pub const ALL: [Method; 3] = [
        Method::ShouldRateLimit,
        Method::HealthCheck,
        Method::StreamRateLimitQuotas,
    ];

    /// Its name, as its service names it (envoyproxy/ratelimit's statistics and
    /// gRPC's own metrics name methods so).
    pub fn name(self) -> &'static str {
        match self {
            Method::ShouldRateLimit => "ShouldRateLimit",
            Method::HealthCheck => "Check",
            Method::StreamRateLimitQuotas => "StreamRateLimitQuotas",
        }
    }
}

/// The routes of the HTTP API: a call's `method` label in `tollgate_requests_total`
/// (`other` for a path none matches).
pub const HTTP_ROUTES: [&str; 12] = [
    "/v1/check",
    "/v1/acquire",
    "/v1/charge",
    "/v1/reset",
    "/v1/reload",
    "/v1/config",
    "/rlconfig",
    "/json",
    "/metrics",
    "/healthz",
    "/readyz",
    "/healthcheck",
];

/// The `code` of a call: the name of its gRPC status, as gRPC's own libraries name
/// them (`OK`, `Unavailable`, ...), or its HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallCode {
    /// A gRPC status.
    Grpc(tonic::Code),
    /// An HTTP status.
    Http(u16),
}

impl EncodeLabelValue for CallCode {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        use std::fmt::Write;
        match self {
            CallCode::Grpc(code) => encoder.write_str(grpc_code_name(*code)),
            CallCode::Http(status) => write!(encoder, "{status}"),
        }
    }
}

/// gRPC's names of its status codes (as Go's `codes.Code.String()`).
fn grpc_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}
