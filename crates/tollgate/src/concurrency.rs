//! Concurrency limiters: at most `limit` permits held at once, released when the work
//! ends (the permit is dropped). Built on tokio's FIFO-fair semaphore.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

/// Why a permit was not granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ConcurrencyError {
    /// All permits are held (`try_acquire`), or were for the whole timeout.
    #[error("all {limit} permits are in use")]
    Busy {
        /// The limit: permits that may be held at once.
        limit: u32,
    },
    /// More permits were asked for than the limit: no amount of waiting helps.
    #[error("{asked} permits can never be granted: the limit is {limit}")]
    InsufficientCapacity {
        /// Permits asked for.
        asked: u32,
        /// The limit: permits that may be held at once.
        limit: u32,
    },
    /// A keyed limiter already tracks its maximum number of keys with permits held.
    #[error("too many keys: {max} keys already hold permits")]
    TooManyKeys {
        /// The most keys that may hold permits at once.
        max: usize,
    },
}

/// Why permits were not granted: the limit said no, or (a shared limiter) its store
/// could not answer.
#[derive(Debug, thiserror::Error)]
pub enum PermitError {
    /// The limit said no (busy, or more permits than the limit).
    #[error(transparent)]
    Denied(#[from] ConcurrencyError),
    /// The store failed (Redis, whose failure policy is to return the error).
    #[error(transparent)]
    Store(#[from] crate::Error),
}

/// At most `limit` permits held at once, for every clone.
///
/// **Fairness**: waiters are served strictly first come, first served (tokio's
/// semaphore): a waiter asking for many permits holds back smaller requests behind it
/// until it is served, and `try_acquire` never jumps the queue (it fails while
/// earlier callers wait).
///
/// ```
/// # tokio_test();
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn tokio_test() {
/// use tollgate::concurrency::ConcurrencyLimiter;
/// let limiter = ConcurrencyLimiter::new(2);
/// let a = limiter.try_acquire().unwrap();
/// let _b = limiter.acquire().await.unwrap();
/// assert!(limiter.try_acquire().is_err());
/// drop(a); // the work ended: its permit is released
/// assert!(limiter.try_acquire().is_ok());
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ConcurrencyLimiter {
    semaphore: Arc<Semaphore>,
    limit: u32,
}

/// Held permits; released when dropped.
#[must_use = "the permits are released as soon as this is dropped"]
#[derive(Debug)]
pub struct ConcurrencyPermit {
    _permit: OwnedSemaphorePermit,
}

impl ConcurrencyLimiter {
    /// A limiter of `limit` permits.
    pub fn new(limit: u32) -> Self {
        ConcurrencyLimiter {
            semaphore: Arc::new(Semaphore::new(limit as usize)),
            limit,
        }
    }

    /// The limit: permits that may be held at once.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Permits held now.
    pub fn in_flight(&self) -> u32 {
        self.limit - self.semaphore.available_permits() as u32
    }

    /// One permit now, or an error at once.
    pub fn try_acquire(&self) -> Result<ConcurrencyPermit, ConcurrencyError> {
        self.try_acquire_n(1)
    }

    /// `n` permits now, or an error at once.
    pub fn try_acquire_n(&self, n: u32) -> Result<ConcurrencyPermit, ConcurrencyError> {
        try_acquire(&self.semaphore, n, self.limit)
    }

    /// One permit, waiting for it in FIFO order.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives up the place in the queue; nothing is held.
    pub async fn acquire(&self) -> Result<ConcurrencyPermit, ConcurrencyError> {
        self.acquire_n(1).await
    }

    /// `n` permits, waiting for them in FIFO order (cancel safe like `acquire`).
    pub async fn acquire_n(&self, n: u32) -> Result<ConcurrencyPermit, ConcurrencyError> {
        acquire(self.semaphore.clone(), n, self.limit).await
    }

    /// `n` permits, waiting at most `timeout`.
    pub async fn acquire_timeout(
        &self,
        n: u32,
        timeout: Duration,
    ) -> Result<ConcurrencyPermit, ConcurrencyError> {
        tokio::time::timeout(timeout, self.acquire_n(n))
            .await
            .unwrap_or(Err(ConcurrencyError::Busy { limit: self.limit }))
    }
}

fn try_acquire(
    semaphore: &Arc<Semaphore>,
    n: u32,
    limit: u32,
) -> Result<ConcurrencyPermit, ConcurrencyError> {
    if n > limit {
        return Err(ConcurrencyError::InsufficientCapacity { asked: n, limit });
    }
    match semaphore.clone().try_acquire_many_owned(n) {
        Ok(permit) => Ok(ConcurrencyPermit { _permit: permit }),
        Err(TryAcquireError::NoPermits) | Err(TryAcquireError::Closed) => {
            Err(ConcurrencyError::Busy { limit })
        }
    }
}

async fn acquire(
    semaphore: Arc<Semaphore>,
    n: u32,
    limit: u32,
) -> Result<ConcurrencyPermit, ConcurrencyError> {
    if n > limit {
        return Err(ConcurrencyError::InsufficientCapacity { asked: n, limit });
    }
    semaphore
        .acquire_many_owned(n)
        .await
        .map(|permit| ConcurrencyPermit { _permit: permit })
        .map_err(|_| ConcurrencyError::Busy { limit })
}

/// At most `limit` permits held at once per key. A key is tracked only while it holds
/// or waits for permits, so memory follows the work in flight, bounded by `max_keys`.
#[derive(Debug)]
pub struct KeyedConcurrencyLimiter<K> {
    inner: Arc<KeyedInner<K>>,
}

#[derive(Debug)]
struct KeyedInner<K> {
    limit: u32,
    max_keys: usize,
    keys: Mutex<HashMap<K, Arc<Semaphore>>>,
}

impl<K> Clone for KeyedConcurrencyLimiter<K> {
    fn clone(&self) -> Self {
        KeyedConcurrencyLimiter {
            inner: self.inner.clone(),
        }
    }
}

/// Permits held for a key; released when dropped (and the key forgotten once no
/// permit is held or awaited).
#[must_use = "the permits are released as soon as this is dropped"]
pub struct KeyedConcurrencyPermit<K: Hash + Eq> {
    permit: Option<OwnedSemaphorePermit>,
    key: Option<K>,
    inner: Arc<KeyedInner<K>>,
}

impl<K: Hash + Eq> Drop for KeyedConcurrencyPermit<K> {
    fn drop(&mut self) {
        drop(self.permit.take());
        if let Some(key) = self.key.take() {
            self.inner.forget_if_unused(&key);
        }
    }
}

impl<K: Hash + Eq> std::fmt::Debug for KeyedConcurrencyPermit<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedConcurrencyPermit")
            .finish_non_exhaustive()
    }
}

impl<K: Hash + Eq> KeyedInner<K> {
    fn semaphore<Q>(&self, key: &Q) -> Result<Arc<Semaphore>, ConcurrencyError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = keys.get(key) {
            return Ok(s.clone());
        }
        if keys.len() >= self.max_keys {
            return Err(ConcurrencyError::TooManyKeys { max: self.max_keys });
        }
        let s = Arc::new(Semaphore::new(self.limit as usize));
        keys.insert(key.to_owned(), s.clone());
        Ok(s)
    }

