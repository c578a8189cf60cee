//! What a turn has delivered so far, and how it compares with the final
//! answer.

use super::checkpoint::RollingText;
use super::event::QueryEvent;
use crate::error::Error;
use crate::types;

/// Where the delivered text and the final answer part.
#[derive(Debug, Clone)]
pub(super) struct Mismatch {
    pub(super) query_id: String,
    pub(super) delivered_len: usize,
    pub(super) final_len: usize,
    pub(super) first_difference: usize,
}

impl Mismatch {
    pub(super) fn to_error(&self) -> Error {
        let n = |v: usize| u64::try_from(v).unwrap_or(u64::MAX);
        Error::AnswerMismatch {
            query_id: self.query_id.clone(),
            delivered_len: n(self.delivered_len),
            final_len: n(self.final_len),
            first_difference: n(self.first_difference),
        }
    }

    pub(super) fn detail(&self) -> String {
        format!(
            "the {n} bytes delivered do not match the first {n} bytes of the final answer \
             (of {} bytes; they first differ at byte {})",
            self.final_len,
            self.first_difference,
            n = self.delivered_len
        )
    }
}

/// The length of the common prefix of two strings, in bytes.
pub(super) fn common_prefix(a: &str, b: &str) -> usize {
    a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count()
}

/// The answer text a turn delivered: the text itself, or (when the caller
/// does not keep it) its length and a keyed hash, which is enough to check
/// it against the final answer.
pub(super) struct DeliveredText {
    keep: bool,
    text: String,
    len: usize,
    keys: std::hash::RandomState,
    hash: std::hash::DefaultHasher,
    /// The running hash of all the text delivered, the text before a
    /// checkpoint this turn continues included (what its checkpoints prove).
    rolling: RollingText,
    /// The running hash of the text before that checkpoint.
    before: Option<RollingText>,
}

impl std::fmt::Debug for DeliveredText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeliveredText")
            .field("keep", &self.keep)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl Default for DeliveredText {
    fn default() -> Self {
        DeliveredText::new(true)
    }
}

impl DeliveredText {
    pub(super) fn new(keep: bool) -> Self {
        use std::hash::BuildHasher;
        let keys = std::hash::RandomState::new();
        let hash = keys.build_hasher();
        DeliveredText {
            keep,
            text: String::new(),
            len: 0,
            keys,
            hash,
            rolling: RollingText::default(),
            before: None,
        }
    }

    /// Continues the text before a checkpoint: its running hash goes on
    /// from `before`, and the final answer must begin with text that has it.
    pub(super) fn continue_after(&mut self, before: RollingText) {
        self.rolling = before;
        self.before = Some(before);
    }

    /// The running hash of all the text delivered (see [`continue_after`](Self::continue_after)).
    pub(super) fn rolling(&self) -> RollingText {
        self.rolling
    }

    /// Whether `head` (the final answer's bytes before the checkpoint this
    /// turn continues) is the text that checkpoint proves; true for a turn
    /// that continues none.
    pub(super) fn proves_before(&self, head: &[u8]) -> bool {
        self.before.is_none_or(|b| RollingText::of(head) == b)
    }

    fn push(&mut self, delta: &str) {
        use std::hash::Hasher;
        self.len = self.len.saturating_add(delta.len());
        self.rolling.push(delta.as_bytes());
        if self.keep {
            self.text.push_str(delta);
        } else {
            // SipHash is streaming: the hash of the pieces is the hash of
            // the whole, however the deltas were split.
            self.hash.write(delta.as_bytes());
        }
    }

    /// The bytes delivered.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The text, when kept (else empty).
    pub(super) fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `candidate` is the delivered text.
    pub(super) fn is(&self, candidate: &str) -> bool {
        use std::hash::{BuildHasher, Hasher};
        if candidate.len() != self.len {
            return false;
        }
        if self.keep {
            return candidate == self.text;
        }
        let mut h = self.keys.build_hasher();
        h.write(candidate.as_bytes());
        h.finish() == self.hash.finish()
    }

    /// How many leading bytes of `other` agree with the delivered text
    /// (the whole comparison needs the kept text; without it, 0).
    pub(super) fn common_prefix(&self, other: &str) -> usize {
        if self.keep {
            common_prefix(&self.text, other)
        } else {
            0
        }
    }
}

