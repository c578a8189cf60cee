//! Aligning a replay on the text already delivered: exactly once by
//! content, not only by event id.
//!
//! A resumed connection's ids say where the replay starts, but a replica
//! may renumber the same events (every id shifted), or send text deltas
//! without ids: the ids then pass every check while the text starts again
//! from the beginning of the answer. So after every resume, whether in this
//! process or from a [`Checkpoint`](crate::query::Checkpoint), the first
//! text of the replay is compared with the beginning of the text delivered
//! ([`HEAD_BYTES`] of it, as bytes in this process or as a hash from a
//! checkpoint). Text that differs goes on at once; text that is the
//! delivered beginning is the answer again from its start: it is dropped
//! up to the delivered length, and that whole stretch must hash to the
//! delivered text, else the replay cannot be trusted and the stored turn
//! stands in for it. The events held while the replay's start is unknown
//! are bounded by [`HEAD_BYTES`] of text and [`MAX_HELD_EVENTS`].

use std::collections::VecDeque;

use crate::query::checkpoint::{HEAD_BYTES, RollingText};
use crate::query::event::QueryEvent;

/// The least delivered text a replay is compared with from the answer's
/// start: shorter text is too little to tell a repeat from what comes
/// next (the final check still refuses a repeat of it).
pub(crate) const MIN_REPEAT_BYTES: usize = 16;

/// Events held while a replay's start is unknown: past this many, the
/// replay is taken as going on (text holds it up only [`HEAD_BYTES`]).
pub(crate) const MAX_HELD_EVENTS: usize = 256;

/// The beginning of the delivered text.
#[derive(Debug, Clone)]
enum Head {
    /// Its bytes (this process delivered them).
    Bytes(Vec<u8>),
    /// The hash of its `len` bytes (from a checkpoint).
    Sealed { len: usize, hash: RollingText },
    /// Not known (a checkpoint without it, past [`HEAD_BYTES`]).
    Unknown,
}

/// The answer text delivered so far, as much as alignment needs: its
/// length, its running hash and its beginning.
#[derive(Debug, Clone)]
pub(crate) struct Delivered {
    len: usize,
    hash: RollingText,
    head: Head,
    /// Where the text stood at the last event with an id, and the first
    /// bytes delivered after it (id-less deltas a faithful replay from
    /// that id sends again).
    at_id: Option<Mark>,
}

/// The delivered text at an event with an id.
#[derive(Debug, Clone)]
struct Mark {
    len: usize,
    hash: RollingText,
    after: Vec<u8>,
}

impl Default for Delivered {
    fn default() -> Self {
        Delivered {
            len: 0,
            hash: RollingText::default(),
            head: Head::Bytes(Vec::new()),
            at_id: None,
        }
    }
}

impl Delivered {
    /// The text delivered before a checkpoint: `len` bytes with running
    /// hash `hash`, whose first `min(len, HEAD_BYTES)` bytes hash to `head`.
    pub(crate) fn after_checkpoint(
        len: usize,
        hash: RollingText,
        head: Option<RollingText>,
    ) -> Self {
        let head = match head {
            _ if len == 0 => Head::Bytes(Vec::new()),
            Some(hash) => Head::Sealed {
                len: len.min(HEAD_BYTES),
                hash,
            },
            None if len <= HEAD_BYTES => Head::Sealed { len, hash },
            None => Head::Unknown,
        };
        Delivered {
            len,
            hash,
            head,
            at_id: None,
        }
    }

    /// Notes an event with an id, delivered after the text so far.
    pub(crate) fn mark_id(&mut self) {
        self.at_id = Some(Mark {
            len: self.len,
            hash: self.hash,
            after: Vec::new(),
        });
    }

    /// Notes `text`, delivered.
    pub(crate) fn push(&mut self, text: &str) {
        let bytes = text.as_bytes();
        self.len = self.len.saturating_add(bytes.len());
        self.hash.push(bytes);
        match &mut self.head {
            Head::Bytes(head) => {
                let take = HEAD_BYTES.saturating_sub(head.len()).min(bytes.len());
                head.extend_from_slice(&bytes[..take]);
            }
            Head::Sealed { len, hash } => {
                let take = HEAD_BYTES.saturating_sub(*len).min(bytes.len());
                hash.push(&bytes[..take]);
                *len += take;
            }
            Head::Unknown => {}
        }
        if let Some(mark) = &mut self.at_id {
            let take = HEAD_BYTES.saturating_sub(mark.after.len()).min(bytes.len());
            mark.after.extend_from_slice(&bytes[..take]);
        }
    }

