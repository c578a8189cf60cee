//! Server-sent events framing: bytes in, frames out.
//!
//! A small parser of our own rather than `eventsource-stream`, because the
//! query engine needs what that crate (0.2.3) does not give: a byte limit on
//! a frame, a leading UTF-8 BOM that does not panic, a frame ended by a bare
//! CR at the end of the stream that is not held back, the `id:` of *this*
//! frame (not the last one seen, so the id-less `query` frame is never taken
//! for a replay), and frames borrowed from the read buffer so the hot path
//! allocates nothing before event decoding.
//!
//! It follows the HTML "event stream interpretation" rules: lines end with
//! CRLF, LF or CR; a line starting with `:` is a comment; `data:` lines are
//! joined with `\n`; a blank line dispatches; a frame without `data:` is not
//! dispatched; an incomplete frame at the end of the stream is discarded.

use std::ops::Range;
use std::time::Duration;

/// The default limit on one frame's bytes (4 MiB).
pub const DEFAULT_MAX_FRAME_BYTES: usize = 4 * 1024 * 1024;

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Why a stream of frames cannot go on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SseError {
    /// A frame (or a line) grew beyond the limit.
    FrameTooLarge(usize),
    /// A frame's event name or data was not UTF-8.
    InvalidUtf8,
}

impl std::fmt::Display for SseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SseError::FrameTooLarge(limit) => {
                write!(f, "an event frame is larger than the {limit} byte limit")
            }
            SseError::InvalidUtf8 => f.write_str("an event frame is not valid UTF-8"),
        }
    }
}

/// One dispatched frame, borrowed from the parser.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Frame<'a> {
    /// The numeric `id:` this frame carried, if any.
    pub(crate) id: Option<u64>,
    /// The `event:` name (`message` when absent).
    pub(crate) event: &'a str,
    /// The `data:` lines joined with `\n`.
    pub(crate) data: &'a str,
    /// The frame had an `id:` that is not a decimal `u64` (it is then `None`).
    pub(crate) bad_id: bool,
}

/// Incremental SSE parser with a per-frame byte limit.
#[derive(Debug)]
pub(crate) struct SseParser {
    /// Bytes received and not yet released.
    buf: Vec<u8>,
    /// First byte that still belongs to the frame being built (or later).
    frame_start: usize,
    /// Where line scanning resumes.
    scan: usize,
    /// Bytes from `scan` up to here are known to hold no line ending: a
    /// frame that arrives in many chunks is scanned once, not once per chunk.
    searched: usize,
    /// The last line ended with CR: an LF right after it is part of that ending.
    skip_lf: bool,
    /// Whether the start of the stream was checked for a BOM.
    bom_checked: bool,
    max_frame: usize,
    /// The limit for a frame named `query` (the final Query document).
    max_query_frame: usize,
    /// The frame being built.
    event: Option<Range<usize>>,
    data: Option<Range<usize>>,
    /// Joined data, once a frame has a second `data:` line.
    data_owned: Vec<u8>,
    data_lines: u32,
    id: Option<u64>,
    /// The frame being built had a non-numeric `id:`.
    bad_id: bool,
    /// `data_owned` belongs to the frame returned last and is cleared lazily.
    release_owned: bool,
    /// The last `retry:` value.
    retry: Option<Duration>,
}

impl SseParser {
    /// A parser for a new stream.
    pub(crate) fn new(max_frame: usize) -> Self {
        SseParser {
            buf: Vec::new(),
            frame_start: 0,
            scan: 0,
            searched: 0,
            skip_lf: false,
            bom_checked: false,
            max_frame: max_frame.max(1),
            max_query_frame: max_frame.max(1),
            event: None,
            data: None,
            data_owned: Vec::new(),
            data_lines: 0,
            id: None,
            bad_id: false,
            release_owned: false,
            retry: None,
        }
    }

