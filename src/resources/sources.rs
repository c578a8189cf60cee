use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::TryStreamExt;

use super::pages::Tree;
use super::tasks::TaskWait;
use crate::client::{Call, Poller, ResponseMeta, WaitPolicy};
use crate::error::{Error, Result};
use crate::{Client, types};

/// Source files of one context. Get one from [`Client::sources`].
#[derive(Debug, Clone, Copy)]
pub struct Sources<'c> {
    pub(crate) client: &'c Client,
    pub(crate) slug: &'c str,
}

/// Progress of a directory import, passed to the callback of
/// [`Sources::import_dir`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ImportProgress {
    /// Files uploaded so far.
    pub files_done: usize,
    /// Files to upload.
    pub files_total: usize,
    /// Bytes uploaded so far.
    pub bytes_done: u64,
    /// Bytes to upload.
    pub bytes_total: u64,
    /// The file (relative path) or archive just uploaded.
    pub current: String,
}

/// Progress of one upload, the same shape as a directory import's.
pub type UploadProgress = ImportProgress;

/// The most a directory may weigh to be sent as one in-memory archive.
#[cfg(feature = "import-dir")]
const ARCHIVE_LIMIT: u64 = 256 * 1024 * 1024;

/// The media type of an uploaded file's part: the default the spec's
/// `format: binary` field has in `multipart/form-data` (RFC 7578 asks for
/// one on every file part).
const FILE_MEDIA_TYPE: &str = "application/octet-stream";

/// How long a 409 (import in flight) is waited out before giving up.
const BUSY_WAIT: Duration = Duration::from_secs(600);

