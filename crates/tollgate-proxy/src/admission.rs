//! A request meets its route: its key, then the route's rate limits, `limit_conn`
//! and adaptive limit, on either serving path (hyper's or the HTTP/1.1 fast path).

use super::forwarding::Peer;
use super::keys::{self, HeaderSource};
use super::limits::Passed;
use super::problem::Problem;
use super::routes::{Route, RouteTable};

/// A request's key and limits on its `route`: what it goes upstream with, or the
/// answer instead. A request whose key is empty is not limited (as nginx). `body`:
/// the request's body, when read for a `cost:` route's reservation.
pub(super) async fn admit(
    table: &RouteTable,
    route: &Route,
    peer: &Peer,
    path: &str,
    headers: &(impl HeaderSource + ?Sized),
    body: Option<&[u8]>,
) -> Result<Passed, Problem> {
    let key = keys::key(&route.key, &table.trusted, peer.addr.ip(), path, headers);
    let tier = route.limits.tier_of(&key);
    let mut passed = if key.is_empty() {
        Passed::default()
    } else {
        route.limits.pass(&key, tier, body).await?
    };
    // The adaptive limit protects the upstream: every request of the route meets it,
    // keyed or not.
    if let Some(adaptive) = &route.adaptive {
        match adaptive.admit(&key, tier).await {
            Ok(hold) => passed.adaptive = hold,
            Err(reject) => {
                let pending = passed.pending.take();
                route.limits.give_back(&key, pending, passed.counted).await;
                return Err(reject);
            }
        }
    }
    Ok(passed)
}