    /// Where a replay's text may start again, as `(offset, hash of the
    /// text before it)`: the last event with an id (when text followed
    /// it), and the start of the answer.
    fn restarts(&self, held: &[u8], from_start: bool) -> Option<(usize, RollingText)> {
        if let Some(mark) = &self.at_id
            && mark.len < self.len
        {
            let n = held.len().min(mark.after.len());
            if held[..n] == mark.after[..n] && n == mark.after.len() {
                return Some((mark.len, mark.hash));
            }
        }
        (from_start && self.starts_over(held).unwrap_or(false)).then(|| (0, RollingText::default()))
    }

    /// Whether text was delivered after the last event with an id.
    fn text_after_id(&self) -> bool {
        self.at_id.as_ref().is_some_and(|m| m.len < self.len)
    }

    /// Whether `held` may still begin the text again somewhere:
    /// `Some(false)` once no place fits, `None` while it might.
    fn may_restart(&self, held: &[u8], from_start: bool) -> Option<bool> {
        let at_id = self.at_id.as_ref().filter(|m| m.len < self.len).map(|m| {
            let n = held.len().min(m.after.len());
            held[..n] == m.after[..n]
        });
        let start = if from_start {
            self.starts_over(held)
        } else {
            Some(false)
        };
        match (start, at_id) {
            (Some(false), None | Some(false)) => Some(false),
            _ => None,
        }
    }

    /// The hash of the delivered text's first `min(len, HEAD_BYTES)`
    /// bytes, when known (what a checkpoint keeps).
    pub(crate) fn head_hash(&self) -> Option<RollingText> {
        match &self.head {
            Head::Bytes(bytes) => Some(RollingText::of(bytes)),
            Head::Sealed { hash, .. } => Some(*hash),
            Head::Unknown => None,
        }
    }

    /// Whether `held` (the replay's first text) may still be the delivered
    /// beginning: `Some(true)` when it is, `Some(false)` when it is not,
    /// `None` while too short to tell.
    fn starts_over(&self, held: &[u8]) -> Option<bool> {
        match &self.head {
            Head::Bytes(head) => {
                let n = held.len().min(head.len());
                if held[..n] != head[..n] {
                    Some(false)
                } else {
                    (n == head.len()).then_some(true)
                }
            }
            Head::Sealed { len, hash } => held
                .get(..*len)
                .map(|bytes| RollingText::of(bytes) == *hash),
            Head::Unknown => Some(false),
        }
    }
}

/// Where a resumed connection stands with its replay's text.
#[derive(Debug, Default)]
enum Probe {
    /// Not after a resume, or the replay's start is settled.
    #[default]
    Off,
    /// After a resume: holding events until the replay's first text says
    /// where it starts. `resume_seq` is the last id delivered before.
    Holding {
        held: VecDeque<(Option<u64>, QueryEvent)>,
        text: Vec<u8>,
        resume_seq: Option<u64>,
        /// Whether the replay may start the answer again (its ids were
        /// not shown true by the event it resumed at).
        from_start: bool,
    },
    /// The replay repeats the answer from its start: `seen` bytes of it,
    /// with running hash `hash`, were dropped.
    Repeating { seen: usize, hash: RollingText },
}

/// What becomes of an event on its way out of a resumed connection.
#[derive(Debug)]
pub(crate) enum Admitted {
    /// Deliver these, in order.
    Deliver(Vec<(Option<u64>, QueryEvent)>),
    /// Held or dropped; read on.
    Nothing,
    /// The replay repeats the beginning but not the text delivered.
    Broken(String),
}

/// The alignment of one connection: what was delivered and where the
/// replay stands.
#[derive(Debug, Default)]
pub(crate) struct Aligner {
    delivered: Delivered,
    probe: Probe,
}

impl Aligner {
    /// Continues the text before a checkpoint (see [`Delivered::after_checkpoint`]).
    pub(crate) fn after_checkpoint(&mut self, delivered: Delivered) {
        self.delivered = delivered;
    }

    /// Notes an event the turn delivered (its id `id`).
    pub(crate) fn delivered(&mut self, id: Option<u64>, event: &QueryEvent) {
        if let QueryEvent::TextDelta { delta } = event {
            self.delivered.push(delta);
        }
        if id.is_some() {
            self.delivered.mark_id();
        }
    }

