//! Envoy's RLS `ShouldRateLimit`: any protobuf bytes either fail to decode or are a
//! request the service answers (a response or an INVALID_ARGUMENT status), never a
//! panic or an internal error.
#![no_main]

use std::sync::{Arc, OnceLock};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use tollgate_server::service::grpc::Grpc;
use tollgate_server::service::rules::DescriptorRules;
use tollgate_server::service::DecisionService;

fn grpc() -> &'static (tokio::runtime::Runtime, Grpc) {
    static GRPC: OnceLock<(tokio::runtime::Runtime, Grpc)> = OnceLock::new();
    GRPC.get_or_init(|| {
        let options = tollgate::KeyedOptions::default();
        let service = DecisionService::new(DescriptorRules::built_in(options), vec![], options);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        (runtime, Grpc::new(Arc::new(service)))
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(request) = RateLimitRequest::decode(data) else {
        return;
    };
    let (runtime, grpc) = grpc();
    match runtime.block_on(grpc.should_rate_limit(tonic::Request::new(request))) {
        Ok(response) => {
            let r = response.into_inner();
            assert!(r.overall_code == 1 || r.overall_code == 2, "{r:?}");
        }
        Err(status) => assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}"),
    }
});