    /// Drops the key's entry when nothing but the map refers to its semaphore (no
    /// permit held, nobody waiting). Checked under the map lock, where new users take
    /// their reference.
    fn forget_if_unused<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if keys.get(key).is_some_and(|s| Arc::strong_count(s) == 1) {
            keys.remove(key);
        }
    }
}

impl<K: Hash + Eq> KeyedConcurrencyLimiter<K> {
    /// `limit` permits per key, for at most `max_keys` keys holding or awaiting
    /// permits at once.
    pub fn new(limit: u32, max_keys: usize) -> Self {
        KeyedConcurrencyLimiter {
            inner: Arc::new(KeyedInner {
                limit,
                max_keys,
                keys: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Keys holding or awaiting permits now.
    pub fn len(&self) -> usize {
        self.inner
            .keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Whether no key holds or awaits a permit.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `n` permits for `key` now, or an error at once.
    pub fn try_acquire<Q>(
        &self,
        key: &Q,
        n: u32,
    ) -> Result<KeyedConcurrencyPermit<K>, ConcurrencyError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let semaphore = self.inner.semaphore(key)?;
        let permit = try_acquire(&semaphore, n, self.inner.limit);
        drop(semaphore);
        self.wrap(key, permit)
    }

    /// `n` permits for `key`, waiting in FIFO order per key, at most `timeout`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives up the place in the queue; nothing is held.
    pub async fn acquire<Q>(
        &self,
        key: &Q,
        n: u32,
        timeout: Duration,
    ) -> Result<KeyedConcurrencyPermit<K>, ConcurrencyError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let semaphore = self.inner.semaphore(key)?;
        let limit = self.inner.limit;
        let permit = tokio::time::timeout(timeout, acquire(semaphore, n, limit))
            .await
            .unwrap_or(Err(ConcurrencyError::Busy { limit }));
        self.wrap(key, permit)
    }

    fn wrap<Q>(
        &self,
        key: &Q,
        permit: Result<ConcurrencyPermit, ConcurrencyError>,
    ) -> Result<KeyedConcurrencyPermit<K>, ConcurrencyError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        match permit {
            Ok(p) => Ok(KeyedConcurrencyPermit {
                permit: Some(p._permit),
                key: Some(key.to_owned()),
                inner: self.inner.clone(),
            }),
            Err(e) => {
                self.inner.forget_if_unused(key);
                Err(e)
            }
        }
    }
}
