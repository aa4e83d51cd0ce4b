//! A route's `cost:`: what a request used, read from its response (a header, a JSON
//! body field, or the last server-sent event that carries the field, as streamed LLM
//! completions put their usage in their final `data:` event), and charged to the key
//! when the response ends — into debt if need be, so the key is refused until its
//! budget has paid the debt back.
//!
//! The request is admitted when the key has what it reserves left, which it takes:
//! the bound its JSON body states (`max_tokens`, `max_completion_tokens`,
//! `max_output_tokens`) plus a unit per 4 bytes of the body (its prompt), or the
//! route's `estimate` when it states none (`reserve: estimate`: always that). When the
//! response ends, the difference to the reported usage is charged or given back. A
//! response that does not say, or says something that is not a usage (a string, a
//! negative or fractional number, more than 2^40), is charged what the request
//! reserved, counted and logged once per route; a client that goes away mid-stream
//! is charged the usage already seen, else what it reserved; a request the upstream
//! never answered gives its admission back. So concurrent requests of one key can
//! never together pass the budget by more than what they declared.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use axum::http::HeaderName;
use tollgate::{AnyLimiter, RateLimiter};

use super::keys::HeaderSource;
use tollgate_runtime::config::proxy::{AskUsage, CostConfig, Reserve};

/// Where a usage is read.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    /// A response header holding a whole number.
    Header(HeaderName),
    /// A field of the JSON body (`usage.total_tokens`), or of the JSON of a
    /// server-sent event's `data:` for a `text/event-stream` response (the last
    /// event that has it).
    Json(Vec<String>),
}

/// How a request's usage was found, for the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// The response reported this usage.
    Reported(u64),
    /// The response did not say: the estimate is charged.
    Missing,
    /// The response said something that is not a usage: the estimate is charged.
    Invalid(&'static str),
    /// The client went away before the end: the usage seen so far, else the estimate.
    Disconnected(Option<u64>),
}

/// A route's `cost:`, with its counters.
#[derive(Debug)]
pub(super) struct RouteCost {
    sources: Vec<Source>,
    /// The JSON sources' paths, shared by every response's [`Meter`].
    json_paths: Arc<[Vec<String>]>,
    /// Units a request takes at admission, and is charged when its response does not
    /// say what it used.
    pub estimate: u64,
    /// The most of a JSON body (or of one event) read looking for the usage, and of
    /// a request body read for its bound.
    pub max_body: usize,
    /// Whether a request's own declared bound is reserved (`reserve: declared`).
    reserve_declared: bool,
    /// Whether an OpenAI-shaped stream is made to report its usage (`ask_usage:
    /// openai`).
    ask_usage: bool,
    /// Units the requests used in all (reported, or the estimate).
    pub used: AtomicU64,
    /// Responses by outcome: reported, missing, invalid, disconnected.
    pub outcomes: [AtomicU64; 4],
    /// Whether a missing or invalid usage was logged already (once per route).
    warned: AtomicBool,
}

/// The outcome labels, in [`RouteCost::outcomes`]'s order.
pub(super) const OUTCOMES: [&str; 4] = ["reported", "missing", "invalid", "disconnected"];

