//! [`Error`]: the one error type of the library's limiters, whatever the store, and
//! the errors it carries.

pub use tollgate_core::{CheckError, Rejected, SpecError};
use tollgate_core::{Decision, RuleSet};

/// Why a limiter could not decide, or could not be built.
///
/// Every limiter of this crate — [`Limiter`](crate::Limiter),
/// [`KeyedLimiter`](crate::KeyedLimiter), the Redis stores and
/// [`AnyLimiter`](crate::AnyLimiter) — reports this one type, and a bad policy spec
/// converts into it, so `?` works from parsing to deciding:
///
/// ```
/// use tollgate::{Error, KeyedLimiter, RuleSet};
///
/// fn limiter(specs: &[&str]) -> Result<KeyedLimiter<String>, Error> {
///     Ok(KeyedLimiter::new(RuleSet::parse(specs)?))
/// }
/// assert!(limiter(&["gcra:rate=10/s,burst=5"]).is_ok());
/// let e = limiter(&["gcra:rate=10/s,burts=5"]).unwrap_err();
/// assert!(e.to_string().contains("unknown parameter 'burts'"), "{e}");
/// assert!(!e.is_transient());
/// ```
///
/// A rejection is not an error: it is a [`Decision`] with `allowed: false`;
/// [`Decision::into_result`] turns it into one ([`Error::Rejected`]) when `?` should
/// stop at it:
///
/// ```
/// use tollgate::{Error, Limiter, Policy, Rate};
///
/// fn work(api: &Limiter) -> Result<(), Error> {
///     let admitted = api.check(1)?.into_result()?; // Err(Error::Rejected) over the limit
///     assert!(admitted.allowed);
///     Ok(())
/// }
/// let api = Limiter::new(Policy::gcra(Rate::per_minute(1)?, 1)?);
/// assert!(work(&api).is_ok());
/// let e = work(&api).unwrap_err();
/// assert!(matches!(e, Error::Rejected(_)) && e.rejection().is_some());
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A policy spec that does not parse (or a rule set without policies). Boxed: it
    /// is rare, and keeps every decision's `Result` as small as the decision.
    #[error(transparent)]
    Spec(Box<SpecError>),
    /// The request itself is invalid: a cost of 0, more than a policy can ever
    /// admit, or a charge to a policy that cannot take one. Waiting does not help.
    #[error(transparent)]
    Check(#[from] CheckError),
    /// `check` (or `allow`) was asked of rules that pace (a `shaper`, a delaying
    /// `limit-req`): their admitted tries carry a wait the caller must sleep, so an
    /// answer read as "allowed" would pace nothing. Use `acquire`, which sleeps the
    /// wait, or `check_rules(.., Op::Try)` and sleep `decision.wait()` before the work.
    #[error(
        "policy '{0}' paces requests (an admitted try carries a wait to sleep before the work): \
         use acquire, which sleeps it, or check_rules with Op::Try and sleep decision.wait()"
    )]
    Paces(String),
    /// `check` (or `allow`) was asked of rules with a `concurrency` policy: it counts
    /// permits held while the work runs, and a yes/no answer has nothing to give them
    /// back with (the key would lock out after `limit` answers). Use a
    /// [`ConcurrencyLimiter`](crate::concurrency::ConcurrencyLimiter) or
    /// [`KeyedConcurrencyLimiter`](crate::concurrency::KeyedConcurrencyLimiter), whose
    /// permits release on drop (or, in tower, `ConcurrencyLimitLayer`).
    #[error(
        "policy '{0}' holds permits while the work runs, which a check cannot give back: \
         use ConcurrencyLimiter or KeyedConcurrencyLimiter (permits released on drop), \
         or tollgate::tower::ConcurrencyLimitLayer"
    )]
    HoldsPermits(String),
    /// The request is over the limit: a rejection turned into an error by
    /// [`Decision::into_result`] (so `?` stops at it in a function returning this
    /// error). Not transient; [`Error::rejection`] gives the decision back.
    #[error(transparent)]
    Rejected(#[from] Rejected),
    /// The memory store is full and refuses new keys
    /// ([`OnFull::RefuseNew`](crate::keyed::OnFull::RefuseNew)).
    #[error("too many keys: the limiter holds its maximum of {max} keys and refuses new ones")]
    TooManyKeys {
        /// The configured maximum.
        max: usize,
    },
    /// The store cannot keep this policy or cost (e.g. a cost beyond the exact
    /// integer range of the Redis scripts, or a policy a lease cannot keep exactly).
    #[error("not supported by this store: {0}")]
    Unsupported(String),
    /// The store is unreachable, slow or failing. Transient: the caller (or the
    /// store's failure policy) decides whether to admit or reject meanwhile.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store's configuration is invalid (a bad URL, prefix or limiter name).
    #[error("store configuration: {0}")]
    Config(String),
    /// The store answered something it never sends.
    #[error("store error: {0}")]
    Store(String),
}

impl From<SpecError> for Error {
    fn from(e: SpecError) -> Self {
        Error::Spec(Box::new(e))
    }
}

impl Error {
    /// `Err(Paces)` or `Err(HoldsPermits)` for rules a plain `check` would misread
    /// (see [`Error::Paces`], [`Error::HoldsPermits`]).
    pub(crate) fn refuse_pacing(rules: &RuleSet) -> Result<(), Error> {
        if let Some(p) = rules.pacing() {
            return Err(Error::Paces(p.to_string()));
        }
        match rules.holding() {
            Some(p) => Err(Error::HoldsPermits(p.to_string())),
            None => Ok(()),
        }
    }

    /// Whether the failure is the store's and may pass (unreachable, slow): the kind
    /// a fail-open or fail-closed policy applies to. An invalid request, spec or
    /// configuration is not transient.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Unavailable(_))
    }

    /// The answer for a request whose check failed with this error, when the
    /// request must still be answered (a server, a middleware): a cost that can
    /// never fit, a cost of 0 or a limiter full of keys is over the limit for good,
    /// a reject with no `retry_after` (its `limit` the capacity, when known). `None`
    /// when no decision was made: the store failed (the failure policy answers),
    /// or the request asked what the policy cannot do (a charge to a `shaper`).
    ///
    /// ```
    /// use tollgate::{Error, KeyedLimiter, Policy};
    /// let limiter: KeyedLimiter<String> = KeyedLimiter::new("gcra:rate=1/s,burst=5".parse::<Policy>()?);
    /// let e = limiter.check("ada", 6).unwrap_err();
    /// let d = e.rejection().expect("a cost past the burst is a reject");
    /// assert!(!d.allowed);
    /// assert_eq!((d.limit, d.retry_after()), (5, None));
    /// assert_eq!(Error::Unavailable("redis: timeout".into()).rejection(), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn rejection(&self) -> Option<Decision> {
        match self {
            Error::Rejected(r) => Some(r.decision),
            Error::Check(CheckError::InsufficientCapacity { capacity, .. }) => {
                Some(Decision::rejected(*capacity, 0, 0, None))
            }
            Error::Check(CheckError::NotChargeable { .. }) => None,
            Error::Check(_) | Error::TooManyKeys { .. } => Some(Decision::rejected(0, 0, 0, None)),
            _ => None,
        }
    }
}
