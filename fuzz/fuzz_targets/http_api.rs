//! The HTTP/JSON API's request decoding and checks, through the real router: any body
//! on `/v1/check`, Envoy's `/json` and `/v1/reset` gets a 2xx, 4xx (with the error
//! named) or 429, never a server error or a panic.
#![no_main]

use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::Request;
use libfuzzer_sys::fuzz_target;
use tollgate_service::http::{router, AdminAccess};
use tollgate_service::DecisionService;
use tower::ServiceExt;

fn app() -> &'static (tokio::runtime::Runtime, axum::Router) {
    static APP: OnceLock<(tokio::runtime::Runtime, axum::Router)> = OnceLock::new();
    APP.get_or_init(|| {
        let service = DecisionService::example();
        let admin = AdminAccess {
            token: None,
            loopback: true,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        (runtime, router(Arc::new(service), admin))
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&choice, body)) = data.split_first() else {
        return;
    };
    let path = ["/v1/check", "/json", "/v1/reset"][usize::from(choice) % 3];
    let (runtime, app) = app();
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_vec()))
        .unwrap();
    let response = runtime.block_on(app.clone().oneshot(request)).unwrap();
    assert!(
        !response.status().is_server_error(),
        "{path} answered {} to {:?}",
        response.status(),
        String::from_utf8_lossy(body)
    );
});