impl RouteCost {
    /// Validates `c` (`at` names it in errors).
    pub fn build(c: &CostConfig, at: &str) -> anyhow::Result<RouteCost> {
        if c.from.is_empty() {
            anyhow::bail!("{at}.cost.from: name at least one source (header:NAME or json:PATH)");
        }
        let sources = c
            .from
            .iter()
            .map(|s| match s.split_once(':') {
                Some(("header", name)) => HeaderName::from_bytes(name.trim().as_bytes())
                    .map(Source::Header)
                    .map_err(|_| anyhow::anyhow!("{at}.cost.from: '{name}' is not a header name")),
                Some(("json", path))
                    if !path.trim().is_empty() && path.trim().split('.').all(|k| !k.is_empty()) =>
                {
                    Ok(Source::Json(path.trim().split('.').map(str::to_owned).collect()))
                }
                _ => Err(anyhow::anyhow!(
                    "{at}.cost.from: '{s}' is not header:NAME or json:PATH (e.g. json:usage.total_tokens)"
                )),
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        if c.max_body == 0 {
            anyhow::bail!("{at}.cost.max_body: must be at least 1 byte");
        }
        if c.estimate == 0 || c.estimate > tollgate::policy::MAX_COUNT {
            anyhow::bail!(
                "{at}.cost.estimate: {} is not between 1 and 2^40 (a request must find at least one unit left)",
                c.estimate
            );
        }
        let json_paths = (sources.iter())
            .filter_map(|s| match s {
                Source::Json(p) => Some(p.clone()),
                Source::Header(_) => None,
            })
            .collect();
        Ok(RouteCost {
            sources,
            json_paths,
            estimate: c.estimate,
            max_body: c.max_body,
            reserve_declared: c.reserve == Reserve::Declared,
            ask_usage: c.ask_usage == AskUsage::Openai,
            used: AtomicU64::new(0),
            outcomes: Default::default(),
            warned: AtomicBool::new(false),
        })
    }

    /// Whether admission reads the request body (for its bound, or to ask for its
    /// usage).
    pub fn reads_request(&self) -> bool {
        self.reserve_declared || self.ask_usage
    }

    /// The body to send upstream instead of `body` (a request to `path`): one that
    /// asks for its stream's usage, when it is an OpenAI-shaped stream that does not
    /// and the route asks (see `ask_usage`).
    pub fn ask_for_usage(&self, path: &str, body: &[u8]) -> Option<Vec<u8>> {
        (self.ask_usage && super::ask_usage::openai_shaped(path))
            .then(|| super::ask_usage::ask(body))
            .flatten()
    }

    /// What a request with `body` (its bytes, when read) takes at admission: the
    /// bound its JSON states plus a unit per 4 bytes of it, else the estimate.
    pub fn reservation(&self, body: Option<&[u8]>) -> u64 {
        let declared = body
            .filter(|_| self.reserve_declared)
            .and_then(|b| Some((declared_bound(b)?, b.len() as u64)));
        match declared {
            Some((bound, len)) => bound
                .saturating_add(len.div_ceil(4))
                .clamp(1, tollgate::policy::MAX_COUNT),
            None => self.estimate,
        }
    }

    /// The usage a header source finds in the response headers, if one does.
    pub fn in_headers(&self, headers: &(impl HeaderSource + ?Sized)) -> Option<Outcome> {
        self.sources.iter().find_map(|s| match s {
            Source::Header(name) => {
                let v = headers.values(name.as_str()).next()?;
                Some(
                    super::keys::text(v)
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .filter(|&n| n <= tollgate::policy::MAX_COUNT)
                        .map_or(
                            Outcome::Invalid("the usage header is not a whole number up to 2^40"),
                            Outcome::Reported,
                        ),
                )
            }
            Source::Json(_) => None,
        })
    }

    /// A reader of the body for the JSON sources, if the route has any.
    pub fn meter(&self, headers: &(impl HeaderSource + ?Sized)) -> Option<Meter> {
        if self.json_paths.is_empty() {
            return None;
        }
        let paths = self.json_paths.clone();
        let sse = headers
            .first("content-type")
            .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
        Some(Meter {
            paths,
            sse,
            buf: Vec::new(),
            data: Vec::new(),
            found: None,
            overflow: false,
            done: false,
            max: self.max_body,
        })
    }

    fn count(&self, outcome: Outcome, route: &str) {
        let i = match outcome {
            Outcome::Reported(_) => 0,
            Outcome::Missing => 1,
            Outcome::Invalid(_) => 2,
            Outcome::Disconnected(_) => 3,
        };
        self.outcomes[i].fetch_add(1, Ordering::Relaxed);
        let why = match outcome {
            Outcome::Missing => "the response does not report a usage",
            Outcome::Invalid(why) => why,
            _ => return,
        };
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                route,
                why,
                estimate = self.estimate,
                "tollgate: proxy: charging what the request reserved (its declared bound, else \
                 the route's estimate; logged once per route; counted in \
                 tollgate_proxy_cost_responses_total)"
            );
        }
    }
}

