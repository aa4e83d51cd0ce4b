//! The HTTP/JSON API: `/v1/check`, `/v1/acquire`, `/v1/config`, `/v1/reset`, Envoy
//! ratelimit's `/json`, `/healthcheck` and `/rlconfig`, `/healthz`, `/readyz`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tollgate::Op;

use crate::calls::HTTP_ROUTES;
use crate::descriptors::{DescriptorLimit, QuotaStrategy};
use crate::{Api, CheckResult, Code, DecisionService, DescriptorRequest};

/// The largest request body accepted.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// The longest `/v1/acquire` waits, whatever the policy's max-wait.
pub const MAX_ACQUIRE_WAIT: Duration = Duration::from_secs(30);

/// Envoy's `/json` in [`HTTP_ROUTES`].
const JSON_ROUTE: usize = 7;
const _: () = assert!(matches!(HTTP_ROUTES[JSON_ROUTE].as_bytes(), b"/json"));

/// Who may call admin endpoints.
#[derive(Debug, Clone)]
pub struct AdminAccess {
    /// A bearer token every admin call must carry, if set.
    pub token: Option<String>,
    /// Whether the HTTP listener is on a loopback address (admin allowed without a
    /// token only then).
    pub loopback: bool,
}

impl AdminAccess {
    /// The response refusing an admin call, or `None` when it may proceed.
    fn refusal(&self, headers: &HeaderMap) -> Option<Response> {
        match &self.token {
            Some(token) => {
                let given = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "));
                if given == Some(token.as_str()) {
                    None
                } else {
                    Some((StatusCode::UNAUTHORIZED, Json(json!({ "error": "admin endpoint: missing or wrong bearer token" }))).into_response())
                }
            }
            None if self.loopback => None,
            None => Some((
                StatusCode::FORBIDDEN,
                Json(json!({ "error": "admin endpoints are off on a non-loopback listener without admin.token" })),
            )
                .into_response()),
        }
    }
}

/// Answers `request` with `app` (the [`router`]), counting the call by route and
/// status and timing it: the one way `serve` calls its router. Envoy's `POST /json`
/// is answered here without `app` (as its `/json` route answers it), so layers added
/// to `app` do not see it.
pub async fn counted_call(
    service: Arc<DecisionService>,
    app: Router,
    request: axum::extract::Request,
) -> Result<Response, std::convert::Infallible> {
    use opentelemetry::context::FutureExt;
    use tower::ServiceExt;
    let started = service.now_ns();
    let route = HTTP_ROUTES.iter().position(|r| *r == request.uri().path());
    let span = (service.tracing()).and_then(|t| crate::spans::http_call(t, &request));
    // Envoy's `/json` is answered here rather than through the router: its routing,
    // extractors and layers cost about as much as the decision itself.
    let envoy = route == Some(JSON_ROUTE) && request.method() == http::Method::POST;
    let call = async {
        match envoy {
            true => Ok(envoy_json(&service, request.into_body()).await),
            false => app.oneshot(request).await,
        }
    };
    let response = match &span {
        Some(cx) => call.with_context(cx.clone()).await?,
        None => call.await?,
    };
    let status = response.status().as_u16();
    if let Some(cx) = &span {
        crate::spans::end_http(cx, status);
    }
    let seconds = service.now_ns().saturating_sub(started) as f64 / 1e9;
    (service.metrics()).http_call(route, status, seconds);
    Ok(response)
}

