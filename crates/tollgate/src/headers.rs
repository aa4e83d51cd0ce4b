//! The rate-limit response headers, written in one place for every entry point: the
//! tower layer, the service's HTTP API and its gRPC `response_headers_to_add`, and the
//! proxy. Plain `(name, value)` strings, so no HTTP crate is needed to use them.
//!
//! What they mean (the IETF httpapi RateLimit header fields, structured-field form):
//!
//! - `RateLimit-Policy`: one item per policy of the rule set that decided, named after
//!   the limit (`"NAME"` for a single policy; `"NAME.0"`, `"NAME.1"`, ... in rule-set
//!   order for several), with `q` = the policy's headline limit (the most unit requests
//!   an idle key admits at once) and `w` = the time that limit refers to, in whole
//!   seconds rounded up ([`Policy::window_us`]: a window's length, or how long an empty
//!   state takes to refill; left out for `concurrency`, which has none).
//! - `RateLimit`: the binding policy's item (the one with the fewest requests left,
//!   or the one that rejected) with `r` = requests it still admits now, after this one,
//!   and `t` = seconds until it is whole again (rounded up).
//! - `Retry-After` (on a reject only): whole seconds until the same request could pass,
//!   rounded up, so a client never retries early; absent when no wait is known to help.
//! - The legacy `X-RateLimit-Limit` / `-Remaining` / `-Reset` (binding policy's `q`, `r`
//!   and `t`), for clients that predate the IETF fields.
//!
//! ```
//! use tollgate::headers::RateLimitHeaders;
//! use tollgate::{Op, RuleSet};
//!
//! let rules = RuleSet::parse(&["gcra:rate=10/s,burst=5", "fixed-window:limit=100,window=1m"])?;
//! let mut states = rules.init(0);
//! let d = rules.check(&mut states, 0, 1, Op::Try)?;
//! let h = RateLimitHeaders::new("api", &rules, &d);
//! assert_eq!(h.policy(), "\"api.0\";q=5;w=1, \"api.1\";q=100;w=60");
//! assert_eq!(h.current(), "\"api.0\";r=4;t=1");
//! assert_eq!(h.retry_after(), None);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use tollgate_core::{Policy, RuleDecision, RuleSet};

/// Which rate-limit headers a response carries: the one style setting of `serve`
/// (`service.headers.style`), the proxy (a route's `headers`) and the tower layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderStyle {
    /// `RateLimit-Policy` and `RateLimit` (IETF httpapi, structured fields).
    #[default]
    Ietf,
    /// The three-field set: limit, remaining, reset (`X-RateLimit-*` from
    /// [`RateLimitHeaders::legacy`]; `serve` names them as envoyproxy/ratelimit's
    /// draft-03 headers, configurable).
    Legacy,
    /// Both sets.
    Both,
    /// No rate-limit headers.
    None,
}

impl HeaderStyle {
    /// Whether the IETF fields are sent.
    pub fn ietf(self) -> bool {
        matches!(self, HeaderStyle::Ietf | HeaderStyle::Both)
    }

    /// Whether the three-field set is sent.
    pub fn legacy(self) -> bool {
        matches!(self, HeaderStyle::Legacy | HeaderStyle::Both)
    }
}

/// Inserts `fields` into an http header map: the one loop every HTTP entry point
/// writes its rate-limit headers with (a value that is not a valid header value is
/// left out; none of ours is). Feature `http`.
#[cfg(feature = "http")]
pub fn insert_all<N: AsRef<str>>(
    headers: &mut http::HeaderMap,
    fields: impl IntoIterator<Item = (N, String)>,
) {
    for (name, value) in fields {
        let name = http::HeaderName::from_bytes(name.as_ref().as_bytes());
        if let (Ok(name), Ok(value)) = (name, http::HeaderValue::try_from(value)) {
            headers.insert(name, value);
        }
    }
}

/// The rate-limit headers of one decision (see the module doc for their meaning).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitHeaders {
    policy: String,
    current: String,
    retry_after_s: Option<u64>,
    limit: u64,
    remaining: u64,
    reset_s: u64,
}

/// Microseconds as whole seconds, rounded up (a client must not act early).
fn seconds(us: u64) -> u64 {
    us.div_ceil(1_000_000)
}