impl<'c> Sources<'c> {
    /// `POST /contexts/{slug}/import/upload`: uploads one file or archive
    /// (`.zip`, `.tar`, `.tar.gz`, `.tgz` are expanded by the server) under
    /// `dir` in the source tree (default `uploads`). The import runs as a task;
    /// the answer names it.
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be read; 409 while
    /// another import runs; 413 for a file over the server's limit.
    pub fn upload_file<'a>(
        &self,
        path: impl AsRef<Path> + Send + 'a,
        dir: Option<&'a str>,
    ) -> Call<'a, types::WorkflowTriggerResponse>
    where
        'c: 'a,
    {
        let this = *self;
        Call::new(async move { this.upload_path(path.as_ref(), dir).await })
    }

    async fn upload_path(
        &self,
        path: &Path,
        dir: Option<&str>,
    ) -> Result<(types::WorkflowTriggerResponse, ResponseMeta)> {
        let name = file_name(path)?;
        // Each attempt opens the file again and streams it from the start.
        let part = || -> Result<reqwest::multipart::Part> {
            let file = std::fs::File::open(path).map_err(io("upload_file", "open", path))?;
            let len = file
                .metadata()
                .map_err(io("upload_file", "read", path))?
                .len();
            let stream = tokio_util_like::file_stream(tokio::fs::File::from_std(file));
            Ok(reqwest::multipart::Part::stream_with_length(
                reqwest::Body::wrap_stream(stream),
                len,
            )
            .file_name(name.clone()))
        };
        self.send_upload(&part, dir).await
    }

    /// Uploads in-memory bytes as a file named `name`.
    ///
    /// # Errors
    /// As [`Sources::upload_file`].
    pub fn upload_bytes<'a>(
        &self,
        name: &'a str,
        bytes: impl Into<bytes::Bytes>,
        dir: Option<&'a str>,
    ) -> Call<'a, types::WorkflowTriggerResponse>
    where
        'c: 'a,
    {
        let this = *self;
        let bytes: bytes::Bytes = bytes.into();
        Call::new(async move { this.upload_in_memory(name, bytes, dir).await })
    }

    async fn upload_in_memory(
        &self,
        name: &str,
        bytes: bytes::Bytes,
        dir: Option<&str>,
    ) -> Result<(types::WorkflowTriggerResponse, ResponseMeta)> {
        if name.is_empty() || name.contains('/') || name.contains('\\') {
            return Err(Error::InvalidRequest(format!("invalid file name {name:?}")));
        }
        let part = || -> Result<reqwest::multipart::Part> {
            Ok(
                reqwest::multipart::Part::stream(reqwest::Body::from(bytes.clone()))
                    .file_name(name.to_owned()),
            )
        };
        self.send_upload(&part, dir).await
    }

    /// Sends the multipart upload. A multipart body cannot be cloned, so the
    /// request is built again from `part` for every attempt: a refused token
    /// (401 with [`login`](crate::ClientBuilder::login)) logs in again and a
    /// connection that could not be opened is retried, as for any other call;
    /// an upload shed as busy (503 with a `Retry-After` within the retry
    /// policy's longest delay: refused before anything changed) is sent again
    /// after that wait, up to the policy's number of retries.
    async fn send_upload(
        &self,
        part: &(dyn Fn() -> Result<reqwest::multipart::Part> + Send + Sync),
        dir: Option<&str>,
    ) -> Result<(types::WorkflowTriggerResponse, ResponseMeta)> {
        let op = "upload_context_source";
        let path = format!("/contexts/{}/import/upload", encode_segment(self.slug));
        let build = || -> Result<reqwest::Request> {
            let file = part()?
                .mime_str(FILE_MEDIA_TYPE)
                .map_err(|e| Error::InvalidRequest(format!("{op}: {e}")))?;
            let form = reqwest::multipart::Form::new().part("file", file);
            let mut req = self
                .client
                .request(reqwest::Method::POST, &path)
                .multipart(form);
            if let Some(dir) = dir {
                req = req.query(&[("path", dir)]);
            }
            req.build()
                .map_err(|e| Error::InvalidRequest(format!("{op}: {e}")))
        };
        let rebuild = || match build() {
            Ok(req) => Some(req),
            Err(e) => {
                tracing::debug!(error = %e, "upload cannot be sent again");
                None
            }
        };
        let transport = self.client.transport();
        let policy = transport.retry_policy();
        let mut refused = 0;
        let resp = loop {
            match transport
                .send_rebuilding(build()?, Some(&rebuild), op)
                .await
            {
                // Shed with `Retry-After` (a busy server: refused before
                // anything changed): sent again after the wait it asks for,
                // within the client's retry policy.
                Err(Error::Api(e))
                    if e.status == 503
                        && refused < policy.max_retries
                        && e.retry_after.is_some_and(|d| d <= policy.max_delay) =>
                {
                    refused += 1;
                    tracing::debug!(
                        status = e.status,
                        refused,
                        "upload refused as busy; retrying"
                    );
                    tokio::time::sleep(e.retry_after.unwrap_or_default()).await;
                }
                other => break other?,
            }
        };
        let meta = ResponseMeta::from_headers(resp.status().as_u16(), resp.headers());
        let body = resp
            .bytes()
            .await
            .map_err(|e| self.client.transport().map_reqwest(op, e))?;
        let answer = serde_json::from_slice(&body).map_err(|e| Error::decode(op, e, &body))?;
        Ok((answer, meta))
    }

    /// `GET /contexts/{slug}/source/list[/{path}]`: every entry of a
    /// directory (the root unless [`ListFiles::path`](super::ListFiles::path)
    /// names one). `.await` it for every entry (bounded by
    /// [`ListFiles::max_items`](super::ListFiles::max_items)), read
    /// [`ListFiles::pages`](super::ListFiles::pages) page by page (the first
    /// page alone: `.page_size(n).pages()`, then one `try_next`), or
    /// [`ListFiles::items`](super::ListFiles::items) entry by entry.
    pub fn list(&self) -> super::ListFiles<'c> {
        super::ListFiles::new(self.client, Tree::Sources, self.slug)
    }

    /// `GET /contexts/{slug}/source/read/{path}`: a source file's bytes.
    ///
    /// # Errors
    /// Any [`Error`] of the call.
    pub fn read<'a>(&self, path: &'a str) -> Call<'a, bytes::Bytes>
    where
        'c: 'a,
    {
        read_file(self.client, Tree::Sources, self.slug, path)
    }

    /// Imports every file below `dir`: as one `.tar.gz` upload, which the
    /// server expands, or, when the server refuses archives (400), the
    /// directory is too large for one archive or the `import-dir` feature is
    /// off, file by file, waiting for each import to finish (an upload during
    /// an import in flight gets 409). Hidden files and directories are skipped.
    /// `on_progress` is called after each upload. Returns the finished import
    /// tasks.
    ///
    /// # Errors
    /// [`Error::Io`] when the directory or a file in it cannot be read;
    /// [`Error::InvalidRequest`] when it holds no file; [`Error::TaskFailed`] when an import fails; any error of the calls.
    pub async fn import_dir(
        &self,
        dir: impl AsRef<Path>,
        mut on_progress: impl FnMut(&ImportProgress) + Send,
    ) -> Result<Vec<types::TaskResponse>> {
        let dir = dir.as_ref();
        // The walk and the archive are blocking file work: off the runtime.
        let files = {
            let dir = dir.to_path_buf();
            off_runtime(move || collect_files(&dir)).await?
        };
        if files.is_empty() {
            return Err(Error::InvalidRequest(format!(
                "no files to import in {}",
                dir.display()
            )));
        }
        let files_total = files.len();
        let bytes_total: u64 = files.iter().map(|(_, _, len)| *len).sum();

        #[cfg(feature = "import-dir")]
        if bytes_total <= ARCHIVE_LIMIT {
            let archive = {
                let (dir, files) = (dir.to_path_buf(), files.clone());
                off_runtime(move || build_tar_gz(&dir, &files)).await?
            };
            let name = format!("{}.tar.gz", dir_label(dir));
            match self.upload_waiting(&name, archive, None).await {
                Ok(trigger) => {
                    on_progress(&ImportProgress {
                        files_done: files_total,
                        files_total,
                        bytes_done: bytes_total,
                        bytes_total,
                        current: name,
                    });
                    let task = self.wait_import(&trigger.task_id).await?;
                    return Ok(vec![task]);
                }
                // The server refuses archives: fall back to single files.
                Err(e) if e.status() == Some(http::StatusCode::BAD_REQUEST) => {
                    tracing::debug!("archive refused ({e}); importing file by file");
                }
                Err(e) => return Err(e),
            }
        }

        let mut tasks = Vec::with_capacity(files_total);
        let mut bytes_done = 0;
        for (i, (abs, rel, len)) in files.iter().enumerate() {
            let data = tokio::fs::read(abs)
                .await
                .map_err(io("import_dir", "read", abs))?;
            let (parent, name) = match rel.rsplit_once('/') {
                Some((p, n)) => (Some(format!("uploads/{p}")), n.to_owned()),
                None => (None, rel.clone()),
            };
            let trigger = self
                .upload_waiting_in(&name, data.into(), parent.as_deref())
                .await?;
            tasks.push(self.wait_import(&trigger.task_id).await?);
            bytes_done += len;
            on_progress(&ImportProgress {
                files_done: i + 1,
                files_total,
                bytes_done,
                bytes_total,
                current: rel.clone(),
            });
        }
        Ok(tasks)
    }

    #[cfg(feature = "import-dir")]
    async fn upload_waiting(
        &self,
        name: &str,
        data: Vec<u8>,
        dir: Option<&str>,
    ) -> Result<types::WorkflowTriggerResponse> {
        self.upload_waiting_in(name, data.into(), dir).await
    }

    /// Uploads, waiting out 409 answers (another import in flight).
    async fn upload_waiting_in(
        &self,
        name: &str,
        data: bytes::Bytes,
        dir: Option<&str>,
    ) -> Result<types::WorkflowTriggerResponse> {
        let mut poller = Poller::new(
            &WaitPolicy::default()
                .timeout(BUSY_WAIT)
                .interval(Duration::from_millis(100), Duration::from_secs(5)),
        );
        loop {
            match self.upload_bytes(name, data.clone(), dir).await {
                Err(e) if e.is_conflict() && poller.pause().await => {}
                other => return other,
            }
        }
    }

    async fn wait_import(&self, task_id: &str) -> Result<types::TaskResponse> {
        self.client
            .tasks()
            .wait_completed(
                task_id,
                TaskWait::default().interval(Duration::from_millis(50), Duration::from_secs(2)),
            )
            .await
    }
}

