//! Streams that do not ask for their usage. OpenAI's API (and the servers that copy
//! it) puts a stream's usage in its last event only when the request says
//! `stream_options.include_usage`, and most clients do not say it. Under a `cost:`
//! route with `ask_usage: openai`, such a request goes upstream asking for it
//! ([`ask`]), and what the client did not ask for is taken out of the stream it
//! receives ([`Unasked`]): the usage-only last event, and the `"usage": null` every
//! other event then carries. The client's stream is the one it would have had without
//! the proxy, byte for byte; the proxy's meter reads the usage before it goes.
//!
//! Edits are made in the bytes, not by writing the JSON again: every other byte of a
//! request or an event stays as it was.

use std::ops::Range;

use serde_json::Value;

/// Whether requests to `path` take `stream_options` (OpenAI's chat completions and
/// completions, under any prefix; the Responses API reports usage in every stream).
pub(super) fn openai_shaped(path: &str) -> bool {
    path.ends_with("/chat/completions") || path.ends_with("/completions")
}

/// What to send upstream instead of `body`: the same JSON object asking for its
/// stream's usage, when it is a stream (`"stream": true`) that does not ask already
/// (`stream_options.include_usage: true`); `None` for anything else.
pub(super) fn ask(body: &[u8]) -> Option<Vec<u8>> {
    let json: Value = serde_json::from_slice(body).ok()?;
    let object = json.as_object()?;
    if object.get("stream") != Some(&Value::Bool(true)) {
        return None;
    }
    let options = match object.get("stream_options") {
        None => {
            // A new member first: the object has one at least ("stream").
            let open = body.iter().position(|&b| b == b'{')?;
            let mut asked = Vec::with_capacity(body.len() + 40);
            asked.extend_from_slice(&body[..=open]);
            asked.extend_from_slice(br#""stream_options":{"include_usage":true},"#);
            asked.extend_from_slice(&body[open + 1..]);
            return Some(asked);
        }
        Some(Value::Object(o)) if o.get("include_usage") == Some(&Value::Bool(true)) => {
            return None
        }
        Some(Value::Object(o)) => o.clone(),
        Some(Value::Null) => serde_json::Map::new(),
        // Not options an upstream takes: its answer says so, not the proxy's.
        Some(_) => return None,
    };
    let mut options = options;
    options.insert("include_usage".into(), Value::Bool(true));
    let m = find(body, b"stream_options")?;
    let mut asked = Vec::with_capacity(body.len() + 24);
    asked.extend_from_slice(&body[..m.value.start]);
    asked.extend_from_slice(&serde_json::to_vec(&options).ok()?);
    asked.extend_from_slice(&body[m.value.end..]);
    Some(asked)
}

/// Takes the usage a client did not ask for out of a server-sent event stream, event
/// by event (an event goes on once its blank line has come). An event past `max`
/// bytes goes on as it is.
#[derive(Debug)]
pub(super) struct Unasked {
    /// The current event so far.
    event: Vec<u8>,
    /// Nothing but perhaps a CR since the last line end: a line end now ends the
    /// event.
    line_empty: bool,
    /// The current event passed `max`: its bytes go on as they come, to its end.
    passing: bool,
    max: usize,
}

impl Unasked {
    /// A filter holding at most `max` bytes of an event.
    pub fn new(max: usize) -> Self {
        Unasked {
            event: Vec::new(),
            line_empty: true,
            passing: false,
            max,
        }
    }

    /// Reads `chunk` of the stream; what the client gets goes to `out`.
    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        for &b in chunk {
            if self.passing {
                out.push(b);
            } else {
                self.event.push(b);
            }
            let ends = match b {
                b'\n' => std::mem::replace(&mut self.line_empty, true),
                b'\r' => false,
                _ => {
                    self.line_empty = false;
                    false
                }
            };
            if ends && self.passing {
                self.passing = false;
            } else if ends {
                edit_event(&self.event, out);
                self.event.clear();
            } else if !self.passing && self.event.len() > self.max {
                out.append(&mut self.event);
                self.passing = true;
            }
        }
    }

    /// The stream has ended: what is left of its last event goes to `out`.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if !self.event.is_empty() {
            edit_event(&self.event, out);
            self.event.clear();
        }
    }
}

/// One whole event (its blank line included, if it came): the usage-only event is
/// dropped, a `usage` member taken out of any other; anything else goes on as it is.
fn edit_event(event: &[u8], out: &mut Vec<u8>) {
    let data_lines: Vec<Range<usize>> = lines(event)
        .filter(|r| event[r.clone()].starts_with(b"data:"))
        .collect();
    let [line] = data_lines.as_slice() else {
        out.extend_from_slice(event);
        return;
    };
    let mut start = line.start + b"data:".len();
    if event.get(start) == Some(&b' ') {
        start += 1;
    }
    let data = &event[start..line.end];
    // Read in place: this runs on every event of every stream asked for its usage.
    let Some(usage) = find(data, b"usage") else {
        out.extend_from_slice(event);
        return;
    };
    // The usage-only event (its choices empty) goes whole.
    let usage_only = &data[usage.value.clone()] != b"null"
        && find(data, b"choices").is_some_and(|c| is_empty_array(&data[c.value]));
    if usage_only {
        return;
    }
    let cut = usage.without();
    out.extend_from_slice(&event[..start + cut.start]);
    out.extend_from_slice(&event[start + cut.end..]);
}

