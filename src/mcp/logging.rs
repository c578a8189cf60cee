//! MCP logging: `logging/setLevel` and the `notifications/message` a tool
//! call sends about itself.
//!
//! What is sent, after the call's result is known, to the client that made
//! the call:
//! - `warning`: the results are degraded (a reranker that failed, a search
//!   whose surviving leg found nothing);
//! - `notice`: a fallback was taken (one hybrid search leg failed, the other
//!   answered), Nexus calls were retried, or the call took at least the
//!   slow-call threshold;
//! - `info`: reranking was asked for but no model is configured.
//!
//! Which are sent: those at or above the minimum level, which is the
//! request's own `io.modelcontextprotocol/logLevel` (2026-07-28 requests
//! carry it in `_meta`), else the level the session set with
//! `logging/setLevel`, else [`DEFAULT_LEVEL`]. Without sessions (stateless
//! HTTP) a `logging/setLevel` request is accepted and lasts only for that
//! request; such clients set the level per request in `_meta`.
//!
//! Every text is passed through [`redact`]: no key
//! reaches a notification. The notes travel on the call's own stream (the
//! POST response over Streamable HTTP), so a client without a GET stream
//! sees them too.

// rmcp marks the logging types deprecated (SEP-2577 drops logging after the
// 2025-11-25 revision); the revisions served here still define it.
#![allow(deprecated)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use rmcp::model::{
    CallToolResponse, LoggingLevel, LoggingMessageNotification, LoggingMessageNotificationParam,
    RequestId, ServerNotification,
};
use serde_json::{Value, json};

use super::notifier::Notifier;
use super::redact::redact;

/// The minimum level before a client sets one.
pub(super) const DEFAULT_LEVEL: LoggingLevel = LoggingLevel::Info;
/// Default slow-call threshold: a tool call that takes this long or longer
/// is reported at `notice`.
pub(super) const DEFAULT_SLOW_CALL: Duration = Duration::from_secs(10);
/// The logger name of every message.
pub(super) const LOGGER: &str = "nexus-mcp";

/// Where a level ranks: `debug` is 1, `emergency` 8.
fn rank(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 1,
        LoggingLevel::Info => 2,
        LoggingLevel::Notice => 3,
        LoggingLevel::Warning => 4,
        LoggingLevel::Error => 5,
        LoggingLevel::Critical => 6,
        LoggingLevel::Alert => 7,
        LoggingLevel::Emergency => 8,
    }
}

/// The level a session set with `logging/setLevel` (none yet: 0). One per
/// session: the HTTP transport gives each session (each request, without
/// sessions) a fresh one.
#[derive(Debug, Clone, Default)]
pub(crate) struct SessionLevel(Arc<AtomicU8>);

impl SessionLevel {
    /// A level of its own, not shared with any other session.
    pub(crate) fn fresh() -> Self {
        SessionLevel::default()
    }

    /// Records the session's minimum level.
    pub(crate) fn set(&self, level: LoggingLevel) {
        self.0.store(rank(level), Ordering::Relaxed);
    }

    /// The minimum rank for one request: `requested` (its `_meta` level),
    /// else the session's as it is now, else [`DEFAULT_LEVEL`].
    pub(crate) fn minimum(&self, requested: Option<LoggingLevel>) -> u8 {
        if let Some(level) = requested {
            return rank(level);
        }
        match self.0.load(Ordering::Relaxed) {
            0 => rank(DEFAULT_LEVEL),
            set => set,
        }
    }
}

/// One message to send about a call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Note {
    level: LoggingLevel,
    data: Value,
}

/// The messages a finished call deserves: degradation found in its
/// structured result (looked for only when the tool's output can hold an
/// `experimental` member: `degradable`), and slowness.
pub(crate) fn notes_for(
    tool: &str,
    degradable: bool,
    result: &CallToolResponse,
    took: Duration,
    slow: Duration,
) -> Vec<Note> {
    let mut notes = Vec::new();
    if degradable
        && let CallToolResponse::Complete(r) = result
        && let Some(experimental) = super::structured::structured_field(r, "experimental")
    {
        notes.extend(degradation(tool, &experimental));
    }
    if took >= slow {
        let ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
        let threshold = u64::try_from(slow.as_millis()).unwrap_or(u64::MAX);
        notes.push(Note {
            level: LoggingLevel::Notice,
            data: json!({
                "event": "slow_call",
                "tool": tool,
                "duration_ms": ms,
                "threshold_ms": threshold,
                "message": format!("{tool} took {ms} ms (slow-call threshold {threshold} ms)"),
            }),
        });
    }
    notes
}

