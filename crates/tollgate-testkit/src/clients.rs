//! Raw TCP clients that misbehave on purpose, for the tests of a server's connection
//! bounds: a slowloris that sends bytes one at a time, and a watch on when the server
//! ends a connection and what it said first.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// What a server did with a connection a test held.
#[derive(Debug)]
pub struct Ended {
    /// Everything the server sent.
    pub answer: Vec<u8>,
    /// When the server ended the connection (EOF or reset), counted from its start;
    /// `None` if it was still open when the test stopped waiting.
    pub after: Option<Duration>,
}

impl Ended {
    /// The status codes of the HTTP/1.1 responses in the answer, in order.
    pub fn statuses(&self) -> Vec<u16> {
        let text = String::from_utf8_lossy(&self.answer);
        text.match_indices("HTTP/1.1 ")
            .filter_map(|(i, _)| text.get(i + 9..i + 12)?.parse().ok())
            .collect()
    }

    /// Asserts that the server ended the connection between `low` and `high` after
    /// its start (`what` names the case in the failure).
    pub fn assert_ended_within(&self, low: Duration, high: Duration, what: &str) {
        let after = self
            .after
            .unwrap_or_else(|| panic!("{what}: the server never ended it"));
        assert!(
            after >= low && after <= high,
            "{what}: ended after {after:?}, expected within {low:?}..{high:?}"
        );
    }
}

/// Connects to `addr`, writes `head` at once, then `trickle` one byte every `every`,
/// reading whatever the server answers until it ends the connection or `limit` passes.
pub async fn dribble(
    addr: SocketAddr,
    head: &[u8],
    trickle: &[u8],
    every: Duration,
    limit: Duration,
) -> Ended {
    let start = Instant::now();
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut read, mut write) = stream.into_split();
    let (head, trickle) = (head.to_vec(), trickle.to_vec());
    let writer = tokio::spawn(async move {
        if write.write_all(&head).await.is_err() {
            return;
        }
        for byte in trickle {
            tokio::time::sleep(every).await;
            if write.write_all(&[byte]).await.is_err() {
                return;
            }
        }
        // Keep the write half open: closing it would end the request for the server.
        std::future::pending::<()>().await;
    });
    let ended = read_until_closed(&mut read, start, limit).await;
    writer.abort();
    ended
}

/// Connects to `addr` and sends nothing: when does the server hang up?
pub async fn idle(addr: SocketAddr, limit: Duration) -> Ended {
    let start = Instant::now();
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    read_until_closed(&mut stream, start, limit).await
}

/// Reads from `read` until EOF, a reset, or `start + limit`.
pub async fn read_until_closed(
    read: &mut (impl AsyncReadExt + Unpin),
    start: Instant,
    limit: Duration,
) -> Ended {
    let mut answer = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let deadline = start + limit;
    loop {
        match tokio::time::timeout_at(deadline, read.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                return Ended {
                    answer,
                    after: Some(start.elapsed()),
                }
            }
            Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
            Err(_) => {
                return Ended {
                    answer,
                    after: None,
                }
            }
        }
    }
}

/// The number of file descriptors process `pid` has open (Linux).
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// The resident memory of process `pid` in KiB (Linux, `VmRSS`).
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}
