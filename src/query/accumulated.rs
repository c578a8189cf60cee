//! What a turn has delivered so far, and how it compares with the final
//! answer.

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
            "the final answer ({} bytes) does not continue the {} bytes already delivered \
             (they first differ at byte {})",
            self.final_len, self.delivered_len, self.first_difference
        )
    }
}

/// The length of the common prefix of two strings, in bytes.
pub(super) fn common_prefix(a: &str, b: &str) -> usize {
    a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count()
}

/// What a turn has delivered so far.
#[derive(Debug, Default)]
pub(super) struct Accumulated {
    pub(super) session_id: Option<String>,
    pub(super) text: String,
    pub(super) steps: Vec<types::QueryStep>,
    pub(super) rollup: Option<types::QueryRollup>,
    pub(super) synthesis: Option<types::QuerySynthesis>,
    pub(super) trace_ref: Option<String>,
    pub(super) usage: Option<types::QueryUsage>,
    pub(super) query: Option<types::Query>,
}

impl Accumulated {
    pub(super) fn apply(&mut self, event: &QueryEvent) {
        match event {
            QueryEvent::TextDelta { delta } => self.text.push_str(delta),
            QueryEvent::Created {
                session_id: Some(session_id),
                ..
            } => self.session_id = Some(session_id.clone()),
            QueryEvent::Step(step) => {
                self.note_tokens(step.cum_input_tokens, step.cum_output_tokens);
                merge_step(&mut self.steps, step);
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
/// and fields the later event leaves out keep their earlier value.
pub(crate) fn merge_step(steps: &mut Vec<types::QueryStep>, step: &types::QueryStep) {
    let Some(known) = steps.iter_mut().find(|s| s.step_id == step.step_id) else {
        steps.push(step.clone());
        return;
    };
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
}
