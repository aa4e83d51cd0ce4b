//! Passing a body from one connection to the other as it comes, in its own framing
//! (a chunked body stays chunked: the scanner below only finds where it ends).

use std::io;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::message::Framing;

/// The longest chunk-size line or trailer line read.
const MAX_LINE: usize = 4096;

/// How much is read at a time.
const READ_SIZE: usize = 16 * 1024;

/// Why a body did not pass.
#[derive(Debug)]
pub enum BodyError {
    /// The sender sent nothing for the stall bound.
    Stalled,
    /// The sender closed before the body's end, or its read failed.
    Read(io::Error),
    /// The receiver failed (or stopped reading for `send_timeout`).
    Write,
    /// The chunked framing is broken.
    BadChunk,
}

/// Where a chunked body is: the scanner keeps it across reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// At a chunk-size line.
    Size,
    /// In a chunk, with this many data bytes left.
    Data(u64),
    /// After a chunk's data, with this many bytes of its CRLF left.
    DataEnd(u8),
    /// In the trailer section (after the last chunk).
    Trailers,
    /// Past the body's end.
    Done,
}

/// Finds the end of a chunked body across reads.
#[derive(Debug)]
pub struct ChunkedScan(Chunk);

impl ChunkedScan {
    /// A scan from the body's start.
    pub fn new() -> Self {
        ChunkedScan(Chunk::Size)
    }

    /// Whether the body's end was seen.
    pub fn done(&self) -> bool {
        self.0 == Chunk::Done
    }

    /// How many bytes at the start of `buf` belong to the body (all that can be
    /// told without more bytes); stops at the body's end.
    pub fn scan(&mut self, buf: &[u8]) -> Result<usize, BodyError> {
        let mut at = 0;
        loop {
            let rest = &buf[at..];
            match self.0 {
                Chunk::Done => return Ok(at),
                Chunk::Size => match httparse::parse_chunk_size(rest) {
                    Ok(httparse::Status::Complete((n, size))) => {
                        at += n;
                        self.0 = if size == 0 {
                            Chunk::Trailers
                        } else {
                            Chunk::Data(size)
                        };
                    }
                    Ok(httparse::Status::Partial) if rest.len() < MAX_LINE => return Ok(at),
                    _ => return Err(BodyError::BadChunk),
                },
                Chunk::Data(left) => {
                    if rest.is_empty() {
                        return Ok(at);
                    }
                    let take = left.min(rest.len() as u64);
                    at += take as usize;
                    self.0 = match left - take {
                        0 => Chunk::DataEnd(2),
                        n => Chunk::Data(n),
                    };
                }
                Chunk::DataEnd(left) => {
                    let Some(&b) = rest.first() else {
                        return Ok(at);
                    };
                    let want = if left == 2 { b'\r' } else { b'\n' };
                    if b != want {
                        return Err(BodyError::BadChunk);
                    }
                    at += 1;
                    self.0 = if left == 2 {
                        Chunk::DataEnd(1)
                    } else {
                        Chunk::Size
                    };
                }
                Chunk::Trailers => match memchr::memchr(b'\n', rest) {
                    Some(nl) => {
                        let line = &rest[..nl];
                        at += nl + 1;
                        if line.is_empty() || line == b"\r" {
                            self.0 = Chunk::Done;
                        }
                    }
                    None if rest.len() < MAX_LINE => return Ok(at),
                    None => return Err(BodyError::BadChunk),
                },
            }
        }
    }
}

/// Passes one body framed by `framing` from `src` to `dst`: first whatever `head`
/// holds (the message head, written with the body's first bytes in one write), then
/// the body's bytes already in `buf`, then what `src` sends, each read within
/// `stall` when given. What follows the body stays in `buf`.
pub async fn pass<R, W>(
    framing: Framing,
    src: &mut R,
    buf: &mut BytesMut,
    dst: &mut W,
    head: &mut Vec<u8>,
    stall: Option<Duration>,
) -> Result<(), BodyError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let write = |_| BodyError::Write;
    match framing {
        Framing::Empty => {}
        Framing::Length(mut left) => loop {
            let take = left.min(buf.len() as u64) as usize;
            left -= take as u64;
            if head.is_empty() {
                dst.write_all(&buf[..take]).await.map_err(write)?;
            } else {
                head.extend_from_slice(&buf[..take]);
                dst.write_all(head).await.map_err(write)?;
                head.clear();
            }
            buf.advance(take);
            if left == 0 {
                return Ok(());
            }
            fill(src, buf, stall).await?;
        },
        Framing::Chunked => {
            let mut scan = ChunkedScan::new();
            loop {
                let take = scan.scan(buf)?;
                if !head.is_empty() {
                    head.extend_from_slice(&buf[..take]);
                    dst.write_all(head).await.map_err(write)?;
                    head.clear();
                } else if take > 0 {
                    dst.write_all(&buf[..take]).await.map_err(write)?;
                }
                buf.advance(take);
                if scan.done() {
                    return Ok(());
                }
                fill(src, buf, stall).await?;
            }
        }
        Framing::UntilClose => loop {
            head.extend_from_slice(buf);
            buf.clear();
            if !head.is_empty() {
                dst.write_all(head).await.map_err(write)?;
                head.clear();
            }
            match fill(src, buf, stall).await {
                Ok(()) => {}
                Err(BodyError::Read(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    return Ok(())
                }
                Err(e) => return Err(e),
            }
        },
    }
    if !head.is_empty() {
        dst.write_all(head).await.map_err(write)?;
        head.clear();
    }
    Ok(())
}

