//! HTTP/1.1 message heads as the fast path reads and writes them: where a head ends,
//! how a body is framed (RFC 9112 §6), which headers go on, and the `Date` a
//! response carries.

use crate::forwarding::is_hop_by_hop_name;

/// The most headers a head may carry (hyper's default as well).
pub const MAX_HEADERS: usize = 100;

/// The longest head read (request or response); a longer one is refused (431, 502).
pub const MAX_HEAD: usize = 64 * 1024;

/// How a message's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`, passed on as it is.
    Chunked,
    /// Until the connection closes (a response without a length).
    UntilClose,
}

/// Why a head cannot be taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadHead {
    /// Malformed, or framed ambiguously (both `Content-Length` and
    /// `Transfer-Encoding`, two lengths, two `Host`s): 400.
    Malformed(&'static str),
    /// A transfer coding other than `chunked`: 501.
    Coding,
}

/// The length of the head at the start of `buf` (through its empty line), if it is
/// all there, looking from `from` on (where an earlier look stopped, less 3 bytes).
/// Lines may end in CRLF or a bare LF (as httparse reads them).
pub fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut from = from.min(buf.len());
    while let Some(i) = memchr::memchr(b'\n', &buf[from..]) {
        let nl = from + i;
        match buf.get(nl + 1) {
            Some(b'\n') => return Some(nl + 2),
            Some(b'\r') if buf.get(nl + 2) == Some(&b'\n') => return Some(nl + 3),
            _ => from = nl + 1,
        }
    }
    None
}

/// The length of an empty line at the start of `buf` (CRLF or LF), if there is one.
pub fn empty_line(buf: &[u8]) -> Option<usize> {
    match buf {
        [b'\r', b'\n', ..] => Some(2),
        [b'\n', ..] => Some(1),
        _ => None,
    }
}

/// What the fast path needs of a request's headers, read in one pass.
#[derive(Debug, Default)]
pub struct RequestHead<'h> {
    /// The `Host` value.
    pub host: Option<&'h str>,
    /// The body's framing.
    pub framing: Option<Framing>,
    /// `Connection: close`.
    pub close: bool,
    /// `Expect: 100-continue`.
    pub continue_expected: bool,
    /// Some other `Expect`, or an `Upgrade`: left to hyper.
    pub unusual: bool,
}

impl<'h> RequestHead<'h> {
    /// Whether a body follows the head.
    pub fn has_body(&self) -> bool {
        !matches!(self.framing(), Framing::Empty | Framing::Length(0))
    }

    /// Reads `headers`; `Err` when the request must be refused.
    pub fn of(headers: &'h [httparse::Header<'h>]) -> Result<Self, BadHead> {
        let mut head = RequestHead::default();
        let (mut length, mut chunked) = (None, false);
        for h in headers {
            let name = h.name;
            if name.eq_ignore_ascii_case("host") {
                if head.host.is_some() {
                    return Err(BadHead::Malformed("two Host headers"));
                }
                head.host = Some(
                    crate::keys::text(h.value)
                        .ok_or(BadHead::Malformed("a Host that is not text"))?,
                );
            } else if name.eq_ignore_ascii_case("content-length") {
                length = Some(content_length(h.value, length)?);
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                if chunked || !is_chunked(h.value) {
                    return Err(BadHead::Coding);
                }
                chunked = true;
            } else if name.eq_ignore_ascii_case("connection") {
                head.close |= has_token(h.value, "close");
                head.unusual |= has_token(h.value, "upgrade");
            } else if name.eq_ignore_ascii_case("expect") {
                if h.value.eq_ignore_ascii_case(b"100-continue") {
                    head.continue_expected = true;
                } else {
                    head.unusual = true;
                }
            } else if name.eq_ignore_ascii_case("upgrade") {
                head.unusual = true;
            }
        }
        head.framing = Some(match (length, chunked) {
            // A request smuggling attempt, or a broken client: refused (as nginx).
            (Some(_), true) => {
                return Err(BadHead::Malformed(
                    "both Content-Length and Transfer-Encoding",
                ))
            }
            (_, true) => Framing::Chunked,
            (None, false) => Framing::Empty,
            (Some(n), false) => Framing::Length(n),
        });
        Ok(head)
    }

    /// The body's framing.
    pub fn framing(&self) -> Framing {
        self.framing.unwrap_or(Framing::Empty)
    }
}

