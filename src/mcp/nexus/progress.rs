//! `get_query`'s progress notifications: the turn's step commentary.

use std::collections::HashMap;

use rmcp::RoleServer;
use rmcp::model::{ProgressNotificationParam, ProgressToken};

use crate::types;

/// Sends one progress notification per new or changed step commentary.
pub(super) struct StepProgress {
    token: ProgressToken,
    peer: rmcp::Peer<RoleServer>,
    /// The commentary last reported per step id.
    seen: HashMap<String, String>,
    sent: u32,
}

impl StepProgress {
    pub(super) fn new(token: ProgressToken, peer: rmcp::Peer<RoleServer>) -> Self {
        StepProgress {
            token,
            peer,
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
            if let Err(e) = self.peer.notify_progress(note).await {
                tracing::debug!(error = %e, "could not send a progress notification");
            }
        }
    }
}
