//! Envoy's rate limit service (`envoy.service.ratelimit.v3.RateLimitService/
//! ShouldRateLimit`), wire compatible, over the decision service; the message
//! conversions live in [`crate::service::envoy`].

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use crate::service::{DecisionService, RequestError};

/// The gRPC service.
pub struct Grpc {
    service: Arc<DecisionService>,
}

impl Grpc {
    /// The gRPC service over `service`, to call directly (tests, fuzzing).
    pub fn new(service: Arc<DecisionService>) -> Grpc {
        Grpc { service }
    }

    /// The tonic server for `service`.
    pub fn server(service: Arc<DecisionService>) -> RateLimitServiceServer<Grpc> {
        RateLimitServiceServer::new(Grpc { service })
    }
}

#[tonic::async_trait]
impl RateLimitService for Grpc {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        crate::service::envoy::should_rate_limit(&self.service, request.into_inner())
            .await
            .map(tonic::Response::new)
            .map_err(|e| match e {
                RequestError::Unavailable(m) => tonic::Status::unavailable(m),
                e => tonic::Status::invalid_argument(e.to_string()),
            })
    }
}
