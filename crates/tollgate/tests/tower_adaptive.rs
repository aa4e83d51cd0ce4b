//! AdaptiveConcurrencyLayer: sheds with 503 + Retry-After, classifies responses into
//! the limiter's outcomes, admits by priority, shares one limit across clones.

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tollgate::adaptive::{AdaptiveLimiter, Request as Admission};
use tollgate::clock::TokioClock;
use tollgate::tower::{AdaptiveConcurrencyLayer, ResponseClass};
use tower::{service_fn, Layer, Service, ServiceExt};

fn limiter(spec: &str) -> AdaptiveLimiter<TokioClock> {
    AdaptiveLimiter::with_clock(spec.parse().unwrap(), false, TokioClock::new())
}

/// A service answering after the `x-sleep-ms` header's milliseconds with the
/// `x-status` header's status (200 without one).
async fn answer(req: Request<()>) -> Result<Response<String>, Infallible> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
    };
    tokio::time::sleep(Duration::from_millis(header("x-sleep-ms").unwrap_or(0))).await;
    let mut res = Response::new("ok".to_string());
    *res.status_mut() = StatusCode::from_u16(header("x-status").unwrap_or(200) as u16).unwrap();
    Ok(res)
}

fn request(sleep_ms: u64, status: u16, priority: &str) -> Request<()> {
    Request::builder()
        .header("x-sleep-ms", sleep_ms)
        .header("x-status", status)
        .header("x-priority", priority)
        .body(())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_request_over_the_limit_is_shed_with_503_and_retry_after() {
    let layer = AdaptiveConcurrencyLayer::new(limiter("gradient:initial=1,queue=0"));
    let svc = layer.layer(service_fn(answer));
    let slow = tokio::spawn(svc.clone().oneshot(request(100, 200, "normal")));
    tokio::time::sleep(Duration::from_millis(1)).await;
    let res = svc
        .clone()
        .oneshot(request(0, 200, "normal"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["retry-after"], "1");
    assert_eq!(slow.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(layer.limiter().stats().shed.busy, 1);
}

#[tokio::test(start_paused = true)]
async fn overload_answers_bring_the_limit_down_and_client_errors_do_not() {
    let layer = AdaptiveConcurrencyLayer::new(limiter("aimd:initial=20,backoff=0.5"));
    let svc = layer.layer(service_fn(answer));
    // A window of ten client errors: ignored, the limit stays.
    for _ in 0..10 {
        svc.clone()
            .oneshot(request(1, 404, "normal"))
            .await
            .unwrap();
    }
    assert_eq!(layer.limiter().limit(), 20);
    // Twenty 503s from upstream: dropped, the limit halves.
    for _ in 0..20 {
        svc.clone()
            .oneshot(request(1, 503, "normal"))
            .await
            .unwrap();
    }
    assert_eq!(layer.limiter().limit(), 10);
}

#[tokio::test(start_paused = true)]
async fn a_custom_classifier_and_priorities_from_the_request() {
    let layer = AdaptiveConcurrencyLayer::new(limiter("aimd:initial=1,min=1,max=1,queue-delay=1s"))
        .prioritize(|req: &Request<()>| {
            let p = req.headers()["x-priority"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap_or_default();
            Admission::new(p)
        })
        // This service says "overloaded" with 500.
        .classify(|res: &Response<String>| match res.status().as_u16() {
            500 => ResponseClass::Dropped,
            _ => ResponseClass::Success,
        });
    let mut svc = layer.layer(service_fn(answer));
    let busy = tokio::spawn(svc.clone().oneshot(request(50, 200, "normal")));
    tokio::time::sleep(Duration::from_millis(1)).await;
    let low = tokio::spawn(svc.clone().oneshot(request(0, 200, "sheddable")));
    tokio::time::sleep(Duration::from_millis(1)).await;
    let high = tokio::spawn(svc.ready().await.unwrap().call(request(0, 200, "critical")));
    assert_eq!(
        low.await.unwrap().unwrap().status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(high.await.unwrap().unwrap().status(), StatusCode::OK);
    busy.await.unwrap().unwrap();
    let s = layer.limiter().stats();
    assert_eq!(
        (s.admitted, s.shed.outranked, s.shed_by_class),
        (2, 1, [1, 0, 0])
    );
}