/// The router over a decision service.
pub fn router(service: Arc<DecisionService>, admin: AdminAccess) -> Router {
    let admin = Arc::new(admin);
    let reset_admin = admin.clone();
    Router::new()
        .route("/v1/check", post(check))
        .route("/v1/acquire", post(acquire))
        .route("/v1/charge", post(charge))
        .route(
            "/v1/reset",
            post(
                move |state: State<Arc<DecisionService>>,
                      headers: HeaderMap,
                      body: Result<Json<ResetBody>, JsonRejection>| async move {
                    match reset_admin.refusal(&headers) {
                        None => reset(state, body).await,
                        Some(r) => r,
                    }
                },
            ),
        )
        .route(
            "/v1/reload",
            post(
                move |State(service): State<Arc<DecisionService>>, headers: HeaderMap| async move {
                    if let Some(r) = admin.refusal(&headers) {
                        return r;
                    }
                    match service.reload("POST /v1/reload") {
                        Ok(()) => Json(json!({ "reloaded": true })).into_response(),
                        Err(e) => (
                            StatusCode::UNPROCESSABLE_ENTITY,
                            Json(json!({ "error": e.to_string() })),
                        )
                            .into_response(),
                    }
                },
            ),
        )
        .route("/v1/config", get(config))
        .route(
            "/rlconfig",
            get(|State(service): State<Arc<DecisionService>>| async move {
                // Rules from xDS: which version, on a first line of its own.
                let version = (service.xds_version()).map(|(server, v)| match v {
                    Some(v) => format!("# xDS {server}: version {v}\n"),
                    None => format!("# xDS {server}: no version yet\n"),
                });
                version.unwrap_or_default() + &service.rules().dump()
            }),
        )
        .route(
            "/json",
            post(
                |State(service): State<Arc<DecisionService>>, body: axum::body::Body| async move {
                    envoy_json(&service, body).await
                },
            ),
        )
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "OK\n" }))
        .route("/readyz", get(readyz))
        .route("/healthcheck", get(healthcheck))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(service)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckBody {
    domain: String,
    descriptors: Vec<DescriptorBody>,
    #[serde(default, alias = "hits_addend")]
    cost: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DescriptorBody {
    entries: Vec<EntryBody>,
    #[serde(default, alias = "hits_addend")]
    cost: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryBody {
    key: String,
    #[serde(default)]
    value: String,
}

/// Request entries as `(key, value)` pairs, moved out of the body.
fn pairs(entries: Vec<EntryBody>) -> Vec<(String, String)> {
    entries.into_iter().map(|e| (e.key, e.value)).collect()
}

impl CheckBody {
    /// The descriptors, moved out of the body (the service validates them).
    fn take_descriptors(&mut self) -> Vec<DescriptorRequest> {
        (std::mem::take(&mut self.descriptors).into_iter())
            .map(|d| DescriptorRequest {
                entries: pairs(d.entries),
                hits: d.cost,
                give_back: false,
                limit_override: None,
            })
            .collect()
    }
}

/// A 400 naming what is wrong with the request.
/// 400 for a bad request, 503 when the store cannot decide now.
fn request_error(e: crate::RequestError) -> Response {
    match e {
        crate::RequestError::Unavailable(_) | crate::RequestError::NoRules => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "error": e.to_string() })),
        )
            .into_response(),
        e => bad_request(e),
    }
}

fn bad_request(message: impl std::fmt::Display) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({ "error": message.to_string() })),
    )
        .into_response()
}

/// 400 (413 for a body over the limit, 415 without a JSON content type) with a JSON
/// error naming the problem.
fn rejected(e: JsonRejection) -> Response {
    if tollgate_runtime::connections::is_body_timeout(&e) {
        return (
            StatusCode::REQUEST_TIMEOUT,
            Json(json!({ "error": tollgate_runtime::connections::BodyTimedOut::MESSAGE })),
        )
            .into_response();
    }
    let status = match e.status() {
        // axum says 422 for well-formed JSON of the wrong shape; a bad body is a 400.
        StatusCode::UNPROCESSABLE_ENTITY => StatusCode::BAD_REQUEST,
        s => s,
    };
    (status, Json(json!({ "error": e.body_text() }))).into_response()
}

async fn check(
    State(service): State<Arc<DecisionService>>,
    body: Result<Json<CheckBody>, JsonRejection>,
) -> Response {
    decide(&service, body, Op::Try).await
}

