//! Credentials: an API key sent as is, or exchanged for a bearer token.

use std::fmt;
use std::sync::RwLock;

use secrecy::SecretString;

/// The API key header.
pub const API_KEY_HEADER: &str = "X-Pinecone-Api-Key";

/// How requests are authenticated. `Debug` never shows a key or token.
pub(crate) enum Auth {
    /// No credentials (for example a local server started without `--api-key`).
    None,
    /// Send the key as `X-Pinecone-Api-Key` on every request.
    ApiKey(SecretString),
    /// Exchange the key at `POST /auth/login` and send `Authorization: Bearer`.
    Login(LoginState),
}

pub(crate) struct LoginState {
    pub(crate) key: SecretString,
    /// The current token and its generation, so concurrent 401s log in once.
    token: RwLock<Option<(u64, SecretString)>>,
    /// Serializes logins.
    pub(crate) login_lock: tokio::sync::Mutex<()>,
}

impl LoginState {
    pub(crate) fn new(key: SecretString) -> Self {
        LoginState {
            key,
            token: RwLock::new(None),
            login_lock: tokio::sync::Mutex::new(()),
        }
    }

    /// The current token and its generation, if logged in.
    pub(crate) fn token(&self) -> Option<(u64, SecretString)> {
        self.token
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|(g, t)| (*g, t.clone()))
    }

    /// Keeps a new token; returns it with its generation.
    pub(crate) fn store(&self, token: String) -> (u64, SecretString) {
        let mut slot = self.token.write().unwrap_or_else(|p| p.into_inner());
        let generation = slot.as_ref().map_or(1, |(g, _)| g + 1);
        let token = SecretString::from(token);
        *slot = Some((generation, token.clone()));
        (generation, token)
    }

    /// Forgets the token of `generation` (a newer one is kept).
    pub(crate) fn invalidate(&self, generation: u64) {
        let mut slot = self.token.write().unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_some_and(|(g, _)| *g == generation) {
            *slot = None;
        }
    }
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Auth::None => f.write_str("None"),
            Auth::ApiKey(_) => f.write_str("ApiKey([redacted])"),
            Auth::Login(s) => {
                let logged_in = s.token().is_some();
                f.debug_struct("Login")
                    .field("key", &"[redacted]")
                    .field("logged_in", &logged_in)
                    .finish()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_redacts() {
        let a = Auth::ApiKey(SecretString::from("pcsk_secret_1"));
        assert!(!format!("{a:?}").contains("pcsk_secret_1"));
        let s = LoginState::new(SecretString::from("pcsk_secret_2"));
        s.store("tok_secret_3".into());
        let a = Auth::Login(s);
        let dbg = format!("{a:?}");
        assert!(
            !dbg.contains("pcsk_secret_2") && !dbg.contains("tok_secret_3"),
            "{dbg}"
        );
    }

    #[test]
    fn generations_guard_invalidation() {
        let s = LoginState::new(SecretString::from("k"));
        let (g1, _) = s.store("a".into());
        let (g2, _) = s.store("b".into());
        s.invalidate(g1);
        assert_eq!(s.token().map(|(g, _)| g), Some(g2));
        s.invalidate(g2);
        assert!(s.token().is_none());
    }
}
