//! Envoy's rate limit service (`envoy.service.ratelimit.v3.RateLimitService/
//! ShouldRateLimit`), wire compatible, over the decision service. Protocol types stay
//! here: conversions in, conversions out.

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as PbUnit, Code as PbCode, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use tollgate::Op;

use crate::service::rules::Unit;
use crate::service::{Code, DecisionService, DescriptorRequest, DescriptorStatus as ServiceStatus};

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

fn unit_of(unit: i32) -> Option<Unit> {
    Some(match PbUnit::try_from(unit).ok()? {
        PbUnit::Second => Unit::Second,
        PbUnit::Minute => Unit::Minute,
        PbUnit::Hour => Unit::Hour,
        PbUnit::Day => Unit::Day,
        PbUnit::Week => Unit::Week,
        PbUnit::Month => Unit::Month,
        PbUnit::Year => Unit::Year,
        PbUnit::Unknown => return None,
    })
}

fn pb_unit(unit: Unit) -> PbUnit {
    match unit {
        Unit::Second => PbUnit::Second,
        Unit::Minute => PbUnit::Minute,
        Unit::Hour => PbUnit::Hour,
        Unit::Day => PbUnit::Day,
        Unit::Week => PbUnit::Week,
        Unit::Month => PbUnit::Month,
        Unit::Year => PbUnit::Year,
    }
}

fn duration(us: u64) -> PbDuration {
    PbDuration {
        seconds: (us / 1_000_000) as i64,
        nanos: ((us % 1_000_000) * 1000) as i32,
    }
}

/// A request's descriptor as the service takes it.
fn descriptor_request(d: &RateLimitDescriptor) -> DescriptorRequest {
    DescriptorRequest {
        entries: d
            .entries
            .iter()
            .map(|e| (e.key.clone(), e.value.clone()))
            .collect(),
        hits: d.hits_addend.map(|h| h.value),
        limit_override: d
            .limit
            .as_ref()
            .and_then(|l| Some((unit_of(l.unit)?, u64::from(l.requests_per_unit)))),
    }
}

fn pb_code(code: Code) -> i32 {
    let code = match code {
        Code::Ok => PbCode::Ok,
        Code::OverLimit => PbCode::OverLimit,
    };
    code as i32
}

/// A descriptor's status as Envoy reads it: the limit in Envoy's terms (its unit, or
/// the policy's headline limit with an unknown unit), remaining and time to reset.
fn descriptor_status(s: &ServiceStatus) -> DescriptorStatus {
    let mut status = DescriptorStatus {
        code: pb_code(s.code),
        ..Default::default()
    };
    if s.limit
        .as_ref()
        .is_some_and(|l| l.rules.is_none() && !l.deny)
    {
        // Unlimited: OK with the most remaining there is, as Envoy's service.
        status.limit_remaining = u32::MAX;
    }
    if let (Some(limit), Some(d)) = (&s.limit, s.decision()) {
        let (unit, per_unit) = match limit.envoy {
            Some((unit, n)) => (pb_unit(unit), n),
            None => (PbUnit::Unknown, d.limit),
        };
        status.current_limit = Some(RateLimit {
            name: limit.name.clone().unwrap_or_default(),
            requests_per_unit: u32::try_from(per_unit).unwrap_or(u32::MAX),
            unit: unit as i32,
        });
        status.limit_remaining = u32::try_from(d.remaining).unwrap_or(u32::MAX);
        status.duration_until_reset = Some(duration(d.reset_after_us));
    }
    status
}

#[tonic::async_trait]
impl RateLimitService for Grpc {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let req = request.into_inner();
        let descriptors: Vec<DescriptorRequest> =
            req.descriptors.iter().map(descriptor_request).collect();
        // hits_addend unset or 0 means 1, as Envoy.
        let hits = u64::from(req.hits_addend.max(1));
        let result = self
            .service
            .check(&req.domain, &descriptors, hits, Op::Try)
            .await
            .map_err(|e| match e {
                crate::service::RequestError::Unavailable(m) => tonic::Status::unavailable(m),
                e => tonic::Status::invalid_argument(e.to_string()),
            })?;
        let response_headers_to_add = crate::service::http::rate_limit_headers(&result)
            .into_iter()
            .map(|(key, value)| HeaderValue {
                key: key.to_string(),
                value,
                ..Default::default()
            })
            .collect();
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: pb_code(result.overall),
            statuses: result.statuses.iter().map(descriptor_status).collect(),
            response_headers_to_add,
            ..Default::default()
        }))
    }
}
