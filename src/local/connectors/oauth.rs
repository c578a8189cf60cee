//! The local connector's OAuth flow, in two steps like the hosted one:
//! `GET /connectors/oauth/local/start` changes nothing and hands out a
//! one-time `state` token inside the authorize URL; the callback with that
//! token makes the connector. A page that only makes a browser fetch the
//! start URL (an `<img>`) cannot read the token, so it cannot complete
//! the flow.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Flows started and not completed that are remembered; the oldest is
/// forgotten first.
const MAX_PENDING: usize = 64;
/// How long a flow may take from start to callback.
const STATE_LIFETIME: Duration = Duration::from_secs(600);
/// Longest `return_to` kept.
const MAX_RETURN_TO: usize = 2048;

/// One started flow.
#[derive(Debug)]
struct Pending {
    state: String,
    return_to: Option<String>,
    started: Instant,
}

/// Flows started and not yet completed.
#[derive(Debug, Default)]
pub(crate) struct OauthStates {
    pending: Mutex<VecDeque<Pending>>,
}

impl OauthStates {
    /// Starts a flow: a fresh random `state` token (128 bits as hex).
    ///
    /// # Errors
    /// The system's random source failed.
    pub(crate) fn start(&self, return_to: Option<String>) -> Result<String, getrandom::Error> {
        let mut secret = [0u8; 16];
        getrandom::fill(&mut secret)?;
        let state: String = secret.iter().map(|b| format!("{b:02x}")).collect();
        let return_to = return_to.filter(|r| r.len() <= MAX_RETURN_TO);
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.retain(|p| p.started.elapsed() < STATE_LIFETIME);
        while pending.len() >= MAX_PENDING {
            pending.pop_front();
        }
        pending.push_back(Pending {
            state: state.clone(),
            return_to,
            started: Instant::now(),
        });
        Ok(state)
    }

    /// Completes a flow once: `Some(return_to)` when `state` was handed
    /// out, has not expired and was not used before.
    pub(crate) fn complete(&self, state: &str) -> Option<Option<String>> {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.retain(|p| p.started.elapsed() < STATE_LIFETIME);
        let i = pending.iter().position(|p| {
            crate::local::constant_time::constant_time_eq(p.state.as_bytes(), state.as_bytes())
        })?;
        pending.remove(i).map(|p| p.return_to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_completes_once_and_unknown_ones_never() {
        let states = OauthStates::default();
        let s = states.start(Some("http://x/".into())).unwrap();
        assert_eq!(s.len(), 32);
        assert_eq!(states.complete("0".repeat(32).as_str()), None);
        assert_eq!(states.complete(&s), Some(Some("http://x/".into())));
        assert_eq!(states.complete(&s), None);
        let first = states.start(None).unwrap();
        for _ in 0..MAX_PENDING {
            states.start(None).unwrap();
        }
        assert_eq!(states.complete(&first), None, "the oldest is forgotten");
    }
}
