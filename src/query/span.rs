//! The `tracing` span of a turn ([`TurnSpan`]).

/// The `tracing` span of one turn, `query_turn`, with the fields `mode`
/// (`send`, `stream`, `background` or `attach`), `query_id`, `session_id`
/// and `resumes` (recorded as they become known). Retries, resumes, replay
/// checks and version mismatches are events inside it.
#[derive(Debug, Clone)]
pub(crate) struct TurnSpan {
    span: tracing::Span,
    query_id_known: std::sync::Arc<std::sync::atomic::AtomicBool>,
    session_id_known: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl TurnSpan {
    pub(crate) fn new(mode: &'static str) -> Self {
        TurnSpan {
            span: tracing::info_span!(
                "query_turn",
                mode,
                query_id = tracing::field::Empty,
                session_id = tracing::field::Empty,
                resumes = tracing::field::Empty,
            ),
            query_id_known: Default::default(),
            session_id_known: Default::default(),
        }
    }

    /// Records the ids the first time they are known.
    pub(crate) fn learn(&self, query_id: Option<&str>, session_id: Option<&str>) {
        use std::sync::atomic::Ordering;
        if let Some(q) = query_id.filter(|q| !q.is_empty())
            && !self.query_id_known.swap(true, Ordering::Relaxed)
        {
            self.span.record("query_id", q);
        }
        if let Some(s) = session_id.filter(|s| !s.is_empty())
            && !self.session_id_known.swap(true, Ordering::Relaxed)
        {
            self.span.record("session_id", s);
        }
    }

    pub(crate) fn record_resumes(&self, resumes: u32) {
        self.span.record("resumes", resumes);
    }

    pub(crate) fn span(&self) -> tracing::Span {
        self.span.clone()
    }

    pub(crate) fn enter(&self) -> tracing::span::Entered<'_> {
        self.span.enter()
    }
}
