//! What the connection tests share: a first decision through a fresh store, and the
//! configuration error it must end in.

use tollgate::redis::{RedisLimiter, RedisOptions, RedisStore};
use tollgate::{Error, RateLimiter, RuleSet};

/// Connects to `url` with `opts` and decides a burst of three on a fresh key: the
/// admissions.
pub async fn three_of_a_burst_of_two(url: &str, opts: RedisOptions) -> Result<Vec<bool>, Error> {
    let store = RedisStore::connect_with(url, opts).await?;
    let rules = RuleSet::parse(&["gcra:rate=1/m,burst=2"])?;
    let limiter = RedisLimiter::new(store, "connect", rules)?;
    let key = format!("k{}", std::process::id());
    let mut out = Vec::new();
    for _ in 0..3 {
        out.push(limiter.check(&key, 1).await?.allowed);
    }
    Ok(out)
}

/// The error's text, which must name the cause.
pub fn config_error(r: Result<Vec<bool>, Error>) -> String {
    match r {
        Err(e @ Error::Config(_)) => {
            eprintln!("refused: {e}");
            e.to_string()
        }
        other => panic!("expected a configuration error, got {other:?}"),
    }
}