/// The fields in which an OpenAI-compatible request states the most it may produce.
const BOUND_FIELDS: [&str; 3] = ["max_tokens", "max_completion_tokens", "max_output_tokens"];

/// The bound a JSON request body states, if it is an object with one of
/// [`BOUND_FIELDS`] as a whole number: the largest of those it states (an upstream
/// may honour any), times its number of choices `n`.
fn declared_bound(body: &[u8]) -> Option<u64> {
    let json: serde_json::Value = serde_json::from_slice(body).ok()?;
    let bound = (BOUND_FIELDS.iter())
        .filter_map(|f| json.get(f)?.as_u64())
        .max()?;
    let choices = json.get("n").and_then(|n| n.as_u64()).unwrap_or(1).max(1);
    Some(bound.saturating_mul(choices))
}

/// Reads a response body for a usage: a JSON document (up to `max` bytes), or the
/// events of a server-sent event stream (each up to `max`), keeping the last usage.
#[derive(Debug)]
pub(super) struct Meter {
    paths: Arc<[Vec<String>]>,
    sse: bool,
    /// The JSON body so far, or the event stream's current line.
    buf: Vec<u8>,
    /// The current event's `data:` lines.
    data: Vec<u8>,
    /// The last usage found (or the reason one was unreadable).
    found: Option<Outcome>,
    /// The body (or an event) passed `max`.
    overflow: bool,
    max: usize,
    /// The event stream said it is done (`data: [DONE]`, OpenAI's last event).
    done: bool,
}

impl Meter {
    /// Whether the body is a server-sent event stream.
    pub fn is_event_stream(&self) -> bool {
        self.sse
    }

    /// Reads one chunk of the body.
    pub fn feed(&mut self, chunk: &[u8]) {
        if !self.sse {
            if self.buf.len() + chunk.len() > self.max {
                self.overflow = true;
                self.buf = Vec::new();
            } else if !self.overflow {
                self.buf.extend_from_slice(chunk);
            }
            return;
        }
        for &b in chunk.iter() {
            if b == b'\n' {
                let line = std::mem::take(&mut self.buf);
                self.line(&line);
            } else if self.buf.len() < self.max {
                self.buf.push(b);
            } else {
                self.overflow = true;
            }
        }
    }

    /// One line of an event stream: `data:` lines gather, a blank line ends the event.
    fn line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            self.event();
        } else if let Some(rest) = line.strip_prefix(b"data:") {
            let rest = rest.strip_prefix(b" ").unwrap_or(rest);
            if !self.data.is_empty() {
                self.data.push(b'\n');
            }
            if self.data.len() + rest.len() <= self.max {
                self.data.extend_from_slice(rest);
            } else {
                self.overflow = true;
            }
        }
    }

    /// Ends an event: its data, if JSON with the field, is the usage so far.
    fn event(&mut self) {
        let data = std::mem::take(&mut self.data);
        self.done |= data == b"[DONE]";
        if data.is_empty() || self.done {
            return;
        }
        // Most events carry no usage (or `"usage": null`, asked for): an object
        // without a value where a path begins is not parsed.
        let object = data.first() == Some(&b'{') && data.trim_ascii_end().last() == Some(&b'}');
        let mut path_starts = self.paths.iter().filter_map(|p| p.first());
        if object && !path_starts.any(|k| super::ask_usage::has_value(&data, k.as_bytes())) {
            return;
        }
        match serde_json::from_slice::<serde_json::Value>(&data) {
            Ok(json) => {
                if let Some(found) = self.lookup(&json) {
                    self.found = Some(found);
                }
            }
            // Unless a later event reports a usage.
            Err(_) if self.found.is_none() => {
                self.found = Some(Outcome::Invalid("an event is not JSON"));
            }
            Err(_) => {}
        }
    }

    fn lookup(&self, json: &serde_json::Value) -> Option<Outcome> {
        self.paths.iter().find_map(|path| {
            // A numeric segment indexes an array (`choices.0.usage`).
            let v = path.iter().try_fold(json, |v, k| match v {
                serde_json::Value::Array(a) => a.get(k.parse::<usize>().ok()?),
                v => v.get(k),
            })?;
            // A whole number, also written as a float (`2.0`).
            let n = v.as_u64().or_else(|| {
                v.as_f64()
                    .filter(|f| {
                        f.fract() == 0.0 && *f >= 0.0 && *f <= tollgate::policy::MAX_COUNT as f64
                    })
                    .map(|f| f as u64)
            });
            Some(match n {
                Some(n) if n <= tollgate::policy::MAX_COUNT => Outcome::Reported(n),
                Some(_) => Outcome::Invalid("the usage is more than 2^40"),
                None => Outcome::Invalid("the usage field is not a whole number"),
            })
        })
    }

    /// What the whole body said.
    pub fn finish(mut self) -> Outcome {
        if self.sse {
            let rest = std::mem::take(&mut self.buf);
            if !rest.is_empty() {
                self.line(&rest);
            }
            self.event();
            return self.found.unwrap_or(if self.overflow {
                Outcome::Invalid("an event passed cost.max_body")
            } else {
                Outcome::Missing
            });
        }
        if self.overflow {
            return Outcome::Invalid("the body passed cost.max_body");
        }
        match serde_json::from_slice::<serde_json::Value>(&self.buf) {
            Ok(json) => self.lookup(&json).unwrap_or(Outcome::Missing),
            Err(_) => Outcome::Invalid("the body is not JSON"),
        }
    }

    /// The usage seen so far (a client went away).
    pub fn so_far(&self) -> Option<u64> {
        match self.found {
            Some(Outcome::Reported(n)) => Some(n),
            _ => None,
        }
    }
}