/// `n` in decimal, written without the formatting machinery (several times the cost
/// on a path every request takes): for answers and headers written per request.
///
/// ```
/// use tollgate::headers::Decimal;
/// let mut out = String::from("r=");
/// out.push_str(Decimal::new(1_000_007).as_str());
/// assert_eq!(out, "r=1000007");
/// assert_eq!(Decimal::new(0).as_bytes(), b"0");
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Decimal {
    digits: [u8; 20],
    at: usize,
}

impl Decimal {
    /// The digits of `n`.
    pub fn new(mut n: u64) -> Self {
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        loop {
            at -= 1;
            digits[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        Decimal { digits, at }
    }

    /// The digits as ASCII bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.digits[self.at..]
    }

    /// The digits as text.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).expect("ASCII digits")
    }
}

/// Appends `n` in decimal to `out` (see [`Decimal`]).
pub fn push_decimal(out: &mut String, n: u64) {
    out.push_str(Decimal::new(n).as_str());
}

/// What a limit's headers say whatever the decision: its `RateLimit-Policy` value and
/// each policy's item name. Formatting them is most of the headers' cost, so a
/// server makes this once per limit and each decision's headers with
/// [`RateLimitHeaders::of`].
///
/// ```
/// use tollgate::headers::{PolicyHeader, RateLimitHeaders};
/// use tollgate::{Op, RuleSet};
///
/// let rules = RuleSet::parse(&["fixed-window:limit=100,window=1m"])?;
/// let policy = PolicyHeader::new("api", &rules); // once
/// let mut states = rules.init(0);
/// let d = rules.check(&mut states, 0, 1, Op::Try)?; // per request
/// assert_eq!(RateLimitHeaders::of(&policy, &d), RateLimitHeaders::new("api", &rules, &d));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyHeader {
    value: String,
    /// `"NAME"` for a single policy; `"NAME.i"` for policy `i` of several.
    items: Vec<String>,
}

impl PolicyHeader {
    /// The policy header of `rules` for a limit called `name`.
    pub fn new(name: &str, rules: &RuleSet) -> Self {
        let policies = rules.policies();
        let items: Vec<String> = (0..policies.len())
            .map(|i| match policies.len() {
                1 => format!("\"{name}\""),
                _ => format!("\"{name}.{i}\""),
            })
            .collect();
        let value = policies
            .iter()
            .zip(&items)
            .map(|(p, item)| RateLimitHeaders::policy_item(item, p))
            .collect::<Vec<_>>()
            .join(", ");
        PolicyHeader { value, items }
    }

    /// The `RateLimit-Policy` value.
    pub fn value(&self) -> &str {
        &self.value
    }
}

impl RateLimitHeaders {
    /// The headers of `d`, a decision of `rules` for a limit called `name` (a server
    /// answering many decisions makes the [`PolicyHeader`] once and calls
    /// [`RateLimitHeaders::of`]).
    pub fn new(name: &str, rules: &RuleSet, d: &RuleDecision) -> Self {
        Self::of(&PolicyHeader::new(name, rules), d)
    }

    /// The headers of `d`, a decision of the rules `policy` was made for.
    pub fn of(policy: &PolicyHeader, d: &RuleDecision) -> Self {
        let overall = &d.decision;
        let binding = d.policies.get(d.binding).unwrap_or(overall);
        let reset_s = seconds(binding.reset_after_us);
        let item = policy.items.get(d.binding).map_or("", String::as_str);
        RateLimitHeaders {
            policy: policy.value.clone(),
            current: {
                // Every answer's path: written without the formatting machinery.
                let mut current = String::with_capacity(item.len() + 26);
                current.push_str(item);
                current.push_str(";r=");
                push_decimal(&mut current, binding.remaining);
                current.push_str(";t=");
                push_decimal(&mut current, reset_s);
                current
            },
            retry_after_s: (!overall.allowed)
                .then_some(overall.retry_after_us)
                .flatten()
                .map(seconds),
            limit: binding.limit,
            remaining: binding.remaining,
            reset_s,
        }
    }

    fn policy_item(item: &str, p: &Policy) -> String {
        match p.window_us() {
            0 => format!("{item};q={}", p.limit()),
            w => format!("{item};q={};w={}", p.limit(), seconds(w)),
        }
    }

    /// The `RateLimit-Policy` value.
    pub fn policy(&self) -> &str {
        &self.policy
    }

    /// The `RateLimit` value.
    pub fn current(&self) -> &str {
        &self.current
    }

