//! Passing a body from one connection to the other as it comes: a body of known
//! length as it is, a chunked body decoded strictly and chunked again.

use std::io::{self, Write as _};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::message::Framing;
use crate::ask_usage::Unasked;
use crate::cost::Metered;

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

/// Where a chunked body is: the decoder keeps it across reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// At a chunk-size line.
    Size,
    /// In a chunk, with this many data bytes left.
    Data(u64),
    /// After a chunk's data, at its CRLF.
    DataEnd,
    /// In the trailer section (after the last chunk), with this many bytes of it read.
    Trailers(usize),
    /// Past the body's end.
    Done,
}

/// The most bytes of trailer fields read (they are not passed on).
const MAX_TRAILERS: usize = 8 * 1024;

/// Reads a chunked body strictly and writes it chunked again, as nginx does: the
/// same data in the same chunks, without chunk extensions or trailers. Passing the
/// bytes on as they came would let a receiver that reads the chunk syntax differently
/// (a bare LF ending a size line, an empty size) find another end to the body than
/// this proxy did, and take the rest for a request of its own.
#[derive(Debug)]
pub struct Rechunk(Chunk);

impl Rechunk {
    /// A decoder at the body's start.
    pub fn new() -> Self {
        Rechunk(Chunk::Size)
    }

    /// Whether the body's end was seen.
    pub fn done(&self) -> bool {
        self.0 == Chunk::Done
    }

    /// Decodes what it can of `buf` (all that can be told without more bytes,
    /// stopping at the body's end), appending the body chunked again to `out`;
    /// returns how many bytes of `buf` it used.
    pub fn feed(&mut self, buf: &[u8], out: &mut Vec<u8>) -> Result<usize, BodyError> {
        self.feed_tapped(buf, out, &mut |_| {})
    }

    /// [`Rechunk::feed`], handing each piece of the body's data to `tap` as well.
    pub fn feed_tapped(
        &mut self,
        buf: &[u8],
        out: &mut Vec<u8>,
        tap: &mut dyn FnMut(&[u8]),
    ) -> Result<usize, BodyError> {
        let mut at = 0;
        loop {
            let rest = &buf[at..];
            match self.0 {
                Chunk::Done => return Ok(at),
                Chunk::Size => {
                    let Some(line) = crlf_line(rest)? else {
                        return Ok(at);
                    };
                    at += line.len() + 2;
                    let size = chunk_size(line)?;
                    self.0 = if size == 0 {
                        Chunk::Trailers(0)
                    } else {
                        let _ = write!(out, "{size:x}\r\n");
                        Chunk::Data(size)
                    };
                }
                Chunk::Data(left) => {
                    if rest.is_empty() {
                        return Ok(at);
                    }
                    let take = left.min(rest.len() as u64) as usize;
                    out.extend_from_slice(&rest[..take]);
                    tap(&rest[..take]);
                    at += take;
                    self.0 = match left - take as u64 {
                        0 => Chunk::DataEnd,
                        n => Chunk::Data(n),
                    };
                }
                Chunk::DataEnd => match rest {
                    [b'\r', b'\n', ..] => {
                        at += 2;
                        out.extend_from_slice(b"\r\n");
                        self.0 = Chunk::Size;
                    }
                    [] | [b'\r'] => return Ok(at),
                    _ => return Err(BodyError::BadChunk),
                },
                Chunk::Trailers(read) => {
                    let Some(line) = crlf_line(rest)? else {
                        return Ok(at);
                    };
                    at += line.len() + 2;
                    let read = read + line.len() + 2;
                    if line.is_empty() {
                        out.extend_from_slice(b"0\r\n\r\n");
                        self.0 = Chunk::Done;
                    } else if read > MAX_TRAILERS || !is_field_line(line) {
                        return Err(BodyError::BadChunk);
                    } else {
                        self.0 = Chunk::Trailers(read);
                    }
                }
            }
        }
    }
}