/// `POST /v1/charge`: work already done (tokens, bytes, rows) charged to every
/// descriptor's limit, into debt if need be; answered as `/v1/check` (OK: a charge is
/// never refused for lack of budget; `limit_remaining` 0 while in debt).
async fn charge(
    State(service): State<Arc<DecisionService>>,
    body: Result<Json<CheckBody>, JsonRejection>,
) -> Response {
    decide(&service, body, Op::Charge).await
}

/// `/v1/check` and `/v1/charge`: the body's descriptors decided with `op`.
async fn decide(
    service: &DecisionService,
    body: Result<Json<CheckBody>, JsonRejection>,
    op: Op,
) -> Response {
    let mut body = match body {
        Ok(Json(b)) => b,
        Err(e) => return rejected(e),
    };
    let descriptors = body.take_descriptors();
    let hits = body.cost.unwrap_or(1);
    match service
        .check(Api::Tollgate, &body.domain, &descriptors, hits, op)
        .await
    {
        Ok(result) => respond(&service.answers().headers, &result),
        Err(e) => request_error(e),
    }
}

async fn acquire(
    State(service): State<Arc<DecisionService>>,
    body: Result<Json<CheckBody>, JsonRejection>,
) -> Response {
    let mut body = match body {
        Ok(Json(b)) => b,
        Err(e) => return rejected(e),
    };
    let descriptors = body.take_descriptors();
    let hits = body.cost.unwrap_or(1);
    let result = match service
        .check(Api::Tollgate, &body.domain, &descriptors, hits, Op::Acquire)
        .await
    {
        Ok(r) => r,
        Err(e) => return request_error(e),
    };
    let wait = Duration::from_micros(result.wait_us());
    if result.overall == Code::Ok && wait > MAX_ACQUIRE_WAIT {
        // Beyond the server's bound: give the reservations back and reject.
        service.refund(&result).await;
        let mut response = respond(&service.answers().headers, &result);
        *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        return response;
    }
    if result.overall == Code::Ok && !wait.is_zero() {
        // If the client goes away, axum drops this future: refund then (from a task
        // of its own: a refund may need Redis).
        let (svc, counted) = (service.clone(), result.clone());
        let guard = tollgate::wait::RefundOnDrop::new(move || {
            tokio::spawn(async move { svc.refund(&counted).await });
        });
        tollgate::wait::sleep_or_refund(service.turns(), wait, guard).await;
    }
    respond(&service.answers().headers, &result)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResetBody {
    domain: String,
    entries: Vec<EntryBody>,
}

async fn reset(
    State(service): State<Arc<DecisionService>>,
    body: Result<Json<ResetBody>, JsonRejection>,
) -> Response {
    let body = match body {
        Ok(Json(b)) => b,
        Err(e) => return rejected(e),
    };
    let entries = pairs(body.entries);
    match service.reset(&body.domain, &entries).await {
        Ok(true) => Json(json!({ "reset": true })).into_response(),
        Err(e) => request_error(crate::RequestError::Unavailable(e)),
        Ok(false) => (
            StatusCode::NOT_FOUND,
            Json(json!({ "error": "no rule matches this descriptor" })),
        )
            .into_response(),
    }
}

/// Envoy ratelimit's health check: `OK` while serving, 500 once the server is
/// draining (stopping), so that a load balancer stops sending before it is gone, and
/// (rules from xDS) while the rules it needs are not in force
/// ([`DecisionService::health`]).
async fn healthcheck(State(service): State<Arc<DecisionService>>) -> Response {
    match service.health() {
        Ok(()) => "OK\n".into_response(),
        Err(why) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{why}\n")).into_response(),
    }
}

/// Ready when the store answers (always, for the memory store) and not draining;
/// still ready, `degraded`, while some of a Cluster's nodes answer (the keys of the
/// others get the failure policy, on every instance alike: taking this one out of
/// service would not help).
async fn readyz(State(service): State<Arc<DecisionService>>) -> Response {
    if service.draining() {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining\n").into_response();
    }
    match service.ready().await {
        Ok(None) => "OK\n".into_response(),
        Ok(Some(away)) => format!("degraded: {away}\n").into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

/// The metrics listener's app: the metrics on `path`, nothing else.
pub fn metrics_router(service: Arc<DecisionService>, path: &str) -> Router {
    Router::new().route(path, get(metrics)).with_state(service)
}

async fn metrics(State(service): State<Arc<DecisionService>>) -> Response {
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        service.render_metrics(),
    )
        .into_response()
}

async fn config(State(service): State<Arc<DecisionService>>) -> Json<Value> {
    let rules = service.rules();
    let mut domains: Vec<_> = rules.domains().collect();
    domains.sort();
    let domains: Vec<Value> = domains
        .into_iter()
        .map(|(domain, source)| {
            let limits: Vec<Value> = rules
                .limits(domain)
                .iter()
                .map(|l| {
                    let mut v = serde_json::to_value(limit_out(l)).unwrap_or_default();
                    v["shadow_mode"] = json!(l.shadow);
                    v["replaces"] = json!(l.replaces);
                    v
                })
                .collect();
            json!({ "domain": domain, "source": source, "limits": limits })
        })
        .collect();
    let mut quota_rules: Vec<Value> = (rules.quota_rules())
        .map(|(domain, r)| {
            let mut v = json!({
                "domain": domain,
                "name": r.name,
                "bucket": r.pattern(),
                "assignment_ttl_ms": r.settings.ttl_us / 1000,
            });
            match &r.strategy {
                QuotaStrategy::Budget { policy, budget } => {
                    v["policy"] = json!(policy.to_string());
                    // What each bucket divides, as sent to the Envoys (a window
                    // budget as the token bucket that fits inside it).
                    v["divided_as"] = json!({
                        "rate_per_second": budget.rate.count as f64 * 1e6 / budget.rate.period_us as f64,
                        "burst": budget.burst,
                    });
                }
                QuotaStrategy::Blanket(b) => v["blanket"] = json!(b.name()),
            }
            v
        })
        .collect();
    // By domain, each domain's in the order they are matched (the first that takes
    // a bucket is its rule).
    quota_rules.sort_by(|a, b| a["domain"].as_str().cmp(&b["domain"].as_str()));
    // The buckets reported on now, with what the division holds for them.
    let buckets: Vec<Value> = (service.quota().views().into_iter())
        .map(|b| {
            let mut v = json!({
                "domain": b.domain,
                "bucket": b.bucket,
                "rule": b.rule,
                "reported_allowed": b.reported[0],
                "reported_denied": b.reported[1],
            });
            match &b.strategy {
                QuotaStrategy::Budget { policy, .. } => v["policy"] = json!(policy.to_string()),
                QuotaStrategy::Blanket(blanket) => v["blanket"] = json!(blanket.name()),
            }
            v[b.count.0] = json!(b.count.1);
            for (name, figure) in b.figures {
                v[name] = json!(figure);
            }
            v
        })
        .collect();
    let mut out = json!({
        "domains": domains,
        "quota_buckets": { "rules": quota_rules, "buckets": buckets, "streams": service.quota().streams() },
    });
    if let Some((server, version)) = service.xds_version() {
        out["xds"] = json!({ "server": server, "version": version });
    }
    Json(out)
}

/// The tollgate JSON answer: 200 or 429, `Retry-After` and RateLimit headers from the
/// binding decision.
#[derive(Serialize)]
struct CheckOut<'a> {
    overall_code: &'static str,
    statuses: Vec<StatusOut<'a>>,
}

#[derive(Serialize)]
struct StatusOut<'a> {
    code: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    limit: Option<LimitOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    limit_remaining: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reset_after_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    wait_ms: Option<u64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    shadow_rejected: bool,
}