/// A request admitted under a route's `cost:`: the units it took, to be settled
/// against its usage once. Dropped unsettled (the client went away before the
/// response), it keeps its admission (the estimate) and counts as `disconnected`;
/// [`Pending::give_back`] returns it when the upstream never answered.
pub(super) struct Pending {
    counter: AnyLimiter,
    key: String,
    admitted: u64,
    cost: Arc<RouteCost>,
    route: Arc<str>,
    settled: bool,
    /// The proxy asked for the response's usage (see `ask_usage`): what the client
    /// did not ask for is taken out of its stream.
    pub usage_asked: bool,
}

impl Pending {
    pub fn new(
        counter: AnyLimiter,
        key: &str,
        admitted: u64,
        cost: Arc<RouteCost>,
        route: Arc<str>,
    ) -> Self {
        Pending {
            counter,
            key: key.to_owned(),
            admitted,
            cost,
            route,
            settled: false,
            usage_asked: false,
        }
    }

    /// The route's cost settings.
    pub fn cost(&self) -> &RouteCost {
        &self.cost
    }

    /// The upstream never answered: the admission is given back.
    pub fn give_back(mut self) {
        self.settled = true;
        spawn(self.apply(0));
    }

    /// Settles the request's usage: charges what it used beyond its admission, or
    /// gives back what it took and did not use. The work runs in a task of its own
    /// (a client going away cannot cancel it); the returned future waits for it, so
    /// that the response ends once the charge has landed.
    pub fn settle(mut self, outcome: Outcome) -> Settle {
        self.settled = true;
        self.cost.count(outcome, &self.route);
        let used = match outcome {
            Outcome::Reported(n) | Outcome::Disconnected(Some(n)) => n,
            // What it reserved: its declared bound, else the estimate.
            Outcome::Missing | Outcome::Invalid(_) | Outcome::Disconnected(None) => self.admitted,
        };
        self.cost.used.fetch_add(used, Ordering::Relaxed);
        if used == self.admitted {
            // Nothing to charge or give back (a usage equal to the estimate).
            return Box::pin(std::future::ready(()));
        }
        let work = self.apply(used);
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let task = rt.spawn(work);
                Box::pin(async move {
                    let _ = task.await;
                })
            }
            Err(_) => work,
        }
    }

    /// Settles with nothing waiting for it (a client went away).
    pub fn settle_later(self, outcome: Outcome) {
        drop(self.settle(outcome));
    }

    /// Brings the key's count from `admitted` to `used`.
    fn apply(&self, used: u64) -> Settle {
        let (counter, key, admitted) = (self.counter.clone(), self.key.clone(), self.admitted);
        Box::pin(async move {
            let done = match used.cmp(&admitted) {
                std::cmp::Ordering::Equal => return,
                std::cmp::Ordering::Greater => {
                    counter.charge(&key, used - admitted).await.map(drop)
                }
                std::cmp::Ordering::Less => counter.refund(&key, admitted - used).await,
            };
            if let Err(e) = done {
                tracing::warn!(key, error = %e, "tollgate: proxy: a usage could not be settled (the store failed)");
            }
        })
    }
}

