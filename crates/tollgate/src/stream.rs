//! Pacing a `Stream` to a policy (the shaper as a stream adapter).

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures_core::Stream;
use tollgate_core::{CheckError, Clock, Op};

use crate::Limiter;

/// An item whose cost the policy can never admit (or a cost of 0, which is
/// invalid), handed back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", too_costly(*.cost))]
pub struct TooCostly<T> {
    /// The item, given back untouched.
    pub item: T,
    /// Its cost.
    pub cost: u64,
}

fn too_costly(cost: u64) -> String {
    if cost == 0 {
        "a cost of 0 is invalid: an item costs at least 1".to_string()
    } else {
        format!("an item of cost {cost} can never be admitted by this policy")
    }
}

/// A stream that yields its inner stream's items no faster than a limiter admits them
/// (see [`Paced::new`]).
///
/// **Backpressure**: the inner stream is polled for the next item only after the
/// previous one has been yielded, so nothing is buffered beyond the one item waiting
/// for its turn. Each item reserves its slot with acquire semantics (FIFO with every
/// other user of the limiter); if the policy's `max-wait` would be exceeded, the item
/// waits for the retry time and asks again.
///
/// Dropping the stream while an item waits drops that item and gives its reservation
/// back to the limiter.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use futures::StreamExt;
/// use tollgate::clock::TokioClock;
/// use tollgate::stream::Paced;
/// use tollgate::{Limiter, Policy};
///
/// let limiter = Limiter::with_clock("shaper:rate=10/s,queue=100".parse::<Policy>().unwrap(), TokioClock::new());
/// let start = tokio::time::Instant::now();
/// let paced = Paced::new(futures::stream::iter(0..5), limiter, |_: &u32| 1);
/// let items: Vec<u32> = paced.map(Result::unwrap).collect().await;
/// assert_eq!(items, [0, 1, 2, 3, 4]);
/// assert_eq!(start.elapsed(), std::time::Duration::from_millis(400));
/// # }
/// ```
pub struct Paced<S: Stream, C: Clock, F> {
    inner: Pin<Box<S>>,
    limiter: Limiter<C>,
    cost: F,
    waiting: Option<Waiting<S::Item>>,
}

struct Waiting<T> {
    item: Option<T>,
    cost: u64,
    sleep: Pin<Box<tokio::time::Sleep>>,
    /// True when the slot is reserved; false when sleeping until a retry.
    reserved: bool,
}

impl<S: Stream, C: Clock, F: FnMut(&S::Item) -> u64> Paced<S, C, F> {
    /// Paces `inner` through `limiter`, each item costing `cost(&item)` units.
    pub fn new(inner: S, limiter: Limiter<C>, cost: F) -> Self {
        Paced {
            inner: Box::pin(inner),
            limiter,
            cost,
            waiting: None,
        }
    }

    /// Reserves a slot for `item`: yields it now, or parks it until its time.
    fn schedule(
        &mut self,
        item: S::Item,
        cost: u64,
    ) -> Option<Result<S::Item, TooCostly<S::Item>>> {
        match self.limiter.decide(cost, Op::Acquire) {
            Err(
                CheckError::InsufficientCapacity { .. }
                | CheckError::ZeroCost
                | CheckError::NotChargeable { .. },
            ) => Some(Err(TooCostly { item, cost })),
            Ok(d) if d.allowed && d.wait_us == 0 => Some(Ok(item)),
            Ok(d) => {
                let (reserved, wait) = if d.allowed {
                    (true, d.wait())
                } else {
                    (false, d.retry_after().unwrap_or_default())
                };
                self.waiting = Some(Waiting {
                    item: Some(item),
                    cost,
                    sleep: Box::pin(tokio::time::sleep(wait)),
                    reserved,
                });
                None
            }
        }
    }
}

impl<S: Stream, C: Clock, F: FnMut(&S::Item) -> u64> Stream for Paced<S, C, F>
where
    S::Item: Unpin,
    F: Unpin,
{
    type Item = Result<S::Item, TooCostly<S::Item>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(w) = this.waiting.as_mut() {
                ready!(w.sleep.as_mut().poll(cx));
                let mut w = this.waiting.take().expect("waiting");
                let item = w.item.take().expect("item");
                if w.reserved {
                    return Poll::Ready(Some(Ok(item)));
                }
                // The retry time has come: ask again.
                if let Some(out) = this.schedule(item, w.cost) {
                    return Poll::Ready(Some(out));
                }
                continue;
            }
            let Some(item) = ready!(this.inner.as_mut().poll_next(cx)) else {
                return Poll::Ready(None);
            };
            let cost = (this.cost)(&item);
            if let Some(out) = this.schedule(item, cost) {
                return Poll::Ready(Some(out));
            }
        }
    }
}

impl<S: Stream, C: Clock, F> Drop for Paced<S, C, F> {
    fn drop(&mut self) {
        if let Some(w) = self.waiting.take() {
            if w.reserved {
                self.limiter.refund(w.cost);
            }
        }
    }
}