#[derive(Serialize)]
struct LimitOut<'a> {
    descriptor: &'a str,
    name: Option<&'a str>,
    policies: Option<&'a [String]>,
    unlimited: bool,
    blocked: bool,
}

fn limit_out(l: &DescriptorLimit) -> LimitOut<'_> {
    LimitOut {
        descriptor: &l.path,
        name: l.name.as_deref(),
        policies: l.specs.as_deref(),
        unlimited: l.rules.is_none() && !l.deny,
        blocked: l.deny,
    }
}

/// The tollgate JSON answer: 200 or 429, `Retry-After` and the rate-limit headers
/// `service.headers` chooses, from the binding decision.
fn respond(style: &tollgate_runtime::config::Headers, result: &CheckResult) -> Response {
    let ms = |us: u64| us.div_ceil(1000);
    let statuses = result
        .statuses
        .iter()
        .map(|s| StatusOut {
            code: s.code.name(),
            limit: s.limit.as_deref().map(limit_out),
            limit_remaining: s.decision().map(|d| d.remaining),
            reset_after_ms: s.decision().map(|d| ms(d.reset_after_us)),
            retry_after_ms: s.decision().and_then(|d| d.retry_after_us).map(ms),
            wait_ms: s.decision().map(|d| d.wait_us).filter(|&w| w > 0).map(ms),
            shadow_rejected: s.shadow_rejected,
        })
        .collect();
    let body = CheckOut {
        overall_code: result.overall.name(),
        statuses,
    };
    let status = match result.overall {
        Code::Ok => StatusCode::OK,
        Code::OverLimit => StatusCode::TOO_MANY_REQUESTS,
    };
    let mut response = (status, Json(body)).into_response();
    headers(response.headers_mut(), style, result);
    response
}