    /// The `Retry-After` value in seconds, on a reject whose retry time is known.
    pub fn retry_after(&self) -> Option<u64> {
        self.retry_after_s
    }

    /// `RateLimit-Policy` and `RateLimit`, with lower-case names.
    pub fn ietf(&self) -> [(&'static str, String); 2] {
        [
            ("ratelimit-policy", self.policy.clone()),
            ("ratelimit", self.current.clone()),
        ]
    }

    /// [`ietf`](Self::ietf), its values moved out rather than copied.
    pub fn into_ietf(self) -> [(&'static str, String); 2] {
        [
            ("ratelimit-policy", self.policy),
            ("ratelimit", self.current),
        ]
    }

    /// `X-RateLimit-Limit`, `-Remaining` and `-Reset`, with lower-case names.
    pub fn legacy(&self) -> [(&'static str, String); 3] {
        [
            ("x-ratelimit-limit", self.limit.to_string()),
            ("x-ratelimit-remaining", self.remaining.to_string()),
            ("x-ratelimit-reset", self.reset_s.to_string()),
        ]
    }

    /// `Retry-After`, on a reject whose retry time is known.
    pub fn retry_after_header(&self) -> Option<(&'static str, String)> {
        self.retry_after_s.map(|s| ("retry-after", s.to_string()))
    }

    /// The fields `style` asks for, after `Retry-After` (on a reject) when
    /// `retry_after`.
    pub fn fields(
        &self,
        style: HeaderStyle,
        retry_after: bool,
    ) -> impl Iterator<Item = (&'static str, String)> {
        let retry = self.retry_after_header().filter(|_| retry_after);
        let ietf = style.ietf().then(|| self.ietf());
        let legacy = style.legacy().then(|| self.legacy());
        (retry.into_iter())
            .chain(ietf.into_iter().flatten())
            .chain(legacy.into_iter().flatten())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::Op;

    #[test]
    fn decimals_are_written_as_to_string_writes_them() {
        for n in [0, 7, 10, 19, 1_000, u64::from(u32::MAX), u64::MAX] {
            let mut out = String::new();
            push_decimal(&mut out, n);
            assert_eq!(out, n.to_string());
        }
    }

    #[test]
    fn a_single_policy_is_named_after_the_limit_and_a_reject_carries_retry_after() {
        let rules = RuleSet::parse(&["fixed-window:limit=2,window=1m"]).unwrap();
        let mut s = rules.init(0);
        let d = rules.check(&mut s, 0, 1, Op::Try).unwrap();
        let h = RateLimitHeaders::new("login", &rules, &d);
        assert_eq!(h.policy(), "\"login\";q=2;w=60");
        assert_eq!(h.current(), "\"login\";r=1;t=60");
        assert_eq!(h.retry_after_header(), None);
        let _ = rules.check(&mut s, 0, 1, Op::Try).unwrap();
        let d = rules.check(&mut s, 500_000, 1, Op::Try).unwrap();
        let h = RateLimitHeaders::new("login", &rules, &d);
        // 59.5 s to wait: 60, rounded up.
        assert_eq!(h.retry_after_header(), Some(("retry-after", "60".into())));
        assert_eq!(
            h.legacy(),
            [
                ("x-ratelimit-limit", "2".into()),
                ("x-ratelimit-remaining", "0".into()),
                ("x-ratelimit-reset", "60".into())
            ]
        );
    }

    #[test]
    fn a_rule_set_lists_every_policy_and_names_the_binding_one() {
        let rules =
            RuleSet::parse(&["gcra:rate=1/s,burst=10", "fixed-window:limit=2,window=1h"]).unwrap();
        let mut s = rules.init(0);
        let d = rules.check(&mut s, 0, 1, Op::Try).unwrap();
        let h = RateLimitHeaders::new("api", &rules, &d);
        assert_eq!(h.policy(), "\"api.0\";q=10;w=10, \"api.1\";q=2;w=3600");
        // The hourly window has 1 left, the GCRA 9: the window binds.
        assert_eq!(h.current(), "\"api.1\";r=1;t=3600");
        let conc = RuleSet::parse(&["concurrency:limit=3"]).unwrap();
        let mut s = conc.init(0);
        let d = conc.check(&mut s, 0, 1, Op::Try).unwrap();
        assert_eq!(RateLimitHeaders::new("c", &conc, &d).policy(), "\"c\";q=3");
    }
}
