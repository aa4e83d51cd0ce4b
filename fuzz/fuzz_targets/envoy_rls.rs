//! Envoy's RLS `ShouldRateLimit` over gRPC: any body (framed as one gRPC message, or
//! raw) gets the gRPC status the framing rules give it, never a panic: a request the
//! service answers (OK, or INVALID_ARGUMENT for one it refuses); UNIMPLEMENTED for a
//! compressed message, RESOURCE_EXHAUSTED for one over the bound, INTERNAL for bytes
//! that are not one well-formed request message.
#![no_main]

use std::sync::{Arc, OnceLock};

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use libfuzzer_sys::fuzz_target;
use prost::Message;
use tollgate_service::grpc;
use tollgate_service::DecisionService;

fn service() -> &'static (tokio::runtime::Runtime, Arc<DecisionService>) {
    static SERVICE: OnceLock<(tokio::runtime::Runtime, Arc<DecisionService>)> = OnceLock::new();
    SERVICE.get_or_init(|| {
        let service = DecisionService::example();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        (runtime, Arc::new(service))
    })
}

fuzz_target!(|data: &[u8]| {
    let (runtime, service) = service();
    // Half the inputs framed as one message, so the fuzzer reaches the decision.
    let framed = data.first().is_some_and(|b| b % 2 == 0);
    let body = if framed {
        let message = &data[1..];
        let mut b = vec![0u8];
        b.extend_from_slice(&(message.len() as u32).to_be_bytes());
        b.extend_from_slice(message);
        b
    } else {
        data.to_vec()
    };
    let expected = refusal(&body);
    // The call as the HTTP/2 loop makes it: routed, then answered from its body.
    let content_type = http::HeaderValue::from_static("application/grpc");
    let method = grpc::route(grpc::PATH, Some(&content_type)).unwrap();
    let reply = runtime.block_on(grpc::answer(service, method, Ok(bytes::Bytes::from(body))));
    match reply {
        grpc::Reply::Status(status) => assert_eq!(status.code(), expected, "{status:?}"),
        grpc::Reply::Message(body) => {
            assert_eq!(expected, tonic::Code::InvalidArgument, "answered");
            let r = RateLimitResponse::decode(&body[5..]).unwrap();
            assert!(r.overall_code == 1 || r.overall_code == 2, "{r:?}");
        }
        grpc::Reply::UnsupportedMediaType => panic!("routed as gRPC"),
    }
});

/// The status a body that is refused gets, from the gRPC framing rules (a body that
/// is one decodable request: INVALID_ARGUMENT if the service refuses it, else it is
/// answered).
fn refusal(body: &[u8]) -> tonic::Code {
    if body.len() < 5 {
        return tonic::Code::Internal;
    }
    match body[0] {
        0 => {}
        1 => return tonic::Code::Unimplemented,
        _ => return tonic::Code::Internal,
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if len > grpc::MAX_MESSAGE_BYTES {
        return tonic::Code::ResourceExhausted;
    }
    if body.len() - 5 != len || RateLimitRequest::decode(&body[5..]).is_err() {
        return tonic::Code::Internal;
    }
    tonic::Code::InvalidArgument
}