    /// Lets a frame named `query` (the final Query document, which may be
    /// far larger than a progress event) grow to `limit` bytes.
    pub(crate) fn with_query_frame_limit(mut self, limit: usize) -> Self {
        self.max_query_frame = limit.max(self.max_frame);
        self
    }

    /// The limit for the frame being built: the `query` frame's once its
    /// `event:` line was read.
    fn limit(&self) -> usize {
        match &self.event {
            Some(r) if &self.buf[r.clone()] == b"query" => self.max_query_frame,
            _ => self.max_frame,
        }
    }

    /// The reconnection delay the stream asked for with `retry:`, if any.
    pub(crate) fn retry(&self) -> Option<Duration> {
        self.retry
    }

    /// Appends received bytes.
    pub(crate) fn feed(&mut self, chunk: &[u8]) {
        if self.frame_start > 0 {
            // Release what dispatched frames used; the partial frame moves down.
            let shift = self.frame_start;
            self.buf.drain(..shift);
            self.scan -= shift;
            self.searched = self.searched.saturating_sub(shift);
            self.frame_start = 0;
            if let Some(r) = &mut self.event {
                *r = r.start - shift..r.end - shift;
            }
            if let Some(r) = &mut self.data {
                *r = r.start - shift..r.end - shift;
            }
        }
        self.buf.extend_from_slice(chunk);
    }

    /// Bytes of the frame under construction, up to `end` in the buffer.
    fn frame_bytes(&self, end: usize) -> usize {
        (end - self.frame_start).saturating_add(self.data_owned.len())
    }

    /// The next complete frame, `Ok(None)` when more bytes are needed.
    ///
    /// # Errors
    /// A frame beyond the byte limit, or one that is not UTF-8. The stream
    /// cannot go on after either.
    pub(crate) fn next_frame(&mut self) -> Result<Option<Frame<'_>>, SseError> {
        if self.release_owned {
            self.data_owned.clear();
            self.release_owned = false;
        }
        if !self.bom_checked {
            let rest = &self.buf[self.scan..];
            if rest.len() < BOM.len() && BOM.starts_with(rest) {
                return Ok(None);
            }
            if rest.starts_with(BOM) {
                self.scan += BOM.len();
                self.frame_start = self.scan;
            }
            self.bom_checked = true;
        }
        loop {
            if self.skip_lf {
                match self.buf.get(self.scan) {
                    None => return Ok(None),
                    Some(b'\n') => self.scan += 1,
                    Some(_) => {}
                }
                self.skip_lf = false;
                if self.event.is_none() && self.data.is_none() {
                    self.frame_start = self.scan;
                }
            }
            let from = self.searched.max(self.scan);
            let Some(i) = memchr::memchr2(b'\n', b'\r', &self.buf[from..]) else {
                // Everything left is the frame's unfinished line; the next
                // search starts where this one ended.
                self.searched = self.buf.len();
                let limit = self.limit();
                if self.frame_bytes(self.buf.len()) > limit {
                    return Err(SseError::FrameTooLarge(limit));
                }
                return Ok(None);
            };
            let i = from - self.scan + i;
            let line = self.scan..self.scan + i;
            self.skip_lf = self.buf[self.scan + i] == b'\r';
            self.scan += i + 1;
            if line.is_empty() {
                if self.data_lines == 0 {
                    // Nothing to dispatch (comments, `id:` or `event:` alone).
                    self.event = None;
                    self.id = None;
                    self.bad_id = false;
                    self.frame_start = self.scan;
                    continue;
                }
                return self.dispatch();
            }
            self.field(line);
            let limit = self.limit();
            if self.frame_bytes(self.scan) > limit {
                return Err(SseError::FrameTooLarge(limit));
            }
            if self.event.is_none() && self.data.is_none() {
                self.frame_start = self.scan;
            }
        }
    }

    /// Applies one non-empty line to the frame under construction.
    fn field(&mut self, line: Range<usize>) {
        let bytes = &self.buf[line.clone()];
        if bytes[0] == b':' {
            return;
        }
        let (name, value) = match memchr::memchr(b':', bytes) {
            Some(c) => {
                let skip = usize::from(bytes.get(c + 1) == Some(&b' '));
                (
                    line.start..line.start + c,
                    line.start + c + 1 + skip..line.end,
                )
            }
            None => (line.clone(), line.end..line.end),
        };
        match &self.buf[name] {
            b"data" => {
                match self.data_lines {
                    0 => self.data = Some(value),
                    _ => {
                        if let Some(first) = self.data.take() {
                            self.data_owned.extend_from_slice(&self.buf[first]);
                        }
                        self.data_owned.push(b'\n');
                        self.data_owned.extend_from_slice(&self.buf[value]);
                    }
                }
                self.data_lines = self.data_lines.saturating_add(1);
            }
            b"event" => self.event = Some(value),
            b"id" => {
                let v = &self.buf[value];
                // An id with NUL is ignored; an empty one clears the id.
                if !v.contains(&0) {
                    self.id = parse_u64(v);
                    self.bad_id = self.id.is_none() && !v.is_empty();
                    if self.bad_id {
                        tracing::debug!("a non-numeric event id");
                    }
                }
            }
            b"retry" => {
                if let Some(ms) = parse_u64(&self.buf[value]) {
                    self.retry = Some(Duration::from_millis(ms));
                }
            }
            _ => {}
        }
    }

    fn dispatch(&mut self) -> Result<Option<Frame<'_>>, SseError> {
        let id = self.id.take();
        let bad_id = std::mem::take(&mut self.bad_id);
        let event = self.event.take();
        let data = self.data.take();
        let owned = self.data_lines > 1;
        self.data_lines = 0;
        self.frame_start = self.scan;
        self.release_owned = owned;
        let event = match event {
            Some(r) => std::str::from_utf8(&self.buf[r]).map_err(|_| SseError::InvalidUtf8)?,
            None => "message",
        };
        let event = if event.is_empty() { "message" } else { event };
        let data = if owned {
            &self.data_owned[..]
        } else {
            data.map_or(&[][..], |r| &self.buf[r])
        };
        let data = std::str::from_utf8(data).map_err(|_| SseError::InvalidUtf8)?;
        Ok(Some(Frame {
            id,
            event,
            data,
            bad_id,
        }))
    }
}