    /// The delivered text (what a checkpoint needs of it).
    pub(crate) fn text(&self) -> &Delivered {
        &self.delivered
    }

    /// A new connection resumes after event `resume_seq`: its text is
    /// compared with the delivered text before it goes on.
    pub(crate) fn resumed(&mut self, resume_seq: Option<u64>) {
        let from_start = self.delivered.len >= MIN_REPEAT_BYTES;
        self.probe = if from_start || self.delivered.text_after_id() {
            Probe::Holding {
                held: VecDeque::new(),
                text: Vec::new(),
                resume_seq,
                from_start,
            }
        } else {
            Probe::Off
        };
    }

    /// The replay resent the event it resumed at as it was delivered: its
    /// ids are this turn's, so it does not start the answer again (only
    /// id-less text after that event may come again).
    pub(crate) fn ids_shown_true(&mut self) {
        if let Probe::Holding { from_start, .. } = &mut self.probe {
            *from_start = false;
            if !self.delivered.text_after_id() {
                self.probe = Probe::Off;
            }
        }
    }

    /// The connection broke while its replay's start was unknown: the
    /// held events are dropped (the next replay sends them again), and the
    /// last id delivered before them is where to resume.
    pub(crate) fn broke(&mut self) -> Option<Option<u64>> {
        match std::mem::take(&mut self.probe) {
            Probe::Holding { resume_seq, .. } => Some(resume_seq),
            other => {
                self.probe = other;
                None
            }
        }
    }

    /// Takes the replay's next event (its id `id`).
    pub(crate) fn admit(&mut self, id: Option<u64>, event: QueryEvent) -> Admitted {
        match &mut self.probe {
            Probe::Off => Admitted::Deliver(vec![(id, event)]),
            Probe::Holding {
                held,
                text,
                from_start,
                ..
            } => {
                let from_start = *from_start;
                let ends = event.is_terminal() || matches!(event, QueryEvent::Query(_));
                if let QueryEvent::TextDelta { delta } = &event {
                    text.extend_from_slice(delta.as_bytes());
                }
                held.push_back((id, event));
                let too_many = held.len() > MAX_HELD_EVENTS;
                if let Some((from, hash)) = self.delivered.restarts(text, from_start) {
                    return self.repeat_held(from, hash);
                }
                match self.delivered.may_restart(text, from_start) {
                    Some(false) => self.release(),
                    // The replay ended, or holds too much, before its text
                    // could be the delivered text again: it goes on.
                    _ if ends || too_many => self.release(),
                    _ => Admitted::Nothing,
                }
            }
            Probe::Repeating { .. } => self.repeat(id, event),
        }
    }

    /// Delivers every held event: the replay goes on from where it should.
    fn release(&mut self) -> Admitted {
        match std::mem::take(&mut self.probe) {
            Probe::Holding { held, .. } => Admitted::Deliver(held.into()),
            _ => Admitted::Nothing,
        }
    }

    /// The held events repeat the delivered text from byte `from` (whose
    /// text before has running hash `hash`): they are dropped as far as
    /// the delivered text goes.
    fn repeat_held(&mut self, from: usize, hash: RollingText) -> Admitted {
        let Probe::Holding { held, .. } = std::mem::take(&mut self.probe) else {
            return Admitted::Nothing;
        };
        tracing::debug!(
            delivered = self.delivered.len,
            from,
            "the replay repeats text already delivered; dropping it"
        );
        self.probe = Probe::Repeating { seen: from, hash };
        let mut out = Vec::new();
        for (id, event) in held {
            match self.repeat(id, event) {
                Admitted::Deliver(events) => out.extend(events),
                Admitted::Nothing => {}
                broken @ Admitted::Broken(_) => return broken,
            }
        }
        Admitted::Deliver(out)
    }