/// Whether `json` is `[]` (whitespace inside allowed).
fn is_empty_array(json: &[u8]) -> bool {
    json.first() == Some(&b'[') && space(json, 1) == json.len() - 1 && json.last() == Some(&b']')
}

/// Whether the JSON object `json` has a top-level member `name` that is not `null`
/// (false also when `json` does not read as an object that far).
pub(super) fn has_value(json: &[u8], name: &[u8]) -> bool {
    find(json, name).is_some_and(|m| &json[m.value] != b"null")
}

/// The lines of `event`, each without its line end.
fn lines(event: &[u8]) -> impl Iterator<Item = Range<usize>> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= event.len() {
            return None;
        }
        let end = (event[at..].iter().position(|&b| b == b'\n')).map_or(event.len(), |n| at + n);
        let line = at..if end > at && event[end - 1] == b'\r' {
            end - 1
        } else {
            end
        };
        at = end + 1;
        Some(line)
    })
}

/// A member of a JSON object, where it lies in the object's bytes.
#[derive(Debug, PartialEq, Eq)]
struct Member {
    /// From its name's opening quote to the end of its value.
    whole: Range<usize>,
    /// Its value.
    value: Range<usize>,
    /// The comma before it, if it is not the first member.
    comma_before: Option<usize>,
    /// Where the next member begins, if one follows.
    next: Option<usize>,
}

impl Member {
    /// What to cut to take the member out, the commas kept right.
    fn without(&self) -> Range<usize> {
        match (self.comma_before, self.next) {
            (Some(comma), _) => comma..self.whole.end,
            (None, Some(next)) => self.whole.start..next,
            (None, None) => self.whole.clone(),
        }
    }
}

/// The top-level member `name` of the JSON object in `json` (the first, spelled
/// without escapes), if it is one.
fn find(json: &[u8], name: &[u8]) -> Option<Member> {
    let mut i = space(json, 0);
    if json.get(i) != Some(&b'{') {
        return None;
    }
    i = space(json, i + 1);
    let mut comma_before = None;
    while json.get(i) == Some(&b'"') {
        let key_end = string_end(json, i)?;
        let colon = space(json, key_end);
        if json.get(colon) != Some(&b':') {
            return None;
        }
        let value_start = space(json, colon + 1);
        let value_end = value_end(json, value_start)?;
        let after = space(json, value_end);
        let next = (json.get(after) == Some(&b',')).then(|| space(json, after + 1));
        if &json[i + 1..key_end - 1] == name {
            return Some(Member {
                whole: i..value_end,
                value: value_start..value_end,
                comma_before,
                next,
            });
        }
        comma_before = Some(after);
        i = next?;
    }
    None
}