/// Parses ASCII digits; anything else (or an overflow) is `None`.
fn parse_u64(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 20 {
        return None;
    }
    let mut n: u64 = 0;
    for &b in v {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Owned {
        id: Option<u64>,
        event: String,
        data: String,
    }

    fn drain(p: &mut SseParser) -> Result<Vec<Owned>, SseError> {
        let mut out = Vec::new();
        while let Some(f) = p.next_frame()? {
            out.push(Owned {
                id: f.id,
                event: f.event.to_owned(),
                data: f.data.to_owned(),
            });
        }
        Ok(out)
    }

    fn parse_split(input: &[u8], split: usize) -> Result<Vec<Owned>, SseError> {
        let mut p = SseParser::new(DEFAULT_MAX_FRAME_BYTES);
        let mut out = Vec::new();
        for chunk in input.chunks(split.max(1)) {
            p.feed(chunk);
            out.extend(drain(&mut p)?);
        }
        Ok(out)
    }

    fn o(id: Option<u64>, event: &str, data: &str) -> Owned {
        Owned {
            id,
            event: event.into(),
            data: data.into(),
        }
    }

    #[test]
    fn every_line_ending_and_split_gives_the_same_frames() {
        let lf = "\u{feff}: hello\nretry: 7\nid: 1\nevent: a\ndata: x\n\nevent: query\ndata: {\ndata:  \"y\"}\n\n";
        let expected = vec![o(Some(1), "a", "x"), o(None, "query", "{\n \"y\"}")];
        for ending in ["\n", "\r\n", "\r"] {
            let input = lf.replace('\n', ending);
            for split in [1, 2, 3, 5, 64] {
                let got = parse_split(input.as_bytes(), split).unwrap();
                assert_eq!(got, expected, "ending {ending:?} split {split}");
            }
        }
    }

    #[test]
    fn retry_is_remembered() {
        let mut p = SseParser::new(1024);
        p.feed(b"retry: 1500\n\nretry: x\n\n");
        assert!(p.next_frame().unwrap().is_none());
        assert_eq!(p.retry(), Some(Duration::from_millis(1500)));
    }

    #[test]
    fn frame_without_id_reports_no_id() {
        let got = parse_split(b"id: 5\ndata: a\n\ndata: b\n\n", 1).unwrap();
        assert_eq!(
            got,
            vec![o(Some(5), "message", "a"), o(None, "message", "b")]
        );
    }

    #[test]
    fn frames_without_data_are_not_dispatched() {
        let got = parse_split(b"id: 5\nevent: x\n\n: c\n\ndata\n\n", 4).unwrap();
        assert_eq!(got, vec![o(None, "message", "")]);
    }

    #[test]
    fn incomplete_frame_at_end_is_not_dispatched() {
        let got = parse_split(b"data: a\n\ndata: b\n", 3).unwrap();
        assert_eq!(got, vec![o(None, "message", "a")]);
    }

    #[test]
    fn bare_cr_ending_dispatches_the_last_frame_at_once() {
        let mut p = SseParser::new(1024);
        p.feed(b"event: query\rdata: {}\r\r");
        let f = p.next_frame().unwrap().unwrap();
        assert_eq!((f.event, f.data), ("query", "{}"));
    }

    #[test]
    fn oversized_frame_is_an_error_not_growth() {
        let mut p = SseParser::new(64);
        p.feed(b"data: ");
        p.feed(&[b'x'; 100]);
        assert_eq!(p.next_frame(), Err(SseError::FrameTooLarge(64)));
        let mut p = SseParser::new(64);
        for _ in 0..20 {
            p.feed(b"data: 12345\n");
        }
        assert_eq!(p.next_frame(), Err(SseError::FrameTooLarge(64)));
    }

    #[test]
    fn limit_counts_one_frame_not_the_whole_chunk() {
        let mut p = SseParser::new(32);
        p.feed(&b"data: 0123456789\n\n".repeat(50));
        assert_eq!(drain(&mut p).unwrap().len(), 50);
    }

    #[test]
    fn comments_alone_never_hit_the_limit() {
        let mut p = SseParser::new(64);
        for _ in 0..100 {
            p.feed(b": keep-alive\n");
            assert_eq!(p.next_frame(), Ok(None));
        }
    }

    #[test]
    fn invalid_utf8_is_an_error() {
        let mut p = SseParser::new(64);
        p.feed(b"data: \xff\xfe\n\n");
        assert_eq!(p.next_frame(), Err(SseError::InvalidUtf8));
    }

    #[test]
    fn non_numeric_ids_are_flagged() {
        let mut p = SseParser::new(1024);
        p.feed(b"id: x7\ndata: a\n\nid: 8\ndata: b\n\nid:\ndata: c\n\n");
        let f = p.next_frame().unwrap().unwrap();
        assert_eq!((f.id, f.bad_id), (None, true));
        let f = p.next_frame().unwrap().unwrap();
        assert_eq!((f.id, f.bad_id), (Some(8), false));
        let f = p.next_frame().unwrap().unwrap();
        assert_eq!((f.id, f.bad_id), (None, false));
    }

    #[test]
    fn the_query_frame_has_its_own_limit() {
        let big = "x".repeat(200);
        let wire = format!("event: query\ndata: {big}\n\nevent: other\ndata: {big}\n\n");
        for split in [1, 7, 4096] {
            let mut p = SseParser::new(64).with_query_frame_limit(1024);
            let mut frames = Vec::new();
            let mut error = None;
            for chunk in wire.as_bytes().chunks(split) {
                p.feed(chunk);
                loop {
                    match p.next_frame() {
                        Ok(Some(f)) => frames.push(f.event.to_owned()),
                        Ok(None) => break,
                        Err(e) => {
                            error = Some(e);
                            break;
                        }
                    }
                }
                if error.is_some() {
                    break;
                }
            }
            assert_eq!(frames, ["query"], "split {split}");
            assert_eq!(error, Some(SseError::FrameTooLarge(64)), "split {split}");
        }
    }

    #[test]
    fn a_frame_in_many_chunks_is_scanned_from_where_the_last_search_ended() {
        let mut p = SseParser::new(1 << 20);
        p.feed(b"event: query\ndata: ");
        assert_eq!(p.next_frame(), Ok(None));
        for _ in 0..100 {
            p.feed(&[b'x'; 1000]);
            assert_eq!(p.next_frame(), Ok(None));
            // Nothing before the end is searched again.
            assert_eq!(p.searched, p.buf.len());
        }
        p.feed(b"\n\n");
        let f = p.next_frame().unwrap().unwrap();
        assert_eq!((f.event, f.data.len()), ("query", 100_000));
    }

    #[test]
    fn huge_retry_values_do_not_panic() {
        let mut p = SseParser::new(1024);
        p.feed(b"retry: 18446744073709551615\n\n");
        assert_eq!(p.next_frame(), Ok(None));
        assert_eq!(p.retry(), Some(Duration::from_millis(u64::MAX)));
    }

    #[test]
    fn non_numeric_ids_are_ignored() {
        let got = parse_split(
            b"id: abc\ndata: a\n\nid: 99999999999999999999999\ndata: b\n\n",
            7,
        )
        .unwrap();
        assert_eq!(got, vec![o(None, "message", "a"), o(None, "message", "b")]);
    }

    #[test]
    fn dispatched_frames_release_their_bytes() {
        // Frames fed one at a time: the buffer keeps at most the last frame,
        // never the stream so far (every buffer is bounded).
        let mut p = SseParser::new(1024);
        for i in 0..10_000 {
            p.feed(format!("id: {i}\ndata: {i}\n\n").as_bytes());
            while p.next_frame().unwrap().is_some() {}
        }
        assert!(p.buf.len() < 64, "{} bytes kept", p.buf.len());
    }

    #[test]
    fn a_leading_bom_before_a_field_is_skipped_however_the_stream_is_split() {
        let input = "\u{feff}data: x\n\n";
        for split in 1..=input.len() {
            let got = parse_split(input.as_bytes(), split).unwrap();
            assert_eq!(got, vec![o(None, "message", "x")], "split {split}");
        }
    }

    #[test]
    fn an_unfinished_frame_of_exactly_the_limit_waits_for_more() {
        // 8 bytes of an unfinished line with an 8-byte limit: not beyond it.
        let mut p = SseParser::new(8);
        p.feed(b"data: ab");
        assert_eq!(p.next_frame(), Ok(None));
        p.feed(b"c");
        assert_eq!(p.next_frame(), Err(SseError::FrameTooLarge(8)));
    }

    #[test]
    fn errors_name_the_limit() {
        assert_eq!(
            SseError::FrameTooLarge(4096).to_string(),
            "an event frame is larger than the 4096 byte limit"
        );
        assert_eq!(
            SseError::InvalidUtf8.to_string(),
            "an event frame is not valid UTF-8"
        );
    }

    #[test]
    fn a_frame_of_exactly_the_limit_is_delivered() {
        // `data: ab\n` is 9 bytes; the blank line that ends the frame adds none.
        let mut p = SseParser::new(9);
        p.feed(b"data: ab\n\n");
        assert_eq!(drain(&mut p).unwrap(), vec![o(None, "message", "ab")]);
        let mut p = SseParser::new(8);
        p.feed(b"data: ab\n\n");
        assert_eq!(drain(&mut p), Err(SseError::FrameTooLarge(8)));
    }
}