/// A `Content-Length` value, agreeing with an earlier one.
fn content_length(value: &[u8], earlier: Option<u64>) -> Result<u64, BadHead> {
    let bad = BadHead::Malformed("a bad Content-Length");
    let text = std::str::from_utf8(value).map_err(|_| bad)?.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad);
    }
    let n: u64 = text.parse().map_err(|_| bad)?;
    match earlier {
        Some(e) if e != n => Err(BadHead::Malformed("two different Content-Lengths")),
        _ => Ok(n),
    }
}

/// `Transfer-Encoding: chunked`, the one coding passed on.
fn is_chunked(value: &[u8]) -> bool {
    value.trim_ascii().eq_ignore_ascii_case(b"chunked")
}

/// Whether the comma-separated `value` holds `token` (any case).
pub fn has_token(value: &[u8], token: &str) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

/// What the fast path needs of a response's headers.
#[derive(Debug)]
pub struct ResponseHead {
    /// The body's framing, given the request's method.
    pub framing: Framing,
    /// The `Content-Length` the upstream sent (passed on for a HEAD or a 304, which
    /// have no body).
    pub length: Option<u64>,
    /// The upstream connection can take another request after this one.
    pub reusable: bool,
    /// The response has a `Date`.
    pub dated: bool,
}