/// A response body being read for its usage ([`Meter`]) under a route's `cost:`:
/// settled with what it reported when it ends ([`Metered::finish`]); dropped before
/// (the client went away, the upstream broke off, the connection's task ended), with
/// the usage seen so far, else the estimate.
pub(super) struct Metered(Option<(Pending, Meter)>);

impl Metered {
    pub fn new(pending: Pending, meter: Meter) -> Self {
        Metered(Some((pending, meter)))
    }

    /// Reads one chunk of the body.
    pub fn feed(&mut self, chunk: &[u8]) {
        if let Some((_, meter)) = &mut self.0 {
            meter.feed(chunk);
        }
    }

    /// Once the event stream has said it is done (`data: [DONE]`, read by
    /// [`Self::feed`]): its usage settles now, to be awaited before that event is
    /// passed on, so that a client that stops reading there (the openai package
    /// closes the response at `[DONE]`) asks again only after the charge. `None`
    /// before, and after it settled (then [`Self::finish`] has nothing left to do).
    pub fn settle_at_done(&mut self) -> Option<Settle> {
        if !self.0.as_ref().is_some_and(|(_, meter)| meter.done) {
            return None;
        }
        let (pending, meter) = self.0.take()?;
        Some(pending.settle(meter.finish()))
    }

    /// The body has ended: its usage settles.
    pub fn finish(mut self) -> Settle {
        match self.0.take() {
            Some((pending, meter)) => pending.settle(meter.finish()),
            None => Box::pin(std::future::ready(())),
        }
    }
}

impl Drop for Metered {
    fn drop(&mut self) {
        if let Some((pending, meter)) = self.0.take() {
            pending.settle_later(Outcome::Disconnected(meter.so_far()));
        }
    }
}

/// A settlement in progress.
pub(super) type Settle = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Runs `settle` in a task, when there is a runtime to run it.
pub(super) fn spawn(settle: Settle) {
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(settle);
    }
}

