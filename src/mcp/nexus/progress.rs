//! `get_query`'s progress notifications: the turn's step commentary.

use std::collections::HashMap;

use rmcp::model::{
    ProgressNotification, ProgressNotificationParam, ProgressToken, ServerNotification,
};

use crate::mcp::notifier::Notifier;

use crate::types;

/// Sends one progress notification per new or changed step commentary.
pub(super) struct StepProgress {
    token: ProgressToken,
    notifier: Notifier,
    /// The commentary last reported per step id.
    seen: HashMap<String, String>,
    sent: u32,
}

impl StepProgress {
    pub(super) fn new(token: ProgressToken, notifier: Notifier) -> Self {
        StepProgress {
            token,
            notifier,
            seen: HashMap::new(),
            sent: 0,
        }
    }

    pub(super) async fn report(&mut self, steps: &[types::QueryStep]) {
        for step in steps {
            let commentary = step.commentary.trim();
            if commentary.is_empty()
                || self.seen.get(&step.step_id).map(String::as_str) == Some(commentary)
            {
                continue;
            }
            self.seen
                .insert(step.step_id.clone(), commentary.to_owned());
            self.sent += 1;
            let note = ProgressNotificationParam::new(self.token.clone(), f64::from(self.sent))
                .with_message(commentary);
            // A client that went away cannot be told; the result still goes back.
            let note = ServerNotification::ProgressNotification(ProgressNotification::new(note));
            if let Err(e) = self.notifier.send(note).await {
                tracing::debug!(error = %e, "could not send a progress notification");
            }
        }
    }
}
