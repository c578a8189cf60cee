//! [`Ring`]: the frames of one relayed turn, bounded by count and bytes,
//! with the answer text up to the newest frame.

use std::collections::VecDeque;

/// One frame as the browser receives it: its id, its `event:` name and its
/// `data:`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Frame {
    pub(crate) id: u64,
    pub(crate) event: String,
    pub(crate) data: String,
    /// The bytes of answer text before this frame.
    text_before: usize,
}

impl Frame {
    pub(crate) fn bytes(&self) -> usize {
        self.event.len().saturating_add(self.data.len())
    }
}

/// What a reader whose last frame is `after` reads next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// The frame after `after`.
    Frame(Frame),
    /// The frames after `after` were evicted: the text up to frame `id`
    /// (the one before the oldest kept) replaces what the reader has.
    Snapshot { id: u64, text: String },
    /// Nothing yet.
    Wait,
    /// The turn ended and the reader has every frame.
    End,
}

/// The newest frames of a turn (at most `max_frames`, at most `max_bytes`
/// except that the newest frame always stays), the ids handed out so far and
/// the answer text up to the newest one.
#[derive(Debug)]
pub(crate) struct Ring {
    frames: VecDeque<Frame>,
    bytes: usize,
    max_frames: usize,
    max_bytes: usize,
    last_id: u64,
    text: String,
    ended: bool,
}

impl Ring {
    pub(crate) fn new(max_frames: usize, max_bytes: usize) -> Self {
        Ring {
            frames: VecDeque::new(),
            bytes: 0,
            max_frames: max_frames.max(1),
            max_bytes,
            last_id: 0,
            text: String::new(),
            ended: false,
        }
    }

    /// Appends a frame under the next id; `delta` is the answer text it adds.
    pub(crate) fn push(&mut self, event: String, data: String, delta: Option<&str>) -> u64 {
        self.last_id = self.last_id.saturating_add(1);
        let text_before = self.text.len();
        if let Some(delta) = delta {
            self.text.push_str(delta);
        }
        let frame = Frame {
            id: self.last_id,
            event,
            data,
            text_before,
        };
        self.bytes = self.bytes.saturating_add(frame.bytes());
        self.frames.push_back(frame);
        while self.frames.len() > 1
            && (self.frames.len() > self.max_frames || self.bytes > self.max_bytes)
        {
            if let Some(old) = self.frames.pop_front() {
                self.bytes = self.bytes.saturating_sub(old.bytes());
            }
        }
        self.last_id
    }

    pub(crate) fn end(&mut self) {
        self.ended = true;
    }

    pub(crate) fn ended(&self) -> bool {
        self.ended
    }

    pub(crate) fn last_id(&self) -> u64 {
        self.last_id
    }

    /// The bytes the frames hold now.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// What comes after frame `after` (0: from the start).
    pub(crate) fn next_after(&self, after: u64) -> Next {
        if after >= self.last_id {
            return if self.ended { Next::End } else { Next::Wait };
        }
        let Some(first) = self.frames.front() else {
            return Next::Wait;
        };
        if first.id > after.saturating_add(1) {
            // The text up to the oldest kept frame; the frames from it on
            // (the end of the turn among them) follow as they are.
            return Next::Snapshot {
                id: first.id - 1,
                text: self
                    .text
                    .get(..first.text_before)
                    .unwrap_or_default()
                    .to_owned(),
            };
        }
        let index = usize::try_from(after.saturating_add(1) - first.id).unwrap_or(usize::MAX);
        match self.frames.get(index) {
            Some(frame) => Next::Frame(frame.clone()),
            None => Next::Wait,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_frame(ring: &mut Ring, delta: &str) -> u64 {
        ring.push("text".into(), delta.into(), Some(delta))
    }

    /// Asserts that after `after` the ring hands over the frame `id`.
    #[track_caller]
    fn assert_frame(ring: &Ring, after: u64, id: u64) {
        match ring.next_after(after) {
            Next::Frame(frame) => assert_eq!(frame.id, id),
            other => panic!("expected frame {id}: {other:?}"),
        }
    }

    /// Asserts that after `after` the ring hands over a snapshot up to
    /// `id` of `text`.
    #[track_caller]
    fn assert_snapshot(ring: &Ring, after: u64, id: u64, text: &str) {
        let text = text.into();
        assert_eq!(ring.next_after(after), Next::Snapshot { id, text });
    }

    #[test]
    fn bounded_by_count_and_bytes_and_snapshots_what_it_lost() {
        let mut ring = Ring::new(3, 10);
        for delta in ["ab", "cd", "ef", "gh"] {
            text_frame(&mut ring, delta);
        }
        // Four frames of 6 bytes each: only the newest fits 10 bytes.
        assert_eq!(ring.frames.len(), 1);
        assert!(ring.bytes() <= 10);
        assert_snapshot(&ring, 1, 3, "abcdef");
        assert_frame(&ring, 3, 4);
        assert_eq!(ring.next_after(4), Next::Wait);
        let mut ring = Ring::new(2, 1 << 20);
        for delta in ["a", "b", "c"] {
            text_frame(&mut ring, delta);
        }
        assert_snapshot(&ring, 0, 1, "a");
        assert_frame(&ring, 1, 2);
        assert_frame(&ring, 2, 3);
        ring.end();
        assert_eq!(ring.next_after(3), Next::End);
        assert_eq!(ring.next_after(99), Next::End);
    }

    #[test]
    fn an_oversized_frame_stays_alone() {
        let mut ring = Ring::new(8, 4);
        text_frame(&mut ring, "a");
        text_frame(&mut ring, "0123456789");
        assert_eq!(ring.frames.len(), 1);
        assert_frame(&ring, 1, 2);
    }
}