impl Drop for Pending {
    /// Unsettled: the client went away before the response; the admission stands.
    fn drop(&mut self) {
        if !self.settled {
            self.cost.count(Outcome::Disconnected(None), &self.route);
            self.cost.used.fetch_add(self.admitted, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderMap;

    fn cost(from: &[&str], max_body: usize) -> RouteCost {
        let c = CostConfig {
            from: from.iter().map(|s| s.to_string()).collect(),
            estimate: 7,
            max_body,
            reserve: Reserve::Declared,
            ask_usage: AskUsage::Openai,
            requests: Vec::new(),
        };
        RouteCost::build(&c, "r").unwrap()
    }

    fn read(c: &RouteCost, content_type: &str, chunks: &[&str]) -> Outcome {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", content_type.parse().unwrap());
        let mut m = c.meter(&headers).unwrap();
        for chunk in chunks {
            m.feed(chunk.as_bytes());
        }
        m.finish()
    }

    #[test]
    fn a_json_body_reports_its_field_whole_numbers_only() {
        let c = cost(&["json:usage.total_tokens"], 1 << 20);
        let json = "application/json";
        assert_eq!(
            read(&c, json, &[r#"{"usage":{"total_to"#, r#"kens":42}}"#]),
            Outcome::Reported(42)
        );
        assert_eq!(
            read(&c, json, &[r#"{"usage":{"total_tokens":2.0}}"#]),
            Outcome::Reported(2)
        );
        assert!(matches!(
            read(&c, json, &[r#"{"usage":{"total_tokens":2.5}}"#]),
            Outcome::Invalid(_)
        ));
        assert!(matches!(
            read(&c, json, &[r#"{"usage":{"total_tokens":"9"}}"#]),
            Outcome::Invalid(_)
        ));
        assert!(matches!(
            read(&c, json, &[r#"{"usage":{"total_tokens":1e400}}"#]),
            Outcome::Invalid(_)
        ));
        assert!(matches!(read(&c, json, &["not json"]), Outcome::Invalid(_)));
        assert_eq!(read(&c, json, &[r#"{"choices":[]}"#]), Outcome::Missing);
        let small = cost(&["json:usage.total_tokens"], 10);
        assert!(matches!(
            read(&small, json, &[r#"{"usage":{"total_tokens":1}}"#]),
            Outcome::Invalid(_)
        ));
        let indexed = cost(&["json:choices.1.n"], 1 << 20);
        assert_eq!(
            read(&indexed, json, &[r#"{"choices":[{"n":1},{"n":5}]}"#]),
            Outcome::Reported(5)
        );
    }

    #[test]
    fn an_event_stream_reports_the_last_event_with_the_field() {
        let c = cost(&["json:usage.total_tokens"], 1 << 20);
        let sse = "text/event-stream; charset=utf-8";
        let stream = [
            "data: {\"choices\":[{\"delta\":{}}]}\n\ndata: {\"usage\":{\"total_",
            "tokens\":10}}\r\n\r\ndata: {\"usage\":{\"total_tokens\":12}}\n\n",
            "data: [DONE]\n\n",
        ];
        assert_eq!(read(&c, sse, &stream), Outcome::Reported(12));
        assert_eq!(
            read(&c, sse, &["data: {\"x\":1}\n\n", "data: [DONE]\n\n"]),
            Outcome::Missing
        );
        // A stream cut before its final blank line still counts its last event.
        assert_eq!(
            read(&c, sse, &["data: {\"usage\":{\"total_tokens\":3}}"]),
            Outcome::Reported(3)
        );
    }

    #[test]
    fn a_header_reports_a_whole_number() {
        let c = cost(&["header:x-usage", "json:usage.total_tokens"], 1 << 20);
        let mut h = HeaderMap::new();
        assert_eq!(c.in_headers(&h), None);
        h.insert("x-usage", "77".parse().unwrap());
        assert_eq!(c.in_headers(&h), Some(Outcome::Reported(77)));
        h.insert("x-usage", "-1".parse().unwrap());
        assert!(matches!(c.in_headers(&h), Some(Outcome::Invalid(_))));
    }

    #[test]
    fn a_request_reserves_its_declared_bound_and_its_prompt() {
        let c = cost(&["json:usage.total_tokens"], 1 << 20);
        let body = br#"{"model":"m","max_tokens":900,"messages":[]}"#;
        let prompt = (body.len() as u64).div_ceil(4);
        assert_eq!(c.reservation(Some(body)), 900 + prompt);
        let newer = br#"{"max_completion_tokens":50}"#;
        assert_eq!(c.reservation(Some(newer)), 50 + 7);
        // The largest bound stated, times the choices asked for.
        let both = br#"{"max_tokens":1,"max_completion_tokens":100,"n":3}"#;
        assert_eq!(
            c.reservation(Some(both)),
            300 + (both.len() as u64).div_ceil(4)
        );
        // No bound, not JSON, no body: the estimate.
        assert_eq!(c.reservation(Some(br#"{"model":"m"}"#)), 7);
        assert_eq!(c.reservation(Some(b"not json")), 7);
        assert_eq!(c.reservation(None), 7);
        // A bound past 2^40 is held to it, never wrapped.
        let huge = format!(r#"{{"max_tokens":{}}}"#, u64::MAX);
        assert_eq!(
            c.reservation(Some(huge.as_bytes())),
            tollgate::policy::MAX_COUNT
        );
        let fixed = RouteCost::build(
            &CostConfig {
                from: vec!["json:usage.total_tokens".into()],
                estimate: 7,
                max_body: 1 << 20,
                reserve: Reserve::Estimate,
                ask_usage: AskUsage::None,
                requests: Vec::new(),
            },
            "r",
        )
        .unwrap();
        assert_eq!(fixed.reservation(Some(body)), 7);
    }
}