/// Reads more of `src` into `buf` (within `stall`); the end of `src` is an
/// `UnexpectedEof` read error.
pub async fn fill<R: AsyncRead + Unpin>(
    src: &mut R,
    buf: &mut BytesMut,
    stall: Option<Duration>,
) -> Result<(), BodyError> {
    buf.reserve(READ_SIZE);
    let n = match stall {
        None => src.read_buf(buf).await,
        Some(limit) => tokio::time::timeout(limit, src.read_buf(buf))
            .await
            .map_err(|_| BodyError::Stalled)?,
    }
    .map_err(BodyError::Read)?;
    if n == 0 {
        return Err(BodyError::Read(io::ErrorKind::UnexpectedEof.into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scan_finds_a_chunked_body_end_across_any_split() {
        let body =
            b"5\r\nhello\r\n1a;ext=1\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nx-trailer: 1\r\n\r\n";
        let mut next = b"GET /next HTTP/1.1\r\n\r\n".to_vec();
        let mut all = body.to_vec();
        all.append(&mut next);
        for split in 0..all.len() {
            let mut scan = ChunkedScan::new();
            let first = scan.scan(&all[..split]).unwrap();
            // What was not taken is scanned again with more bytes behind it.
            let second = scan.scan(&all[first..]).unwrap();
            assert!(scan.done(), "split at {split}");
            assert_eq!(first + second, body.len(), "split at {split}");
        }
        let mut scan = ChunkedScan::new();
        assert_eq!(scan.scan(b"0\r\n\r\n").unwrap(), 5);
        assert!(scan.done());
    }

    #[test]
    fn broken_chunks_are_refused() {
        for bad in [&b"zz\r\n"[..], b"3\r\nabcX\r\n", b"ffffffffffffffffff\r\n"] {
            assert!(
                matches!(ChunkedScan::new().scan(bad), Err(BodyError::BadChunk)),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let endless = vec![b'1'; MAX_LINE + 1];
        assert!(ChunkedScan::new().scan(&endless).is_err());
    }

    proptest::proptest! {
        /// Any chunked body, cut into any reads, is found to end exactly where it
        /// ends; bytes that are not one are refused or taken in part, never past
        /// their end, and never panic.
        #[test]
        fn the_scan_ends_exactly_at_the_end_of_any_chunked_body(
            chunks in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 1..40), 0..6),
            upper in proptest::bool::ANY,
            trailers in proptest::collection::vec("[a-z]{1,8}: [a-z0-9]{0,8}", 0..3),
            cuts in proptest::collection::vec(0usize..400, 0..6),
            garbage in proptest::collection::vec(proptest::num::u8::ANY, 0..64),
        ) {
            let mut body = Vec::new();
            for c in &chunks {
                let size = if upper { format!("{:X}", c.len()) } else { format!("{:x}", c.len()) };
                body.extend_from_slice(size.as_bytes());
                body.extend_from_slice(b"\r\n");
                body.extend_from_slice(c);
                body.extend_from_slice(b"\r\n");
            }
            body.extend_from_slice(b"0\r\n");
            for t in &trailers {
                body.extend_from_slice(t.as_bytes());
                body.extend_from_slice(b"\r\n");
            }
            body.extend_from_slice(b"\r\n");
            let mut all = body.clone();
            all.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
            // Reads end at the cuts; what a scan leaves is seen again with the next.
            let mut ends: Vec<usize> = cuts.iter().map(|c| c % (all.len() + 1)).collect();
            ends.push(all.len());
            ends.sort_unstable();
            let (mut scan, mut taken) = (ChunkedScan::new(), 0);
            for end in ends {
                if scan.done() {
                    break;
                }
                taken += scan.scan(&all[taken..end.max(taken)]).unwrap();
            }
            proptest::prop_assert!(scan.done());
            proptest::prop_assert_eq!(taken, body.len());
            let mut scan = ChunkedScan::new();
            if let Ok(n) = scan.scan(&garbage) {
                proptest::prop_assert!(n <= garbage.len());
            }
        }
    }

    #[tokio::test]
    async fn pass_copies_exactly_the_body_and_leaves_the_rest() {
        for (framing, input, expect) in [
            (Framing::Length(3), &b"abcNEXT"[..], &b"HEADabc"[..]),
            (
                Framing::Chunked,
                b"1\r\na\r\n0\r\n\r\nNEXT",
                b"HEAD1\r\na\r\n0\r\n\r\n",
            ),
            (Framing::Empty, b"NEXT", b"HEAD"),
        ] {
            // The first byte is in the buffer, the rest comes from the source.
            let mut buf = BytesMut::from(&input[..1]);
            let mut src = &input[1..];
            let mut out = Vec::new();
            let mut head = b"HEAD".to_vec();
            pass(framing, &mut src, &mut buf, &mut out, &mut head, None)
                .await
                .unwrap();
            assert_eq!(out, expect, "{framing:?}");
            let mut rest = buf.to_vec();
            rest.extend_from_slice(src);
            assert!(
                rest.ends_with(b"NEXT") && rest.len() == 4,
                "{framing:?}: {rest:?}"
            );
        }
        // Until the end of the source.
        let (mut buf, mut src, mut out) = (BytesMut::from(&b"ab"[..]), &b"cd"[..], Vec::new());
        pass(
            Framing::UntilClose,
            &mut src,
            &mut buf,
            &mut out,
            &mut Vec::new(),
            None,
        )
        .await
        .unwrap();
        assert_eq!(out, b"abcd");
        // A body cut short is an error.
        let (mut buf, mut src) = (BytesMut::from(&b"ab"[..]), &b""[..]);
        let cut = pass(
            Framing::Length(5),
            &mut src,
            &mut buf,
            &mut Vec::new(),
            &mut Vec::new(),
            None,
        )
        .await;
        assert!(matches!(cut, Err(BodyError::Read(_))));
    }
}