/// What a turn has delivered so far.
#[derive(Debug, Default)]
pub(super) struct Accumulated {
    pub(super) session_id: Option<String>,
    pub(super) text: DeliveredText,
    pub(super) steps: Vec<types::QueryStep>,
    /// Where each `step_id` is in `steps`.
    step_index: std::collections::HashMap<String, usize>,
    /// The bytes `steps` holds (see [`step_bytes`]).
    pub(super) step_bytes: usize,
    pub(super) rollup: Option<types::QueryRollup>,
    pub(super) synthesis: Option<types::QuerySynthesis>,
    pub(super) trace_ref: Option<String>,
    pub(super) usage: Option<types::QueryUsage>,
    pub(super) query: Option<types::Query>,
}

/// Which bound an event would pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Over {
    Text,
    Steps,
}

/// The bytes a step holds: its text fields (what a server controls).
pub(super) fn step_bytes(step: &types::QueryStep) -> usize {
    let fns: usize = step.fns.iter().map(|f| f.len().saturating_add(8)).sum();
    let code = step.code.as_ref().map_or(0, |c| c.to_string().len());
    step.step_id
        .len()
        .saturating_add(step.status.len())
        .saturating_add(step.commentary.len())
        .saturating_add(fns)
        .saturating_add(code)
        .saturating_add(64)
}

impl Accumulated {
    /// What a turn accumulates: its text kept or only checked.
    pub(super) fn new(keep_text: bool) -> Self {
        Accumulated {
            text: DeliveredText::new(keep_text),
            ..Accumulated::default()
        }
    }

    /// Which bound `event` would pass, if applied.
    pub(super) fn would_pass(
        &self,
        event: &QueryEvent,
        max_text: usize,
        max_steps: usize,
    ) -> Option<Over> {
        match event {
            QueryEvent::TextDelta { delta }
                if self.text.len().saturating_add(delta.len()) > max_text =>
            {
                Some(Over::Text)
            }
            QueryEvent::Step(step) => {
                let after = match self.step_index.get(&step.step_id) {
                    Some(&i) => {
                        let mut merged = self.steps[i].clone();
                        merge_into(&mut merged, step);
                        self.step_bytes - step_bytes(&self.steps[i]) + step_bytes(&merged)
                    }
                    None => self.step_bytes.saturating_add(step_bytes(step)),
                };
                (after > max_steps).then_some(Over::Steps)
            }
            _ => None,
        }
    }

    pub(super) fn apply(&mut self, event: &QueryEvent) {
        match event {
            QueryEvent::TextDelta { delta } => self.text.push(delta),
            QueryEvent::Created {
                session_id: Some(session_id),
                ..
            } => self.session_id = Some(session_id.clone()),
            QueryEvent::Step(step) => {
                self.note_tokens(step.cum_input_tokens, step.cum_output_tokens);
                self.merge_step(step);
            }
            QueryEvent::TurnRollup(r) => self.rollup = Some(r.clone()),
            QueryEvent::Synthesis(s) => self.synthesis = Some(s.clone()),
            QueryEvent::Trace { trace_ref } => self.trace_ref = Some(trace_ref.clone()),
            QueryEvent::Query(q) => {
                self.session_id = Some(q.session_id.clone());
                self.usage = Some(q.usage.clone());
                if q.trace_ref.is_some() {
                    self.trace_ref.clone_from(&q.trace_ref);
                }
                self.query = Some((**q).clone());
            }
            _ => {}
        }
    }

    /// Merges a step by `step_id` in O(1) (see [`merge_step`]).
    fn merge_step(&mut self, step: &types::QueryStep) {
        match self.step_index.get(&step.step_id) {
            Some(&i) => {
                let before = step_bytes(&self.steps[i]);
                merge_into(&mut self.steps[i], step);
                self.step_bytes = self.step_bytes - before + step_bytes(&self.steps[i]);
            }
            None => {
                self.step_index
                    .insert(step.step_id.clone(), self.steps.len());
                self.step_bytes = self.step_bytes.saturating_add(step_bytes(step));
                self.steps.push(step.clone());
            }
        }
    }

