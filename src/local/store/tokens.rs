//! Bearer tokens as saved: only their digests, so a login outlives a
//! restart and the database never holds a usable token.

use super::{Op, Store};
use crate::local::error::LocalResult;

impl Store {
    /// The token digests the database held at start (oldest first); empty
    /// after the first call.
    pub(crate) fn take_saved_tokens(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut *self.saved_tokens.lock().unwrap_or_else(|p| p.into_inner()))
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
        let mut ops = vec![Op::PutToken {
            digest: digest.to_vec(),
        }];
        if let Some(old) = forgotten {
            ops.push(Op::DeleteToken {
                digest: old.to_vec(),
            });
        }
        let n = self.db.send(ops);
        self.wait_saved(n).await
    }
}