    /// One event of a replay that repeats the answer: text up to the
    /// delivered length is dropped (and must be the delivered text), what
    /// is past it delivered; other events are repeats until then.
    fn repeat(&mut self, id: Option<u64>, event: QueryEvent) -> Admitted {
        let Probe::Repeating { seen, hash } = &mut self.probe else {
            return Admitted::Deliver(vec![(id, event)]);
        };
        let owed = self.delivered.len.saturating_sub(*seen);
        let delta = match event {
            QueryEvent::TextDelta { delta } => delta,
            e if e.is_terminal() || matches!(e, QueryEvent::Query(_)) => {
                return Admitted::Broken(format!(
                    "the replay started the answer again and ended after {seen} of the {} bytes \
                     delivered",
                    self.delivered.len
                ));
            }
            // A repeat of an event delivered before.
            _ => return Admitted::Nothing,
        };
        let take = owed.min(delta.len());
        hash.push(&delta.as_bytes()[..take]);
        *seen = seen.saturating_add(take);
        if *seen < self.delivered.len {
            return Admitted::Nothing;
        }
        let len = self.delivered.len;
        if *hash != self.delivered.hash {
            return Admitted::Broken(format!(
                "the replay started the answer again, but its first {len} bytes are not the \
                 {len} bytes delivered"
            ));
        }
        self.probe = Probe::Off;
        match delta.get(take..) {
            Some("") => Admitted::Nothing,
            Some(rest) => Admitted::Deliver(vec![(
                id,
                QueryEvent::TextDelta {
                    delta: rest.to_owned(),
                },
            )]),
            None => Admitted::Broken(format!(
                "the replay's text does not part at byte {len}, where the delivered text ends"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(s: &str) -> QueryEvent {
        QueryEvent::TextDelta { delta: s.into() }
    }

    fn texts(a: Admitted) -> String {
        match a {
            Admitted::Deliver(events) => events
                .into_iter()
                .filter_map(|(_, e)| match e {
                    QueryEvent::TextDelta { delta } => Some(delta),
                    _ => None,
                })
                .collect(),
            Admitted::Nothing => String::new(),
            Admitted::Broken(cause) => panic!("{cause}"),
        }
    }

    fn after(delivered: &str, sealed: bool) -> Aligner {
        let mut a = Aligner::default();
        if sealed {
            let d = Delivered::default();
            let mut full = d.clone();
            full.push(delivered);
            let head = full.head_hash();
            a.after_checkpoint(Delivered::after_checkpoint(
                delivered.len(),
                RollingText::of(delivered.as_bytes()),
                head,
            ));
        } else {
            a.delivered(Some(3), &delta(delivered));
        }
        a.resumed(Some(7));
        a
    }

    #[test]
    fn a_replay_from_the_start_is_dropped_up_to_the_delivered_text() {
        for sealed in [false, true] {
            let mut a = after("p00 p01 p02 p03 ", sealed);
            let mut out = String::new();
            for piece in ["p0", "0 p01 ", "p02 p0", "3 ", "p04 ", "p05 "] {
                out.push_str(&texts(a.admit(None, delta(piece))));
            }
            assert_eq!(out, "p04 p05 ", "sealed: {sealed}");
        }
    }

    #[test]
    fn what_comes_next_goes_on() {
        for sealed in [false, true] {
            let mut a = after("p00 p01 p02 p03 ", sealed);
            let mut out = String::new();
            for piece in ["p04 ", "p05 ", "p06 "] {
                out.push_str(&texts(a.admit(Some(8), delta(piece))));
            }
            // A sealed head needs its length of text to tell; the end
            // releases what is held.
            out.push_str(&texts(a.admit(Some(9), QueryEvent::Completed)));
            assert_eq!(out, "p04 p05 p06 ", "sealed: {sealed}");
        }
        // Too little delivered to tell: what comes goes on.
        let mut a = after(" ", true);
        assert_eq!(texts(a.admit(Some(4), delta(" a"))), " a");
    }

    /// A faithful replay from the last id sends the id-less deltas after
    /// it again: they are dropped, whatever their pieces.
    #[test]
    fn idless_text_after_the_last_id_is_dropped_when_sent_again() {
        let mut a = Aligner::default();
        a.delivered(Some(3), &delta("p00 "));
        a.delivered(None, &delta("p01 "));
        a.delivered(None, &delta("p02 "));
        a.resumed(Some(3));
        let mut out = String::new();
        for piece in ["p01 p", "02 ", "p03 "] {
            out.push_str(&texts(a.admit(None, delta(piece))));
        }
        assert_eq!(out, "p03 ");
    }

    #[test]
    fn a_repeat_that_changes_the_text_is_broken() {
        let long = "x".repeat(100);
        let mut a = after(&long, false);
        let mut changed = "x".repeat(99);
        changed.push('y');
        assert!(matches!(
            a.admit(None, delta(&changed)),
            Admitted::Broken(_)
        ));
    }
}
