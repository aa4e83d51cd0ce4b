//! `Paced`: a stream paced to a policy, with backpressure.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tollgate::clock::TokioClock;
use tollgate::stream::{Paced, TooCostly};
use tollgate::{Limiter, Policy};

fn limiter(spec: &str) -> Limiter<TokioClock> {
    Limiter::with_clock(spec.parse::<Policy>().unwrap(), TokioClock::new())
}

#[tokio::test(start_paused = true)]
async fn items_come_out_at_the_policy_pace_and_the_source_is_pulled_lazily() {
    let pulled = Arc::new(AtomicU64::new(0));
    let counter = pulled.clone();
    let source = futures::stream::iter(0..6u64).inspect(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    let start = tokio::time::Instant::now();
    let mut paced = Box::pin(Paced::new(source, limiter("gcra:rate=5/s,burst=2"), |_| 1));
    let mut times = Vec::new();
    while let Some(item) = paced.next().await {
        let item = item.unwrap();
        times.push((item, (tokio::time::Instant::now() - start).as_millis()));
        // Backpressure: the source is never more than the yielded item ahead.
        assert_eq!(pulled.load(Ordering::SeqCst), item + 1);
    }
    assert_eq!(
        times,
        [(0, 0), (1, 0), (2, 200), (3, 400), (4, 600), (5, 800)]
    );
}

#[tokio::test(start_paused = true)]
async fn costs_are_weighed_and_an_impossible_cost_is_handed_back() {
    let paced = Paced::new(
        futures::stream::iter([1u64, 3, 1]),
        limiter("token-bucket:rate=2/s,capacity=2"),
        |&c| c,
    );
    let out: Vec<_> = paced.collect().await;
    assert_eq!(out, [Ok(1), Err(TooCostly { item: 3, cost: 3 }), Ok(1)]);
}

#[tokio::test(start_paused = true)]
async fn max_wait_rejects_are_retried_not_dropped() {
    // max-wait 50 ms on a 10/s pace: every item past the first is first rejected,
    // then retried when its time comes; none is lost.
    let paced = Paced::new(
        futures::stream::iter(0..4),
        limiter("gcra:rate=10/s,burst=1,max-wait=50ms"),
        |_| 1,
    );
    let start = tokio::time::Instant::now();
    let out: Vec<u32> = paced.map(Result::unwrap).collect().await;
    assert_eq!(out, [0, 1, 2, 3]);
    assert!(tokio::time::Instant::now() - start >= Duration::from_millis(300));
}

#[tokio::test(start_paused = true)]
async fn dropping_a_waiting_stream_gives_its_slot_back() {
    let limiter = limiter("gcra:rate=10/s,burst=1");
    let mut paced = Box::pin(Paced::new(
        futures::stream::iter(0..3),
        limiter.clone(),
        |_| 1,
    ));
    assert_eq!(paced.next().await, Some(Ok(0)));
    // The second item reserves the slot at 100 ms; drop the stream at 10 ms.
    assert!(
        tokio::time::timeout(Duration::from_millis(10), paced.next())
            .await
            .is_err()
    );
    drop(paced);
    let d = limiter.acquire(1).await.unwrap();
    assert_eq!(
        d.wait(),
        Duration::from_millis(90),
        "the slot at 100 ms was given back"
    );
}