/// The line at the start of `buf` without its CRLF; `None` while it is not all there.
/// A line must end in CRLF and hold no other CR or LF.
fn crlf_line(buf: &[u8]) -> Result<Option<&[u8]>, BodyError> {
    match memchr::memchr(b'\n', buf) {
        None if buf.len() < MAX_LINE => Ok(None),
        None => Err(BodyError::BadChunk),
        Some(nl) => {
            let line = &buf[..nl];
            match line.split_last() {
                Some((b'\r', line)) if !line.contains(&b'\r') => Ok(Some(line)),
                _ => Err(BodyError::BadChunk),
            }
        }
    }
}

/// A chunk-size line's size (RFC 9112 §7.1): 1 to 15 hex digits, then optional
/// whitespace and `;` extensions of visible characters, spaces and tabs.
fn chunk_size(line: &[u8]) -> Result<u64, BodyError> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 15 {
        return Err(BodyError::BadChunk);
    }
    let ext = &line[digits..];
    let ext = ext.trim_ascii_start();
    let visible = |b: &u8| *b == b'\t' || (b' '..=b'~').contains(b);
    if !ext.is_empty() && (ext[0] != b';' || !ext.iter().all(visible)) {
        return Err(BodyError::BadChunk);
    }
    let hex = std::str::from_utf8(&line[..digits]).map_err(|_| BodyError::BadChunk)?;
    u64::from_str_radix(hex, 16).map_err(|_| BodyError::BadChunk)
}

/// A trailer field line: a token, a colon, visible characters.
fn is_field_line(line: &[u8]) -> bool {
    let Some(colon) = memchr::memchr(b':', line) else {
        return false;
    };
    let token = |b: &u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b);
    colon > 0
        && line[..colon].iter().all(token)
        && line[colon + 1..]
            .iter()
            .all(|b| *b == b'\t' || (b' '..=b'~').contains(b))
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
    pass_metered(framing, src, buf, dst, head, stall, End::Send).await
}

/// What [`pass_metered`] does with the end of a body.
pub enum End<'a> {
    /// Sends it.
    Send,
    /// Leaves the last bytes in `head`, for the caller to send (once a permit is
    /// given back).
    Hold,
    /// Feeds the body's data to the meter, and leaves the last bytes in `head` (for
    /// the caller to send once the usage has been charged).
    Metered(&'a mut Metered),
}