/// `GET /contexts/{slug}/{source,knowledge}/read/{path}`: a file's bytes.
pub(super) fn read_file<'a>(
    client: &'a Client,
    tree: Tree,
    slug: &'a str,
    path: &'a str,
) -> Call<'a, bytes::Bytes> {
    Call::new(async move {
        let api = client.api();
        let (op, answer) = match tree {
            Tree::Sources => {
                let op = "read_source_file";
                (
                    op,
                    client.call_meta(op, api.read_source_file(slug, path)).await,
                )
            }
            Tree::Knowledge => {
                let op = "read_knowledge_file";
                (
                    op,
                    client
                        .call_meta(op, api.read_knowledge_file(slug, path))
                        .await,
                )
            }
        };
        let (stream, meta) = answer?;
        Ok((collect_stream(op, stream).await?, meta))
    })
}

/// Reads a generated byte stream to the end.
pub(crate) async fn collect_stream(
    op: &'static str,
    stream: progenitor_client::ByteStream,
) -> Result<bytes::Bytes> {
    let chunks: Vec<bytes::Bytes> = stream
        .into_inner()
        .try_collect()
        .await
        .map_err(|e| crate::transport::map_reqwest(op, e, None))?;
    Ok(chunks.concat().into())
}

fn file_name(path: &Path) -> Result<String> {
    path.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_owned)
        .ok_or_else(|| Error::InvalidRequest(format!("{} has no usable file name", path.display())))
}