/// The first byte of `json` from `i` that is not JSON whitespace.
fn space(json: &[u8], mut i: usize) -> usize {
    while matches!(json.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// Just past the string that opens at `i`.
fn string_end(json: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    loop {
        match json.get(j)? {
            b'\\' => j += 2,
            b'"' => return Some(j + 1),
            _ => j += 1,
        }
    }
}

/// Just past the value that begins at `i`.
fn value_end(json: &[u8], i: usize) -> Option<usize> {
    match json.get(i)? {
        b'"' => string_end(json, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            loop {
                match json.get(j)? {
                    b'"' => {
                        j = string_end(json, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        _ => {
            let n = json[i..]
                .iter()
                .position(|b| matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'));
            Some(n.map_or(json.len(), |n| i + n))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(body: &str) -> Option<String> {
        ask(body.as_bytes()).map(|b| String::from_utf8(b).unwrap())
    }

    #[test]
    fn a_stream_that_does_not_ask_for_its_usage_asks_and_nothing_else_changes() {
        assert_eq!(
            asked(r#"{"model": "m", "stream": true, "n": 1.50}"#).unwrap(),
            r#"{"stream_options":{"include_usage":true},"model": "m", "stream": true, "n": 1.50}"#
        );
        // Options of its own keep theirs; a `false` is asked over.
        assert_eq!(
            asked(r#"{"stream":true, "stream_options" : {"x":1} ,"a":[1]}"#).unwrap(),
            r#"{"stream":true, "stream_options" : {"include_usage":true,"x":1} ,"a":[1]}"#
        );
        assert_eq!(
            asked(r#"{"stream_options":{"include_usage":false},"stream":true}"#).unwrap(),
            r#"{"stream_options":{"include_usage":true},"stream":true}"#
        );
        assert_eq!(
            asked(r#"{"stream_options":null,"stream":true}"#).unwrap(),
            r#"{"stream_options":{"include_usage":true},"stream":true}"#
        );
        // Asking already, not a stream, not an object, not JSON: as it is.
        for body in [
            r#"{"stream":true,"stream_options":{"include_usage":true}}"#,
            r#"{"stream":false}"#,
            r#"{"model":"m"}"#,
            r#"{"stream":"true"}"#,
            r#"{"stream":true,"stream_options":7}"#,
            "[1]",
            "not json",
        ] {
            assert_eq!(asked(body), None, "{body}");
        }
        assert!(openai_shaped("/v1/chat/completions") && openai_shaped("/v1/completions"));
        assert!(openai_shaped("/openai/deployments/d/chat/completions"));
        assert!(!openai_shaped("/v1/responses") && !openai_shaped("/v1/embeddings"));
    }

    fn unasked(chunks: &[&str], max: usize) -> String {
        let mut f = Unasked::new(max);
        let mut out = Vec::new();
        for c in chunks {
            f.feed(c.as_bytes(), &mut out);
        }
        f.finish(&mut out);
        String::from_utf8(out).unwrap()
    }

    /// An OpenAI stream asked for its usage, and the same stream not asked.
    const ASKED: &str =
        "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n\
        data: {\"id\": \"c\", \"usage\": null, \"choices\": [{\"delta\": {}}]}\r\n\r\n\
        data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"total_tokens\":12}}\n\n\
        data: [DONE]\n\n";
    const NOT_ASKED: &str =
        "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n\
        data: {\"id\": \"c\", \"choices\": [{\"delta\": {}}]}\r\n\r\n\
        data: [DONE]\n\n";

    #[test]
    fn the_usage_a_client_did_not_ask_for_is_taken_out_of_its_stream() {
        assert_eq!(unasked(&[ASKED], 1 << 20), NOT_ASKED);
        // However the stream is cut into chunks, a byte at a time included.
        let bytes: Vec<String> = ASKED.chars().map(String::from).collect();
        let bytes: Vec<&str> = bytes.iter().map(String::as_str).collect();
        assert_eq!(unasked(&bytes, 1 << 20), NOT_ASKED);
        for cut in 1..ASKED.len() {
            assert_eq!(unasked(&[&ASKED[..cut], &ASKED[cut..]], 1 << 20), NOT_ASKED);
        }
        // The only member, the first of several: the commas stay right.
        assert_eq!(
            unasked(
                &[
                    "data: {\"usage\":null}\n\n",
                    "data: {\"usage\":null, \"a\":1}\n\n"
                ],
                64
            ),
            "data: {}\n\ndata: {\"a\":1}\n\n"
        );
        // Usage beside choices (a server that sends it with the last words): the
        // event stays, without it.
        assert_eq!(
            unasked(
                &["data: {\"choices\":[{\"x\":1}],\"usage\":{\"total_tokens\":3}}\n\n"],
                64
            ),
            "data: {\"choices\":[{\"x\":1}]}\n\n"
        );
        // Comments, other fields, events without usage, a nested usage: as they are.
        let other = ": ping\n\nevent: x\ndata: {\"a\":{\"usage\":null}}\n\ndata: {\"s\":\"\\\"usage\\\"\"}\n\n";
        assert_eq!(unasked(&[other], 1 << 20), other);
        // A stream cut before its last blank line still loses the usage event.
        assert_eq!(
            unasked(
                &["data: {\"choices\":[],\"usage\":{\"total_tokens\":1}}"],
                64
            ),
            ""
        );
    }

    #[test]
    fn an_event_past_the_bound_goes_on_as_it_is() {
        let big = format!(
            "data: {{\"usage\":null,\"pad\":\"{}\"}}\n\n",
            "x".repeat(100)
        );
        let stream = format!("{big}{ASKED}");
        // Cut anywhere: the large event passes whole, the rest is edited.
        for cut in [1, 10, 60, 100, 130, big.len() - 1, big.len(), big.len() + 5] {
            let out = unasked(&[&stream[..cut], &stream[cut..]], 80);
            assert_eq!(out, format!("{big}{NOT_ASKED}"), "cut at {cut}");
        }
    }

    #[test]
    fn a_member_is_found_at_the_top_only() {
        let json = br#" { "a" : {"usage":1}, "usage" : [1,{"b":"}"}] , "c":null } "#;
        let m = find(json, b"usage").unwrap();
        assert_eq!(&json[m.value.clone()], br#"[1,{"b":"}"}]"#);
        let cut = m.without();
        let rest = [&json[..cut.start], &json[cut.end..]].concat();
        assert_eq!(rest, br#" { "a" : {"usage":1} , "c":null } "#);
        assert_eq!(find(br#"{"a":1}"#, b"usage"), None);
        assert_eq!(find(br#"{"a":"#, b"usage"), None);
        assert_eq!(find(b"[]", b"usage"), None);
    }
}