fn headers(
    headers: &mut HeaderMap,
    style: &tollgate_runtime::config::Headers,
    result: &CheckResult,
) {
    let fields = crate::headers::response_headers(style, result, true);
    tollgate::headers::insert_all(headers, fields);
}

// --- Envoy ratelimit's /json: the proto3 JSON form of RateLimitRequest/Response. ---

/// envoyproxy/ratelimit's `/json`: a `RateLimitRequest` in proto3 JSON, answered
/// with the `RateLimitResponse` in proto3 JSON, 200 (OK) or 429 (OVER_LIMIT); 400 for
/// a body that is not such a request or that the service refuses (empty domain or
/// descriptors), naming what is wrong; 503 when the store cannot decide now.
async fn envoy_json(service: &DecisionService, body: axum::body::Body) -> Response {
    use http_body_util::BodyExt;
    let body = match http_body_util::Limited::new(body, MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) => return body_refused(&*e),
    };
    let request = match crate::envoy::request_from_json(&body) {
        Ok(r) => r,
        Err(e) => return bad_request(e),
    };
    match crate::envoy::decide(service, &request).await {
        Ok((result, headers)) => {
            let status = match result.overall {
                Code::OverLimit => StatusCode::TOO_MANY_REQUESTS,
                Code::Ok => StatusCode::OK,
            };
            let json = crate::envoy::response_json(&result, &headers);
            let mut response = Response::new(axum::body::Body::from(json));
            *response.status_mut() = status;
            let json_type = http::HeaderValue::from_static("application/json");
            response
                .headers_mut()
                .insert(http::header::CONTENT_TYPE, json_type);
            response
        }
        Err(e) => request_error(e),
    }
}

