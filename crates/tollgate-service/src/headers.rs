//! The rate-limit headers of a decision service answer, in the style the main
//! config's `service.headers` chooses: the IETF fields (their one writer is
//! [`tollgate::headers`]), the draft-03 trio envoyproxy/ratelimit writes, both, or
//! none. Shared by the HTTP API and gRPC's `response_headers_to_add`.

use std::borrow::Cow;

use crate::{CheckResult, Code, EnvoyView};
use tollgate_runtime::config::Headers;

/// The headers for `result` under `style`; with `retry_after`, also `Retry-After` on
/// OVER_LIMIT (the HTTP API always sends it; gRPC only with the IETF style).
pub fn response_headers(
    style: &Headers,
    result: &CheckResult,
    retry_after: bool,
) -> Vec<(Cow<'static, str>, String)> {
    let mut out = Vec::new();
    let ietf = style.style.ietf();
    let retry = result.overall == Code::OverLimit && (retry_after || ietf);
    // Built only when something of it is sent (the policy list is formatted once per
    // limit, at load).
    if let Some(h) = (ietf || retry).then(|| ietf_headers(result)).flatten() {
        let retry = h.retry_after_header().filter(|_| retry);
        out.extend(retry.map(|(k, v)| (Cow::Borrowed(k), v)));
        if ietf {
            out.extend(h.into_ietf().map(|(k, v)| (Cow::Borrowed(k), v)));
        }
    }
    if style.style.legacy() {
        if let Some((limit, remaining, reset)) = draft03(result) {
            out.push((Cow::Owned(style.limit.clone()), limit.to_string()));
            out.push((Cow::Owned(style.remaining.clone()), remaining.to_string()));
            out.push((Cow::Owned(style.reset.clone()), reset.to_string()));
        }
    }
    out
}

/// The IETF headers of the binding descriptor's rule, named after its limit
/// (`default` when unnamed). None for a rule without policies
/// (`requests_per_unit: 0` denies with no quota to state).
fn ietf_headers(result: &CheckResult) -> Option<tollgate::headers::RateLimitHeaders> {
    let (limit, d) = result.binding()?;
    let policy = limit.policy_header.as_ref()?;
    Some(tollgate::headers::RateLimitHeaders::of(policy, d))
}

/// envoyproxy/ratelimit's draft-03 values `(limit, remaining, reset seconds)`, from
/// the descriptor it picks: the last one over the limit (outside quota mode), else
/// the first with the fewest requests remaining among those with a limit. The limit
/// is the requests per unit (a policy's headline limit for tollgate's `policies:`),
/// the reset the whole seconds to the end of the unit's window (rounded up).
pub fn draft03(result: &CheckResult) -> Option<(u64, u64, u64)> {
    let mut chosen: Option<EnvoyView> = None;
    for s in &result.statuses {
        let Some(view) = s.envoy_view() else { continue };
        let quota = s.limit.as_ref().is_some_and(|l| l.quota_mode);
        // The last over the limit wins; else the first with the fewest remaining.
        let over = s.code == Code::OverLimit && !quota;
        if over || chosen.is_none_or(|least| view.remaining < least.remaining) {
            chosen = Some(view);
        }
    }
    let view = chosen?;
    Some((
        view.per_unit,
        view.remaining,
        view.reset_after_us.div_ceil(1_000_000),
    ))
}