impl ResponseHead {
    /// Reads a final response's status, version and headers (to a HEAD request when
    /// `to_head`); `None` when its framing is broken or is a transfer coding other
    /// than `chunked` alone.
    pub fn of(
        status: u16,
        version: u8,
        headers: &[httparse::Header<'_>],
        to_head: bool,
    ) -> Option<Self> {
        let (mut length, mut codings, mut close, mut keep_alive, mut dated) =
            (None, 0, false, false, false);
        let mut chunked = false;
        for h in headers {
            let name = h.name;
            if name.eq_ignore_ascii_case("content-length") {
                length = Some(content_length(h.value, length).ok()?);
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                codings += 1;
                chunked = is_chunked(h.value);
            } else if name.eq_ignore_ascii_case("connection") {
                close |= has_token(h.value, "close");
                keep_alive |= has_token(h.value, "keep-alive");
            } else if name.eq_ignore_ascii_case("date") {
                dated = true;
            }
        }
        if status < 200 || codings > 1 || (codings == 1 && !chunked) {
            return None;
        }
        let framing = if to_head || status == 204 || status == 304 {
            Framing::Empty
        } else if chunked {
            // A length beside the chunked coding is ignored (RFC 9112 §6.3).
            Framing::Chunked
        } else {
            length.map_or(Framing::UntilClose, Framing::Length)
        };
        let persistent = if version == 1 { !close } else { keep_alive };
        Some(ResponseHead {
            framing,
            length: if chunked { None } else { length },
            reusable: persistent && framing != Framing::UntilClose,
            dated,
        })
    }

    /// The framing header the client is sent: the length of a body, or of the body a
    /// HEAD or 304 stands for; chunked; or nothing (the connection's end).
    pub fn write_framing(&self, out: &mut Vec<u8>, status: u16) {
        match self.framing {
            Framing::Empty if status != 204 => {
                if let Some(n) = self.length {
                    write_length(out, n);
                }
            }
            framing => framing_header(out, framing),
        }
    }
}

/// Names a message's `Connection` header lists, which go no further than this hop
/// (except `Host` and the framing headers, which the proxy decides on itself).
pub fn connection_named<'h>(headers: &'h [httparse::Header<'h>]) -> Vec<&'h [u8]> {
    headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("connection"))
        .flat_map(|h| h.value.split(|&b| b == b','))
        .map(|t| t.trim_ascii())
        .filter(|t| !t.is_empty() && !crate::forwarding::kept_when_named(t))
        .collect()
}

/// The headers the proxy writes itself on every message it sends on: the framing.
pub const FRAMING: [&str; 2] = ["content-length", "transfer-encoding"];

/// Whether `name` goes on to the next hop: not hop-by-hop, not named by
/// `Connection`, and not one of `skip` (headers the proxy writes itself).
pub fn passes(name: &str, named: &[&[u8]], skip: &[&str]) -> bool {
    !is_hop_by_hop_name(name)
        && !named
            .iter()
            .any(|n| n.eq_ignore_ascii_case(name.as_bytes()))
        && !skip.iter().any(|s| s.eq_ignore_ascii_case(name))
}

/// Writes `name: value\r\n`.
pub fn header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Writes the framing header of `framing`: the proxy's own, whatever the message
/// came with (a header a `Connection` named or a length beside a chunked coding must
/// not decide where a body ends for the next hop).
pub fn framing_header(out: &mut Vec<u8>, framing: Framing) {
    match framing {
        Framing::Length(n) => write_length(out, n),
        Framing::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        Framing::Empty | Framing::UntilClose => {}
    }
}

fn write_length(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(b"content-length: ");
    crate::problem::push_decimal(out, n);
    out.extend_from_slice(b"\r\n");
}

/// Writes a status line.
pub fn status_line(out: &mut Vec<u8>, status: u16, reason: &str) {
    out.extend_from_slice(b"HTTP/1.1 ");
    crate::problem::push_decimal(out, u64::from(status));
    out.push(b' ');
    out.extend_from_slice(reason.as_bytes());
    out.extend_from_slice(b"\r\n");
}

thread_local! {
    /// This thread's `Date` value and the second it is for (formatted once a second).
    static DATE: std::cell::RefCell<(u64, [u8; 29])> = const { std::cell::RefCell::new((u64::MAX, [0; 29])) };
}

/// Calls `f` with the current `Date` header value (IMF-fixdate).
pub fn with_date<T>(f: impl FnOnce(&[u8]) -> T) -> T {
    // The Date header is wall-clock time by definition; no limiter reads it.
    #[allow(clippy::disallowed_methods)]
    let now = std::time::SystemTime::now();
    let secs = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    DATE.with(|d| {
        let mut d = d.borrow_mut();
        if d.0 != secs {
            let text = httpdate::fmt_http_date(now);
            let n = text.len().min(29);
            d.1[..n].copy_from_slice(&text.as_bytes()[..n]);
            d.0 = secs;
        }
        f(&d.1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(raw: &[u8], f: impl FnOnce(Result<RequestHead<'_>, BadHead>)) {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        assert!(req.parse(raw).unwrap().is_complete());
        f(RequestHead::of(req.headers));
    }

    #[test]
    fn a_head_ends_at_its_empty_line_with_either_line_ending() {
        let head = b"GET / HTTP/1.1\r\nHost: a\r\n\r\nrest";
        assert_eq!(head_end(head, 0), Some(27));
        // Looking again from where a shorter read (without the end) stopped finds it.
        for stop in 0..27usize {
            assert_eq!(
                head_end(head, stop.saturating_sub(3)),
                Some(27),
                "from {stop}"
            );
        }
        assert_eq!(head_end(b"GET / HTTP/1.1\nHost: a\n\nrest", 0), Some(24));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: a\r\n", 0), None);
        assert_eq!(head_end(b"", 5), None);
        assert_eq!(empty_line(b"\r\nGET"), Some(2));
        assert_eq!(empty_line(b"GET"), None);
    }

    #[test]
    fn request_framing_follows_rfc_9112_and_refuses_ambiguity() {
        parsed(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", |h| {
            let h = h.unwrap();
            assert_eq!(
                (h.host, h.framing(), h.close),
                (Some("a"), Framing::Empty, false)
            );
        });
        parsed(
            b"POST / HTTP/1.1\r\ncontent-length: 12\r\nConnection: Close\r\n\r\n",
            |h| {
                let h = h.unwrap();
                assert_eq!((h.framing(), h.close), (Framing::Length(12), true));
            },
        );
        parsed(
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            |h| assert_eq!(h.unwrap().framing(), Framing::Chunked),
        );
        parsed(
            b"POST / HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n",
            |h| assert!(matches!(h, Err(BadHead::Malformed(_)))),
        );
        parsed(
            b"POST / HTTP/1.1\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\n",
            |h| assert!(matches!(h, Err(BadHead::Malformed(_)))),
        );
        parsed(b"POST / HTTP/1.1\r\nContent-Length: +4\r\n\r\n", |h| {
            assert!(matches!(h, Err(BadHead::Malformed(_))))
        });
        parsed(
            b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            |h| assert_eq!(h.unwrap_err(), BadHead::Coding),
        );
        parsed(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", |h| {
            assert!(matches!(h, Err(BadHead::Malformed(_))))
        });
        parsed(
            b"GET / HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
            |h| assert!(h.unwrap().unusual),
        );
        parsed(
            b"PUT / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n",
            |h| {
                let h = h.unwrap();
                assert!(h.continue_expected && !h.unusual);
            },
        );
    }

    #[test]
    fn response_framing_and_reuse() {
        let h = |name: &'static str, value: &'static [u8]| httparse::Header { name, value };
        let length = [h("Content-Length", b"5")];
        let r = ResponseHead::of(200, 1, &length, false).unwrap();
        assert_eq!((r.framing, r.reusable), (Framing::Length(5), true));
        let r = ResponseHead::of(200, 1, &length, true).unwrap();
        assert_eq!(r.framing, Framing::Empty);
        assert_eq!(
            ResponseHead::of(304, 1, &length, false).unwrap().framing,
            Framing::Empty
        );
        let r = ResponseHead::of(200, 1, &[h("transfer-encoding", b"chunked")], false).unwrap();
        assert_eq!(r.framing, Framing::Chunked);
        let r = ResponseHead::of(200, 1, &[], false).unwrap();
        assert_eq!((r.framing, r.reusable), (Framing::UntilClose, false));
        let r = ResponseHead::of(200, 1, &[length[0], h("connection", b"close")], false).unwrap();
        assert!(!r.reusable);
        // Chunked beside a length: chunked, the length dropped.
        let both = [length[0], h("transfer-encoding", b"chunked")];
        let r = ResponseHead::of(200, 1, &both, false).unwrap();
        assert_eq!((r.framing, r.length), (Framing::Chunked, None));
        // Other codings, or chunked over two headers: refused.
        assert!(
            ResponseHead::of(200, 1, &[h("transfer-encoding", b"gzip, chunked")], false).is_none()
        );
        let two = [
            h("transfer-encoding", b"gzip"),
            h("transfer-encoding", b"chunked"),
        ];
        assert!(ResponseHead::of(200, 1, &two, false).is_none());
        assert!(ResponseHead::of(99, 1, &length, false).is_none());
        // A HEAD's length is passed on; a 204 has none.
        let mut out = Vec::new();
        ResponseHead::of(200, 1, &length, true)
            .unwrap()
            .write_framing(&mut out, 200);
        assert_eq!(out, b"content-length: 5\r\n");
        let mut out = Vec::new();
        ResponseHead::of(204, 1, &length, false)
            .unwrap()
            .write_framing(&mut out, 204);
        assert!(out.is_empty());
        let r = ResponseHead::of(200, 0, &length, false).unwrap();
        assert!(!r.reusable);
        assert!(ResponseHead::of(200, 1, &[length[0], h("content-length", b"6")], false).is_none());
    }

    #[test]
    fn hop_by_hop_and_connection_named_headers_stay_behind() {
        let headers = [
            httparse::Header {
                name: "Connection",
                value: b"keep-alive, X-Secret",
            },
            httparse::Header {
                name: "X-Secret",
                value: b"1",
            },
        ];
        let named = connection_named(&headers);
        assert!(!passes("connection", &named, &[]));
        // Connection may not take the framing or the Host away.
        let framing = [httparse::Header {
            name: "Connection",
            value: b"content-length, host, Transfer-Encoding",
        }];
        assert!(connection_named(&framing).is_empty());
        assert!(!passes("x-secret", &named, &[]));
        assert!(!passes("Keep-Alive", &named, &[]));
        assert!(!passes("X-Forwarded-For", &named, &["x-forwarded-for"]));
        assert!(passes("x-api-key", &named, &[]));
    }

    #[test]
    fn the_date_is_an_imf_fixdate() {
        let d = with_date(|d| String::from_utf8(d.to_vec()).unwrap());
        assert_eq!(d.len(), 29);
        assert!(d.ends_with(" GMT"), "{d}");
        assert!(httpdate::parse_http_date(&d).is_ok(), "{d}");
    }
}
