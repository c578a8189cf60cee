//! Bearer tokens as saved: only their digests, so a login outlives a
//! restart and the database never holds a usable token. Saved tokens
//! belong to one API key, recorded by a salted fingerprint (never the
//! key): a start with another key revokes them on disk before serving,
//! so switching to another key and back does not bring them back.

use sha2::{Digest, Sha256};

use super::{Op, Store};
use crate::local::error::{LocalError, LocalResult};

/// Bytes of salt before the hash in a key fingerprint.
const SALT_LEN: usize = 16;

/// The tokens the database held at start, and the fingerprint of the key
/// they belong to.
#[derive(Debug, Default)]
pub(super) struct SavedTokens {
    pub(super) digests: Vec<Vec<u8>>,
    pub(super) key: Option<Vec<u8>>,
    /// Whether they were bound to the server's key (checked, or revoked).
    pub(super) bound: bool,
    /// The server's key's fingerprint, to record with the first token
    /// saved (a directory that holds no token has nothing to revoke).
    pub(super) unrecorded_key: Option<Vec<u8>>,
}

/// A fingerprint of `key`: `salt` then SHA-256 over a label, the salt and
/// the key (none is the empty key).
fn fingerprint(salt: &[u8; SALT_LEN], key: Option<&str>) -> Vec<u8> {
    let key = key.unwrap_or_default().as_bytes();
    let mut h = Sha256::new();
    h.update(b"nexus-local token key v1\0");
    h.update(salt);
    h.update((key.len() as u64).to_le_bytes());
    h.update(key);
    let mut out = salt.to_vec();
    out.extend_from_slice(&h.finalize());
    out
}

/// Whether `saved` is a fingerprint of `key`.
fn is_fingerprint_of(saved: &[u8], key: Option<&str>) -> bool {
    let Some(salt) = saved
        .get(..SALT_LEN)
        .and_then(|s| <[u8; SALT_LEN]>::try_from(s).ok())
    else {
        return false;
    };
    crate::local::constant_time::constant_time_eq(saved, &fingerprint(&salt, key))
}

impl Store {
    /// Binds the saved tokens to `key`, the server's API key, before the
    /// server serves: when they belong to another key they are revoked on
    /// disk (and `key` recorded) before this returns, so a later start
    /// with that other key finds none of them.
    ///
    /// # Errors
    /// 500 when no random source is available; 503 or 500 when the
    /// revocation could not be saved.
    pub(crate) async fn bind_tokens_to_key(&self, key: Option<&str>) -> LocalResult<()> {
        let saved_key = self.saved_tokens().key.clone();
        let ours = saved_key.as_deref().map(|f| is_fingerprint_of(f, key));
        if ours != Some(true) {
            let mut salt = [0u8; SALT_LEN];
            getrandom::fill(&mut salt)
                .map_err(|e| LocalError::internal("no random source for a key fingerprint", e))?;
            let fingerprint = fingerprint(&salt, key);
            if ours.is_none() && self.saved_tokens().digests.is_empty() {
                // Nothing to revoke: the key is recorded with the first
                // token (a start writes nothing).
                let mut saved = self.saved_tokens();
                saved.unrecorded_key = Some(fingerprint);
                saved.bound = true;
                return Ok(());
            }
            // No key recorded but tokens (a directory of an earlier
            // version): they can only be checked under the key they were
            // made with, so the current key is adopted with them.
            let revoke = ours == Some(false);
            let n = self.db.send([Op::PutTokenKey {
                fingerprint,
                revoke,
            }]);
            self.wait_saved(n).await?;
            if revoke {
                let revoked = std::mem::take(&mut self.saved_tokens().digests).len();
                tracing::info!(
                    revoked,
                    "the API key changed: the tokens of the previous key are revoked"
                );
            }
        }
        self.saved_tokens().bound = true;
        Ok(())
    }

    /// The token digests the database held at start (oldest first), once
    /// [`Store::bind_tokens_to_key`] bound them to the server's key (none
    /// before); empty after the first call.
    pub(crate) fn take_saved_tokens(&self) -> Vec<Vec<u8>> {
        let mut saved = self.saved_tokens();
        if !saved.bound {
            return Vec::new();
        }
        std::mem::take(&mut saved.digests)
    }

    fn saved_tokens(&self) -> std::sync::MutexGuard<'_, SavedTokens> {
        self.saved_tokens.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Saves a token's digest (and forgets the one it replaced) and waits
    /// until that is on disk.
    ///
    /// # Errors
    /// 503 or 500 when it could not be saved.
    pub(crate) async fn save_token(
        &self,
        digest: [u8; 32],
        forgotten: Option<[u8; 32]>,
    ) -> LocalResult<()> {
        let mut ops = Vec::new();
        if let Some(fingerprint) = self.saved_tokens().unrecorded_key.take() {
            ops.push(Op::PutTokenKey {
                fingerprint,
                revoke: false,
            });
        }
        ops.push(Op::PutToken {
            digest: digest.to_vec(),
        });
        if let Some(old) = forgotten {
            ops.push(Op::DeleteToken {
                digest: old.to_vec(),
            });
        }
        let n = self.db.send(ops);
        self.wait_saved(n).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_matches_its_key_only() {
        let f = fingerprint(&[3; SALT_LEN], Some("key-one"));
        assert!(is_fingerprint_of(&f, Some("key-one")));
        assert!(!is_fingerprint_of(&f, Some("key-two")));
        assert!(!is_fingerprint_of(&f, None));
        assert!(!is_fingerprint_of(&f[..10], Some("key-one")));
        assert!(!f.windows(7).any(|w| w == b"key-one"));
    }
}
