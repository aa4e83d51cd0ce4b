//! A TCP relay on loopback that adds latency: what a slow network between tollgate and
//! Redis looks like, without touching the machine's network settings.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// A relay from a loopback port to `target` that delivers every chunk, in each
/// direction, a set delay after it arrived (so a round trip gains twice the delay,
/// and throughput is kept). The delay can be changed while connections are open.
/// It runs on the runtime it was started on, until that runtime ends.
pub struct DelayRelay {
    /// The relay's own address: connect here instead of to the target.
    pub addr: SocketAddr,
    delay_us: Arc<AtomicU64>,
}

impl DelayRelay {
    /// Starts a relay to `target` with no delay.
    pub async fn start(target: SocketAddr) -> DelayRelay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let delay_us = Arc::new(AtomicU64::new(0));
        let delay = delay_us.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(target).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pipe(cr, sw, delay.clone()));
                tokio::spawn(pipe(sr, cw, delay.clone()));
            }
        });
        DelayRelay { addr, delay_us }
    }

    /// Sets the one-way delay for every chunk read from now on.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_us
            .store(delay.as_micros() as u64, Ordering::Relaxed);
    }
}

/// Copies `from` to `to`, each chunk held until its arrival time plus the delay.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Arc<AtomicU64>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let due = Instant::now() + Duration::from_micros(delay.load(Ordering::Relaxed));
                if tx.send((due, buf[..n].to_vec())).is_err() {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}