/// A `notice` when the upstream calls of `family` (the Nexus SDK's) were
/// retried during a call.
pub(crate) fn retried(tool: &str, family: &str, retries: u32) -> Option<Note> {
    (retries > 0).then(|| Note {
        level: LoggingLevel::Notice,
        data: json!({
            "event": "retried",
            "tool": tool,
            "upstream": family,
            "retries": retries,
            "message": format!("{tool}: {family} calls were retried {retries} time(s) before answering"),
        }),
    })
}

/// A note for a result's `experimental` block, if it says anything.
fn degradation(tool: &str, experimental: &Value) -> Option<Note> {
    let text = |key: &str| experimental.get(key).and_then(Value::as_str);
    if experimental.get("degraded") == Some(&Value::Bool(true)) {
        let reason = redact(text("degradation_reason").unwrap_or("unknown"));
        return Some(Note {
            level: LoggingLevel::Warning,
            data: json!({
                "event": "degraded",
                "tool": tool,
                "reason": reason,
                "message": format!("{tool} returned degraded results: {reason}"),
            }),
        });
    }
    if let Some(leg) = text("hybrid_leg_failed") {
        let leg = redact(leg);
        return Some(Note {
            level: LoggingLevel::Notice,
            data: json!({
                "event": "fallback",
                "tool": tool,
                "failed_leg": leg,
                "message": format!("{tool}: the {leg} search leg failed; results come from the other leg"),
            }),
        });
    }
    text("rerank_skipped_reason").map(|reason| {
        let reason = redact(reason);
        Note {
            level: LoggingLevel::Info,
            data: json!({
                "event": "rerank_skipped",
                "tool": tool,
                "reason": reason,
                "message": format!("{tool}: results are not reranked ({reason})"),
            }),
        }
    })
}

/// Marks a note as being about request `.0`: over Streamable HTTP with
/// sessions it travels on that request's response stream (stdio and
/// stateless HTTP have one stream per request anyway). Never on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CallStream(pub(crate) RequestId);

/// Sends `notes` at or above `minimum` (see [`SessionLevel::minimum`]) to
/// the client of request `call`, on its stream.
pub(crate) async fn send(notes: Vec<Note>, minimum: u8, notifier: &Notifier, call: &RequestId) {
    for note in notes.into_iter().filter(|n| rank(n.level) >= minimum) {
        send_one(notifier, note, call).await;
    }
}

async fn send_one(notifier: &Notifier, note: Note, call: &RequestId) {
    let mut param = LoggingMessageNotificationParam::new(note.level, note.data);
    param.logger = Some(LOGGER.to_owned());
    let mut notification = LoggingMessageNotification::new(param);
    notification.extensions.insert(CallStream(call.clone()));
    let notification = ServerNotification::LoggingMessageNotification(notification);
    // A client that went away cannot be told; the result still goes back.
    if let Err(e) = notifier.send(notification).await {
        tracing::debug!(error = %e, "could not send a log notification");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::CallToolResult;

    fn result(structured: Value) -> CallToolResponse {
        CallToolResponse::Complete(CallToolResult::structured(structured))
    }

    #[test]
    fn degradation_levels_and_redaction() {
        let key = "pcsk_abcdefghijklmnopqrstuvwxyz0123456789";
        let degraded = result(json!({"experimental": {
            "degraded": true,
            "degradation_reason": format!("rerank_failed: api_key={key}")
        }}));
        let notes = notes_for("query", true, &degraded, Duration::ZERO, DEFAULT_SLOW_CALL);
        assert_eq!(notes.len(), 1);
        assert_eq!(notes[0].level, LoggingLevel::Warning);
        assert!(!notes[0].data.to_string().contains(key), "{:?}", notes[0]);

        let leg = result(json!({"experimental": {"hybrid_leg_failed": "sparse"}}));
        let notes = notes_for("query", true, &leg, Duration::ZERO, DEFAULT_SLOW_CALL);
        assert_eq!(notes[0].level, LoggingLevel::Notice);

        let plain = result(json!({"results": []}));
        assert!(notes_for("query", true, &plain, Duration::ZERO, DEFAULT_SLOW_CALL).is_empty());
        let slow = notes_for(
            "query",
            true,
            &plain,
            Duration::from_secs(3),
            Duration::from_secs(2),
        );
        assert_eq!(slow[0].level, LoggingLevel::Notice);
        assert_eq!(slow[0].data["duration_ms"], 3000);
        // A tool whose output has no `experimental` is not read for it.
        assert!(
            notes_for(
                "list_namespaces",
                false,
                &degraded,
                Duration::ZERO,
                DEFAULT_SLOW_CALL
            )
            .is_empty()
        );
    }

    #[test]
    fn ranks_follow_syslog_order() {
        assert!(rank(LoggingLevel::Debug) < rank(LoggingLevel::Info));
        assert!(rank(LoggingLevel::Warning) < rank(LoggingLevel::Error));
        assert!(rank(LoggingLevel::Alert) < rank(LoggingLevel::Emergency));
    }
}