/// [`pass`], with the body's data read by a meter as it passes; then, unless `end`
/// is [`End::Send`], the last bytes (with a body of known length or chunked, what
/// ends it; without a body, the head) are left unwritten in `head`, for the caller
/// to send once the usage has been charged or a permit given back: a client has the
/// whole response only after that.
pub async fn pass_metered<R, W>(
    framing: Framing,
    src: &mut R,
    buf: &mut BytesMut,
    dst: &mut W,
    head: &mut Vec<u8>,
    stall: Option<Duration>,
    end: End<'_>,
) -> Result<(), BodyError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let write = |_| BodyError::Write;
    let hold = !matches!(end, End::Send);
    let mut meter = match end {
        End::Metered(m) => Some(m),
        End::Send | End::Hold => None,
    };
    match framing {
        Framing::Empty | Framing::Length(0) => {}
        Framing::Length(mut left) => loop {
            let take = left.min(buf.len() as u64) as usize;
            left -= take as u64;
            if let Some(m) = meter.as_deref_mut() {
                m.feed(&buf[..take]);
            }
            settle_at_done(&mut meter).await;
            if hold && left == 0 {
                head.extend_from_slice(&buf[..take]);
                buf.advance(take);
                return Ok(());
            }
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
            let mut chunks = Rechunk::new();
            loop {
                let used = match meter.as_deref_mut() {
                    Some(m) => chunks.feed_tapped(buf, head, &mut |data| m.feed(data))?,
                    None => chunks.feed(buf, head)?,
                };
                buf.advance(used);
                settle_at_done(&mut meter).await;
                if hold && chunks.done() {
                    return Ok(());
                }
                if !head.is_empty() {
                    dst.write_all(head).await.map_err(write)?;
                    head.clear();
                }
                if chunks.done() {
                    return Ok(());
                }
                fill(src, buf, stall).await?;
            }
        }
        Framing::UntilClose => loop {
            if let Some(m) = meter.as_deref_mut() {
                m.feed(buf);
            }
            settle_at_done(&mut meter).await;
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
    if !head.is_empty() && !hold {
        dst.write_all(head).await.map_err(write)?;
        head.clear();
    }
    Ok(())
}

/// [`pass_metered`] for a response whose usage the proxy asked for (see `ask_usage`):
/// its data, decoded from the upstream's `framing`, is read by the meter and edited by
/// `strip` (the usage taken out, so its length changes), then goes to the client
/// chunked (or, for a body that ends when the upstream closes, as it is). The last
/// bytes are left in `head`, for the caller to send once the usage has been charged.
/// Trailers are not passed on (as [`Rechunk`] passes none).
pub async fn pass_stripped<R, W>(
    framing: Framing,
    (src, buf): (&mut R, &mut BytesMut),
    dst: &mut W,
    head: &mut Vec<u8>,
    stall: Option<Duration>,
    (mut meter, strip): (Option<&mut Metered>, &mut Unasked),
) -> Result<(), BodyError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let chunked = framing != Framing::UntilClose;
    let mut left = match framing {
        Framing::Length(n) => n,
        _ => 0,
    };
    let mut chunks = Rechunk::new();
    let (mut data, mut framed, mut edited) = (Vec::new(), Vec::new(), Vec::new());
    loop {
        let ended = match framing {
            Framing::Empty => true,
            Framing::Length(_) => {
                let take = left.min(buf.len() as u64) as usize;
                data.extend_from_slice(&buf[..take]);
                buf.advance(take);
                left -= take as u64;
                left == 0
            }
            Framing::Chunked => {
                let used =
                    chunks.feed_tapped(buf, &mut framed, &mut |d| data.extend_from_slice(d))?;
                framed.clear();
                buf.advance(used);
                chunks.done()
            }
            Framing::UntilClose => {
                data.extend_from_slice(buf);
                buf.clear();
                false
            }
        };
        if let Some(m) = meter.as_deref_mut() {
            m.feed(&data);
        }
        settle_at_done(&mut meter).await;
        strip.feed(&data, &mut edited);
        data.clear();
        if ended {
            strip.finish(&mut edited);
        }
        frame(head, &edited, chunked);
        edited.clear();
        if ended {
            if chunked {
                head.extend_from_slice(b"0\r\n\r\n");
            }
            return Ok(());
        }
        if !head.is_empty() {
            dst.write_all(head).await.map_err(|_| BodyError::Write)?;
            head.clear();
        }
        match fill(src, buf, stall).await {
            Ok(()) => {}
            Err(BodyError::Read(e)) if !chunked && e.kind() == io::ErrorKind::UnexpectedEof => {
                strip.finish(head);
                return Ok(());
            }
            Err(e) => return Err(e),
        }
    }
}

/// Settles `meter`'s usage once its event stream said it is done, before the bytes
/// that said it are passed on (see [`Metered::settle_at_done`]).
async fn settle_at_done(meter: &mut Option<&mut Metered>) {
    if let Some(settle) = meter.as_deref_mut().and_then(Metered::settle_at_done) {
        settle.await;
    }
}