/// The answer to a body that could not be read whole: 408 when it stalled past the
/// body timeout, 413 past [`MAX_BODY_BYTES`], else 400, naming why (in the words of
/// the router's extractors, so every route says it alike).
fn body_refused(e: &(dyn std::error::Error + 'static)) -> Response {
    let (status, error) = if tollgate_runtime::connections::is_body_timeout(e) {
        let message = tollgate_runtime::connections::BodyTimedOut::MESSAGE;
        (StatusCode::REQUEST_TIMEOUT, message.to_string())
    } else if e.is::<http_body_util::LengthLimitError>() {
        let message = "Failed to buffer the request body: length limit exceeded";
        (StatusCode::PAYLOAD_TOO_LARGE, message.to_string())
    } else {
        let message = format!("Failed to buffer the request body: {e}");
        (StatusCode::BAD_REQUEST, message)
    };
    (status, Json(json!({ "error": error }))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Envoy's `/json` answers alike through the router (for a caller that mounts it)
    /// and through `counted_call` (which answers it before the router).
    #[tokio::test]
    async fn envoy_json_answers_alike_with_and_without_the_router() {
        use http_body_util::BodyExt;
        let service = Arc::new(DecisionService::example());
        let admin = AdminAccess {
            token: None,
            loopback: true,
        };
        let app = router(service.clone(), admin);
        let body =
            r#"{"domain":"example","descriptors":[{"entries":[{"key":"api_key","value":"r"}]}]}"#;
        let request = || {
            axum::http::Request::post("/json")
                .body(axum::body::Body::from(body))
                .unwrap()
        };
        let mut answers = Vec::new();
        for routed in [true, false] {
            let response = match routed {
                true => tower::ServiceExt::oneshot(app.clone(), request())
                    .await
                    .unwrap(),
                false => counted_call(service.clone(), app.clone(), request())
                    .await
                    .unwrap(),
            };
            let status = response.status();
            let kind = response.headers()[http::header::CONTENT_TYPE].clone();
            let bytes = response.into_body().collect().await.unwrap().to_bytes();
            let v: Value = serde_json::from_slice(&bytes).unwrap();
            answers.push((
                status,
                kind,
                v["overallCode"].clone(),
                v["statuses"][0]["limitRemaining"].clone(),
            ));
        }
        assert_eq!(answers[0].0, StatusCode::OK);
        assert_eq!(answers[0].1, "application/json");
        assert_eq!(answers[0].2, "OK");
        // The same key, one request apart.
        assert_eq!(
            answers[0].3.as_u64().unwrap(),
            answers[1].3.as_u64().unwrap() + 1
        );
        assert_eq!(answers[0].0, answers[1].0);
        assert_eq!(answers[0].1, answers[1].1);
        assert_eq!(answers[0].2, answers[1].2);
    }

    /// Every route of [`HTTP_ROUTES`] is served, and each call is counted under its route
    /// with its status; a path no route matches is counted as `other`.
    #[tokio::test]
    async fn each_call_is_counted_by_route_and_status() {
        let service = Arc::new(DecisionService::example());
        let admin = AdminAccess {
            token: None,
            loopback: true,
        };
        let app = router(service.clone(), admin);
        let call = |method: &str, path: &str| {
            let request = axum::http::Request::builder()
                .method(method)
                .uri(path)
                .header("content-type", "application/json")
                .body(axum::body::Body::from("{}"))
                .unwrap();
            counted_call(service.clone(), app.clone(), request)
        };
        let mut statuses = Vec::new();
        for route in HTTP_ROUTES {
            let get = call("GET", route).await.unwrap().status();
            let status = if get == StatusCode::METHOD_NOT_ALLOWED {
                call("POST", route).await.unwrap().status()
            } else {
                get
            };
            assert_ne!(status, StatusCode::NOT_FOUND, "{route} is not served");
            statuses.push((route, status));
        }
        call("GET", "/nowhere").await.unwrap();
        let text = service.render_metrics();
        for (route, status) in statuses {
            let line = format!(
                "tollgate_requests_total{{api=\"http\",method=\"{route}\",code=\"{}\"}} 1",
                status.as_u16()
            );
            assert!(text.contains(&line), "{line} in {text}");
            let count = format!(
                "tollgate_request_duration_seconds_count{{api=\"http\",method=\"{route}\"}}"
            );
            assert!(text.contains(&count), "{count} in {text}");
        }
        assert!(
            text.contains("tollgate_requests_total{api=\"http\",method=\"other\",code=\"404\"} 1"),
            "{text}"
        );
    }
}