#[cfg(feature = "import-dir")]
fn dir_label(dir: &Path) -> String {
    dir.canonicalize()
        .ok()
        .as_deref()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
        .filter(|n| !n.is_empty())
        .unwrap_or("sources")
        .to_owned()
}

/// `(absolute path, relative path with '/', length)` of every non-hidden file, sorted.
fn collect_files(dir: &Path) -> Result<Vec<(PathBuf, String, u64)>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).map_err(io("import_dir", "read", &d))?;
        for entry in entries {
            let entry = entry.map_err(io("import_dir", "read", &d))?;
            let name = entry.file_name();
            if name.to_string_lossy().starts_with('.') {
                continue;
            }
            let path = entry.path();
            let meta = entry.metadata().map_err(io("import_dir", "read", &path))?;
            if meta.is_dir() {
                stack.push(path);
            } else if meta.is_file() {
                let rel = path
                    .strip_prefix(dir)
                    .map_err(|_| {
                        Error::InvalidRequest(format!(
                            "{} is outside {}",
                            path.display(),
                            dir.display()
                        ))
                    })?
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join("/");
                out.push((path, rel, meta.len()));
            }
        }
    }
    out.sort_by(|a, b| a.1.cmp(&b.1));
    Ok(out)
}

/// [`Error::Io`] for `action` on `path` during `operation`.
fn io(
    operation: &'static str,
    action: &'static str,
    path: &Path,
) -> impl Fn(std::io::Error) -> Error + use<> {
    let path = path.to_path_buf();
    move |source| Error::Io {
        operation,
        action,
        path: path.clone(),
        source,
    }
}

/// Runs blocking file work on tokio's blocking pool; a panic in `work`
/// continues as a panic here.
async fn off_runtime<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(_) => Err(Error::InvalidRequest(
                "the file work was cancelled (the runtime is shutting down)".to_owned(),
            )),
        },
    }
}

#[cfg(feature = "import-dir")]
fn build_tar_gz(dir: &Path, files: &[(PathBuf, String, u64)]) -> Result<Vec<u8>> {
    let io = io("import_dir", "archive", dir);
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    for (abs, rel, _) in files {
        tar.append_path_with_name(abs, rel).map_err(&io)?;
    }
    tar.into_inner().map_err(&io)?.finish().map_err(&io)
}

fn encode_segment(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

mod tokio_util_like {
    //! A file as a stream of chunks, for streaming uploads.
    use futures::Stream;
    use tokio::io::AsyncReadExt;

    pub(super) fn file_stream(
        file: tokio::fs::File,
    ) -> impl Stream<Item = std::io::Result<bytes::Bytes>> + Send + 'static {
        futures::stream::try_unfold(file, |mut file| async move {
            let mut buf = vec![0u8; 64 * 1024];
            let n = file.read(&mut buf).await?;
            if n == 0 {
                return Ok(None);
            }
            buf.truncate(n);
            Ok(Some((bytes::Bytes::from(buf), file)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn file_work_runs_off_the_runtime_thread() {
        let here = std::thread::current().id();
        let there = off_runtime(|| Ok(std::thread::current().id()))
            .await
            .unwrap();
        assert_ne!(here, there);
        let e = off_runtime(|| collect_files(Path::new("/nonexistent/nexus-knowql")))
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::Io {
                    operation: "import_dir",
                    action: "read",
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(std::error::Error::source(&e).is_some());
    }
}