/// Appends `data` to `out`, as one chunk when `chunked` (none when it is empty: an
/// empty chunk would end the body).
fn frame(out: &mut Vec<u8>, data: &[u8], chunked: bool) {
    if data.is_empty() {
        return;
    }
    if chunked {
        let _ = write!(out, "{:x}\r\n", data.len());
    }
    out.extend_from_slice(data);
    if chunked {
        out.extend_from_slice(b"\r\n");
    }
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

    /// Feeds `all` to a decoder in reads ending at `ends`; what a read leaves is fed
    /// again with the next. Returns the bytes used and the output, or the error.
    fn decode(all: &[u8], ends: &[usize]) -> Result<(usize, Vec<u8>), BodyError> {
        let (mut chunks, mut used, mut out) = (Rechunk::new(), 0, Vec::new());
        for &end in ends.iter().chain(std::iter::once(&all.len())) {
            if chunks.done() {
                break;
            }
            used += chunks.feed(&all[used..end.max(used)], &mut out)?;
        }
        assert!(
            chunks.done(),
            "no end in {:?}",
            String::from_utf8_lossy(all)
        );
        Ok((used, out))
    }

    #[test]
    fn a_chunked_body_is_chunked_again_without_extensions_or_trailers() {
        let body = b"5\r\nhello\r\n1A;ext=1;q=\"a b\"\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nx-trailer: 1\r\n\r\n";
        let mut all = body.to_vec();
        all.extend_from_slice(b"GET /next HTTP/1.1\r\n\r\n");
        for split in 0..all.len() {
            let (used, out) = decode(&all, &[split]).unwrap();
            assert_eq!(used, body.len(), "split at {split}");
            assert_eq!(
                out,
                b"5\r\nhello\r\n1a\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\n\r\n"
            );
        }
        assert_eq!(
            decode(b"0\r\n\r\n", &[]).unwrap(),
            (5, b"0\r\n\r\n".to_vec())
        );
    }

    #[test]
    fn chunk_syntax_that_another_parser_may_read_otherwise_is_refused() {
        for bad in [
            &b"zz\r\n"[..],
            b"\r\n",                     // an empty size
            b" 5\r\nhello\r\n0\r\n\r\n", // whitespace before the size
            b"4c;\nx\r\n",               // a bare LF in an extension
            b"5\nhello\r\n",             // a bare LF ending the size line
            b"5;a\rb\r\nhello\r\n",      // a CR inside
            b"3\r\nabcX\r\n",            // no CRLF after the data
            b"ffffffffffffffff\r\n",     // 16 digits
            b"0\r\nno colon\r\n\r\n",    // a trailer that is not a field
            b"0\r\nx: 1\n\r\n",          // a trailer ending in a bare LF
        ] {
            let mut out = Vec::new();
            let mut chunks = Rechunk::new();
            let got = chunks.feed(bad, &mut out);
            assert!(
                matches!(got, Err(BodyError::BadChunk)),
                "{:?}: {got:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let endless = vec![b'1'; MAX_LINE + 1];
        assert!(Rechunk::new().feed(&endless, &mut Vec::new()).is_err());
    }

    /// An OpenAI stream whose usage the proxy asked for, as an upstream sends it.
    const ASKED: &[u8] =
        b"data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"Hel\"}}],\"usage\":null}\n\n\
        data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"lo\"}}],\"usage\":null}\n\n\
        data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"total_tokens\":10}}\n\n\
        data: [DONE]\n\n";

    /// Passes `upstream` (the body framed as `framing`) through `pass_stripped` in
    /// reads of `step` bytes: what the client receives, and what was left in `head`.
    fn stripped(framing: Framing, upstream: &[u8], step: usize) -> (Vec<u8>, Vec<u8>) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut src = tokio_test_reader(upstream, step);
            let (mut buf, mut head, mut dst) = (BytesMut::new(), b"HEAD".to_vec(), Vec::new());
            let strip = &mut Unasked::new(1 << 20);
            let from = (&mut src, &mut buf);
            pass_stripped(framing, from, &mut dst, &mut head, None, (None, strip))
                .await
                .unwrap();
            (dst, head)
        })
    }

    /// A reader handing out `all` `step` bytes at a time.
    fn tokio_test_reader(all: &[u8], step: usize) -> impl AsyncRead + Unpin {
        struct Steps(Vec<u8>, usize, usize);
        impl AsyncRead for Steps {
            fn poll_read(
                mut self: std::pin::Pin<&mut Self>,
                _: &mut std::task::Context<'_>,
                buf: &mut tokio::io::ReadBuf<'_>,
            ) -> std::task::Poll<io::Result<()>> {
                let Steps(all, at, step) = &mut *self;
                let n = (*step).min(all.len() - *at).min(buf.remaining());
                buf.put_slice(&all[*at..*at + n]);
                *at += n;
                std::task::Poll::Ready(Ok(()))
            }
        }
        Steps(all.to_vec(), 0, step)
    }

    #[test]
    fn a_stream_loses_the_usage_it_did_not_ask_for_in_every_framing() {
        let mut want = Vec::new();
        let mut strip = Unasked::new(1 << 20);
        strip.feed(ASKED, &mut want);
        strip.finish(&mut want);
        assert!(!want.windows(5).any(|w| w == b"usage"), "{want:?}");
        let mut chunked = Vec::new();
        for piece in ASKED.chunks(13) {
            chunked.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
            chunked.extend_from_slice(piece);
            chunked.extend_from_slice(b"\r\n");
        }
        chunked.extend_from_slice(b"0\r\n\r\n");
        for step in [1, 7, 64, 4096] {
            // Known length and chunked: the client gets it chunked, its end held back.
            for (framing, upstream) in [
                (Framing::Length(ASKED.len() as u64), ASKED),
                (Framing::Chunked, &chunked[..]),
            ] {
                let (sent, held) = stripped(framing, upstream, step);
                let all = [sent, held.clone()].concat();
                assert!(all.starts_with(b"HEAD") && held.ends_with(b"0\r\n\r\n"));
                let (used, rechunked) = decode(&all[4..], &[]).unwrap();
                assert_eq!(used, all.len() - 4, "{framing:?} in reads of {step}");
                let mut data = Vec::new();
                let mut c = Rechunk::new();
                c.feed_tapped(&rechunked, &mut Vec::new(), &mut |d| {
                    data.extend_from_slice(d)
                })
                .unwrap();
                assert_eq!(data, want, "{framing:?} in reads of {step}");
            }
            // Until the upstream closes: as it is, edited.
            let (sent, held) = stripped(Framing::UntilClose, ASKED, step);
            assert_eq!([sent, held].concat(), [&b"HEAD"[..], &want].concat());
        }
    }

    proptest::proptest! {
        /// Any chunked body, cut into any reads, is decoded to its end exactly and
        /// chunked again in the canonical form; any bytes at all are refused or taken
        /// in part, never past their end, and never panic.
        #[test]
        fn any_chunked_body_in_any_reads_is_rechunked_exactly(
            chunks in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 1..40), 0..6),
            upper in proptest::bool::ANY,
            trailers in proptest::collection::vec("[a-z]{1,8}: [a-z0-9]{0,8}", 0..3),
            cuts in proptest::collection::vec(0usize..400, 0..6),
            garbage in proptest::collection::vec(proptest::num::u8::ANY, 0..64),
        ) {
            let (mut body, mut canonical) = (Vec::new(), Vec::new());
            for c in &chunks {
                let size = if upper { format!("{:X}", c.len()) } else { format!("{:x}", c.len()) };
                body.extend_from_slice(size.as_bytes());
                body.extend_from_slice(b";e=1\r\n");
                body.extend_from_slice(c);
                body.extend_from_slice(b"\r\n");
                canonical.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
                canonical.extend_from_slice(c);
                canonical.extend_from_slice(b"\r\n");
            }
            body.extend_from_slice(b"0\r\n");
            for t in &trailers {
                body.extend_from_slice(t.as_bytes());
                body.extend_from_slice(b"\r\n");
            }
            body.extend_from_slice(b"\r\n");
            canonical.extend_from_slice(b"0\r\n\r\n");
            let mut all = body.clone();
            all.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
            let mut ends: Vec<usize> = cuts.iter().map(|c| c % (all.len() + 1)).collect();
            ends.sort_unstable();
            let (used, out) = decode(&all, &ends).unwrap();
            proptest::prop_assert_eq!(used, body.len());
            proptest::prop_assert_eq!(out, canonical);
            if let Ok(n) = Rechunk::new().feed(&garbage, &mut Vec::new()) {
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