    fn note_tokens(&mut self, input: Option<i64>, output: Option<i64>) {
        if input.is_none() && output.is_none() {
            return;
        }
        let u = self.usage.get_or_insert(types::QueryUsage {
            input_tokens: 0,
            output_tokens: 0,
            total_tokens: 0,
        });
        if let Some(i) = input {
            u.input_tokens = i;
        }
        if let Some(o) = output {
            u.output_tokens = o;
        }
        // Server numbers: each may fit while their sum does not.
        u.total_tokens = u.input_tokens.saturating_add(u.output_tokens);
    }
}

/// Merges a step event into the list by `step_id`: the later status wins,
/// and fields the later event leaves out keep their earlier value. (The
/// linear reference for [`Accumulated`]'s indexed merge.)
#[cfg(test)]
fn merge_step(steps: &mut Vec<types::QueryStep>, step: &types::QueryStep) {
    match steps.iter_mut().find(|s| s.step_id == step.step_id) {
        Some(known) => merge_into(known, step),
        None => steps.push(step.clone()),
    }
}

/// Merges `step` into the `known` step of the same id.
fn merge_into(known: &mut types::QueryStep, step: &types::QueryStep) {
    if !step.status.is_empty() {
        known.status.clone_from(&step.status);
    }
    if !step.commentary.is_empty() {
        known.commentary.clone_from(&step.commentary);
    }
    if !step.fns.is_empty() {
        known.fns.clone_from(&step.fns);
    }
    if step.code.is_some() {
        known.code.clone_from(&step.code);
    }
    if step.cum_input_tokens.is_some() {
        known.cum_input_tokens = step.cum_input_tokens;
    }
    if step.cum_output_tokens.is_some() {
        known.cum_output_tokens = step.cum_output_tokens;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(id: &str, status: &str, commentary: &str) -> types::QueryStep {
        types::QueryStep {
            step_id: id.into(),
            status: status.into(),
            commentary: commentary.into(),
            fns: Vec::new(),
            code: None,
            cum_input_tokens: None,
            cum_output_tokens: None,
        }
    }

    #[test]
    fn steps_merge_by_id_and_later_status_wins() {
        let mut steps = Vec::new();
        merge_step(&mut steps, &step("a", "running", "searching"));
        merge_step(&mut steps, &step("b", "running", "reading"));
        merge_step(&mut steps, &step("a", "done", ""));
        assert_eq!(steps.len(), 2);
        assert_eq!(steps[0].status, "done");
        assert_eq!(steps[0].commentary, "searching");
        assert_eq!(steps[1].status, "running");
    }

    #[test]
    fn usage_follows_cumulative_step_counts() {
        let mut acc = Accumulated::default();
        let mut s = step("a", "done", "");
        s.cum_input_tokens = Some(10);
        s.cum_output_tokens = Some(3);
        acc.apply(&QueryEvent::Step(s));
        let u = acc.usage.unwrap();
        assert_eq!(
            (u.input_tokens, u.output_tokens, u.total_tokens),
            (10, 3, 13)
        );
    }

    #[test]
    fn the_map_merges_like_the_list_and_counts_bytes() {
        let mut acc = Accumulated::default();
        let mut list = Vec::new();
        for (id, status, text) in [
            ("a", "running", "x"),
            ("b", "running", "yy"),
            ("a", "done", ""),
        ] {
            let s = step(id, status, text);
            merge_step(&mut list, &s);
            acc.apply(&QueryEvent::Step(s));
        }
        assert_eq!(acc.steps, list);
        let held: usize = acc.steps.iter().map(step_bytes).sum();
        assert_eq!(acc.step_bytes, held);
        let big = QueryEvent::Step(step("c", "running", &"z".repeat(100)));
        assert_eq!(
            acc.would_pass(&big, usize::MAX, held + 10),
            Some(Over::Steps)
        );
        assert_eq!(acc.would_pass(&big, usize::MAX, held + 1000), None);
    }

    #[test]
    fn text_not_kept_is_still_checked() {
        for keep in [true, false] {
            let mut t = DeliveredText::new(keep);
            t.push("Hello, ");
            t.push("world");
            assert_eq!(t.len(), 12);
            assert!(t.is("Hello, world"));
            assert!(!t.is("Hello, World"));
            assert!(!t.is("Hello, worl"));
            assert_eq!(t.as_str().is_empty(), !keep);
        }
    }
}
