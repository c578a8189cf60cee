//! The files tasks produce (reports, lists of imported files), kept as
//! rows of the state database and read from it.

use chrono::{DateTime, Utc};

use super::{Change, FLUSH_WAIT, Store, saved_or_error};
use crate::local::db::Op;
use crate::local::error::{LocalError, LocalResult};

/// Most bytes of one task file; longer content is cut.
pub(crate) const MAX_TASK_FILE: usize = 1024 * 1024;

/// A text file of `lines` (each ended by a newline) that fits a task file:
/// past the limit, a last line says how many were left out.
pub(crate) fn lines_file<'a>(lines: impl ExactSizeIterator<Item = &'a str>) -> Vec<u8> {
    let total = lines.len();
    let mut out = String::new();
    for (i, line) in lines.enumerate() {
        // Room for the closing note.
        if out.len() + line.len() + 1 > MAX_TASK_FILE - 64 {
            out.push_str(&format!("# {} more not listed\n", total - i));
            break;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.into_bytes()
}

impl Change<'_> {
    /// Stores the files a task produced with this change.
    pub(crate) fn put_task_files(&mut self, task_id: &str, files: Vec<(String, Vec<u8>)>) {
        let mtime = Utc::now().to_rfc3339();
        for (path, mut data) in files {
            data.truncate(MAX_TASK_FILE);
            self.push(Op::PutTaskFile {
                task_id: task_id.to_owned(),
                path,
                mtime: mtime.clone(),
                data,
            });
        }
    }
}

impl Store {
    /// Stores the files a task produced (after what changed before), and
    /// waits until they are committed, with or without a data directory,
    /// so they are readable once the task reports its end.
    ///
    /// # Errors
    /// 503 when they could not be written in time.
    pub(crate) async fn put_task_files(
        &self,
        task_id: &str,
        files: Vec<(String, Vec<u8>)>,
    ) -> LocalResult<()> {
        let n = {
            let mut change = self.change();
            change.put_task_files(task_id, files);
            change.commit()
        };
        self.settle(n.0).await
    }

    /// Removes one file a task produced and waits until that is committed.
    ///
    /// # Errors
    /// 503 when it could not be written in time.
    pub(crate) async fn delete_task_file(&self, task_id: &str, path: &str) -> LocalResult<()> {
        let n = {
            let mut change = self.change();
            change.push(Op::DeleteTaskFile {
                task_id: task_id.to_owned(),
                path: path.to_owned(),
            });
            change.commit()
        };
        self.settle(n.0).await
    }

    /// The files a task produced: `(path, size, mtime)`.
    ///
    /// # Errors
    /// 503 when the database cannot be read.
    pub(crate) fn task_files(
        &self,
        task_id: &str,
    ) -> LocalResult<Vec<(String, u64, DateTime<Utc>)>> {
        let rows = self.db.task_files(task_id).ok_or_else(|| {
            LocalError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "the server could not read its state; see its log",
            )
        })?;
        Ok(rows
            .into_iter()
            .map(|(path, size, mtime)| {
                let mtime = DateTime::parse_from_rfc3339(&mtime)
                    .map(|t| t.with_timezone(&Utc))
                    .unwrap_or_default();
                (path, size, mtime)
            })
            .collect())
    }

    /// One file a task produced.
    pub(crate) fn task_file(&self, task_id: &str, path: &str) -> Option<Vec<u8>> {
        self.db.task_file(task_id, path)
    }

    /// Waits until write `n` is committed, with or without a data
    /// directory (readers use their own connection).
    async fn settle(&self, n: u64) -> LocalResult<()> {
        saved_or_error(self.db.wait_saved(n, FLUSH_WAIT).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_past_the_limit_ends_with_what_was_left_out() {
        assert_eq!(lines_file(["a", "b"].into_iter()), b"a\nb\n");
        let line = "x".repeat(1000);
        let lines: Vec<&str> = std::iter::repeat_n(line.as_str(), 2000).collect();
        let out = String::from_utf8(lines_file(lines.into_iter())).unwrap();
        assert!(out.len() <= MAX_TASK_FILE);
        let kept = out.lines().filter(|l| l.starts_with('x')).count();
        assert!(out.ends_with(&format!("# {} more not listed\n", 2000 - kept)));
        assert!(kept > 1000);
    }
}
