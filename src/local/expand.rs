//! Expanding an upload in its staging directory: one file, or an archive
//! (`.zip`, `.tar`, `.tar.gz`, `.tgz`), within the entry, byte and ratio
//! caps, counted as the expanded stream is read; and the check that the
//! result fits its context.

use std::cell::Cell;
use std::collections::HashSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::error::{LocalError, LocalResult};
pub(crate) use super::paths::safe_path;
use super::paths::{MAX_PATH_BYTES, safe_join};
use super::records::ContextRecord;

/// Most files one archive may expand to.
const MAX_ARCHIVE_ENTRIES: usize = 100_000;
/// Most bytes an archive may expand to per byte uploaded.
pub(crate) const MAX_EXPANSION_RATIO: u64 = 200;
/// An archive may always expand to this many bytes, whatever its ratio.
const RATIO_FREE_BYTES: u64 = 1024 * 1024;
/// Copy buffer of the expansion.
const COPY_BUFFER: usize = 64 * 1024;
/// Skipped entries named in an import's report (the rest are counted).
const MAX_SKIPPED_NAMES: usize = 20;
/// Longest name of a skipped entry kept in a report, in bytes (longer ones
/// are cut, marked with `…`).
const MAX_REPORTED_NAME: usize = 256;
/// Largest tar metadata record (a GNU long name or link, a PAX header)
/// accepted; a larger one refuses the archive before it is read.
pub(crate) const MAX_TAR_NAME_RECORD: u64 = 64 * 1024;
/// Bytes counted for each zip entry besides its content (its headers).
const ZIP_ENTRY_OVERHEAD: u64 = 76;
/// Largest zip central directory parsed (640 bytes for each of the
/// [`MAX_ARCHIVE_ENTRIES`]); one declared larger is refused before it is read.
const MAX_ZIP_DIRECTORY_BYTES: u64 = 64 * 1024 * 1024;

/// An upload staged on disk: the uploaded file and its expansion.
#[derive(Debug)]
pub(crate) struct Staged {
    /// The file name the client sent.
    pub(crate) name: String,
    /// The directory of the source tree it lands in.
    pub(crate) dir: String,
    /// The private staging directory: removed when this is dropped, unless
    /// the import that moves its files keeps it for the next start.
    pub(crate) root: StagingRoot,
    /// Expanded files as `(source path, size)`, in the order found.
    pub(crate) files: Vec<(String, u64)>,
    /// `(entry, reason)` of the first entries left out.
    pub(crate) skipped: Vec<(String, String)>,
    /// How many entries were left out.
    pub(crate) skipped_count: usize,
}

impl Staged {
    pub(crate) fn files_dir(root: &Path) -> PathBuf {
        root.join("files")
    }
}

/// A staging directory owned by one upload: it belongs to its request until
/// the import commits to moving its files, and whatever drops it first (a
/// refusal, a failure, a request that went away, the import's end) removes
/// it. Only an import whose move is under way keeps it, for the next start
/// to finish that move from ([`StagingRoot::keep_for_next_start`]).
#[derive(Debug)]
pub(crate) struct StagingRoot {
    path: PathBuf,
    keep: bool,
}

impl StagingRoot {
    /// Takes ownership of the staging directory at `path` (made or not yet).
    pub(crate) fn new(path: PathBuf) -> Self {
        StagingRoot { path, keep: false }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the directory stays when this is dropped: while an import's
    /// move is under way and not yet saved, it is what the next start
    /// finishes the import from.
    pub(crate) fn keep_for_next_start(&mut self, keep: bool) {
        self.keep = keep;
    }
}

impl Drop for StagingRoot {
    fn drop(&mut self) {
        if self.keep || self.path.as_os_str().is_empty() {
            return;
        }
        let dir = std::mem::take(&mut self.path);
        let remove = move || match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!(error = %e, dir = %dir.display(), "a staging directory could not be removed");
            }
            _ => {}
        };
        // Off the async threads: a staged archive may hold many files.
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(remove)),
            Err(_) => remove(),
        }
    }
}

/// Why an upload was refused while staging.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StageError {
    /// A size, ratio or count cap was exceeded (413).
    TooLarge(String),
    /// The archive is unreadable or holds conflicting paths (400).
    Invalid(String),
    /// The server ran out of a resource (disk space, file descriptors):
    /// 503 with `Retry-After`; the request itself is fine.
    Exhausted(String),
    /// The disk failed (500).
    Io(String),
    /// The upload's request went away.
    Cancelled,
}

impl From<StageError> for LocalError {
    fn from(e: StageError) -> Self {
        match e {
            StageError::TooLarge(m) => LocalError::too_large(m),
            StageError::Invalid(m) => LocalError::bad_request(m),
            StageError::Exhausted(m) => LocalError::exhausted(m),
            StageError::Io(m) => LocalError::internal("staging the upload", m),
            StageError::Cancelled => LocalError::bad_request("the upload was cancelled"),
        }
    }
}

impl StageError {
    /// A failure of the disk or the process while staging, by cause: out of
    /// space or descriptors is [`StageError::Exhausted`].
    fn io(e: &std::io::Error) -> Self {
        match super::error::exhaustion(e) {
            Some(cause) => StageError::Exhausted(cause.to_owned()),
            None => StageError::Io(e.to_string()),
        }
    }

    /// A failure to create an entry's file or directory: a clash with
    /// another entry (400), unless the server ran out of a resource.
    fn creating(raw: &str, e: &std::io::Error) -> Self {
        match super::error::exhaustion(e) {
            Some(cause) => StageError::Exhausted(cause.to_owned()),
            None => StageError::Invalid(format!("entry {raw:?} conflicts with another: {e}")),
        }
    }
}

/// Whether a path is hidden or archive clutter (skipped on expansion).
fn is_clutter(path: &str) -> bool {
    path.split('/')
        .any(|p| p.starts_with('.') || p == "__MACOSX")
}

/// Checks an upload's file name.
pub(crate) fn check_file_name(name: &str) -> LocalResult<()> {
    if name.contains(['/', '\\']) || safe_path(name).as_deref() != Some(name) {
        return Err(LocalError::bad_request(format!(
            "missing or unsafe file name {name:?}"
        )));
    }
    Ok(())
}

/// The caps of one expansion.
#[derive(Debug, Clone)]
pub(crate) struct Caps {
    /// Most expanded bytes in all.
    pub(crate) total: u64,
    /// Most expanded bytes per uploaded byte (archives only).
    pub(crate) ratio: u64,
    /// Most files.
    pub(crate) entries: usize,
    /// Whether staged files are flushed to disk (a data directory is in use).
    pub(crate) sync: bool,
    /// Set when the upload's request is gone: the expansion stops.
    pub(crate) cancel: Arc<AtomicBool>,
}

impl Caps {
    pub(crate) fn new(total: u64, sync: bool) -> Self {
        Caps {
            total,
            ratio: MAX_EXPANSION_RATIO,
            entries: MAX_ARCHIVE_ENTRIES,
            sync,
            cancel: Arc::new(AtomicBool::new(false)),
        }
    }
}

/// Expands the uploaded file at `upload` (named `name`) into
/// `root/files/{dir}/...`, within `caps`. On error `root` is dropped, which
/// removes it.
pub(crate) fn stage(
    upload: &Path,
    name: &str,
    dir: &str,
    root: StagingRoot,
    caps: Caps,
) -> Result<Staged, StageError> {
    let io = |e: std::io::Error| StageError::io(&e);
    let uploaded = std::fs::metadata(upload).map_err(io)?.len();
    let lower = name.to_ascii_lowercase();
    let is_archive = lower.ends_with(".zip")
        || lower.ends_with(".tar")
        || lower.ends_with(".tar.gz")
        || lower.ends_with(".tgz");
    let limit = if is_archive {
        caps.total
            .min(uploaded.saturating_mul(caps.ratio).max(RATIO_FREE_BYTES))
    } else {
        caps.total
    };
    let over: Rc<Cell<Option<Over>>> = Rc::new(Cell::new(None));
    let mut out = Expander {
        files_dir: Staged::files_dir(root.path()),
        dir: dir.to_owned(),
        limit,
        total_cap: caps.total,
        entries: caps.entries,
        sync: caps.sync,
        total: 0,
        files: Vec::new(),
        seen: HashSet::new(),
        skipped: Vec::new(),
        skipped_count: 0,
        entries_seen: 0,
        buffer: vec![0; COPY_BUFFER],
        cancel: caps.cancel.clone(),
    };
    if lower.ends_with(".zip") {
        expand_zip(upload, uploaded, &caps, &mut out)?;
    } else if lower.ends_with(".tar") || lower.ends_with(".tar.gz") || lower.ends_with(".tgz") {
        expand_tar(
            upload,
            !lower.ends_with(".tar"),
            limit,
            &over,
            &caps,
            &mut out,
        )?;
    } else {
        let mut file = std::fs::File::open(upload).map_err(io)?;
        out.add(name, &mut file)?;
    }
    Ok(Staged {
        name: name.to_owned(),
        dir: dir.to_owned(),
        root,
        files: out.files,
        skipped: out.skipped,
        skipped_count: out.skipped_count,
    })
}

/// Expands a zip archive into `out`, its entry count checked first.
fn expand_zip(
    upload: &Path,
    uploaded: u64,
    caps: &Caps,
    out: &mut Expander,
) -> Result<(), StageError> {
    let io = |e: std::io::Error| StageError::io(&e);
    let mut file = std::io::BufReader::new(std::fs::File::open(upload).map_err(io)?);
    check_zip_directory(&mut file, uploaded, caps.entries)?;
    let mut zip = zip::ZipArchive::new(file)
        .map_err(|e| StageError::Invalid(format!("not a readable zip archive: {e}")))?;
    if zip.len() > caps.entries {
        return Err(StageError::TooLarge(format!(
            "the archive holds more than {} entries (the limit)",
            caps.entries
        )));
    }
    for i in 0..zip.len() {
        let mut entry = zip
            .by_index(i)
            .map_err(|e| StageError::Invalid(format!("zip entry {i}: {e}")))?;
        let raw = entry
            .name()
            .map_err(|e| StageError::Invalid(format!("zip entry {i}: {e}")))?
            .into_owned();
        out.count_entry(ZIP_ENTRY_OVERHEAD.saturating_add(raw.len() as u64))?;
        if entry.is_dir() {
            continue;
        }
        out.add(&raw, &mut entry)?;
    }
    Ok(())
}

/// Expands a tar (`gz`: a gzip of one) into `out`, every byte counted
/// toward `limit` and its entries counted before anything is written.
fn expand_tar(
    upload: &Path,
    gz: bool,
    limit: u64,
    over: &Rc<Cell<Option<Over>>>,
    caps: &Caps,
    out: &mut Expander,
) -> Result<(), StageError> {
    // Counted before anything is written: too many entries are refused
    // after reading the headers alone.
    count_tar_entries(tar_stream(upload, gz, limit, over, caps)?, caps.entries)
        .map_err(|e| out.stream_stage_error(over, e))?;
    let mut tar = tar_archive(tar_stream(upload, gz, limit, over, caps)?);
    // Raw entries: long-name and PAX records come as entries of their
    // own, so their size is checked before any of them is read (the
    // tar crate would read them whole).
    let entries = tar
        .entries()
        .map_err(|e| out.stream_error(over, format!("not a readable tar archive: {e}")))?
        .raw(true);
    let mut long_name: Option<String> = None;
    for entry in entries {
        let mut entry = entry.map_err(|e| out.stream_error(over, format!("tar entry: {e}")))?;
        // Every entry counts toward the cap, whatever its kind.
        out.count_entry(0)?;

        let kind = entry.header().entry_type();
        if is_name_record(kind) {
            let name =
                read_name_record(&mut entry, kind).map_err(|e| out.stream_stage_error(over, e))?;
            if name.is_some() {
                long_name = name;
            }
            continue;
        }
        let long_name = long_name.take();
        if kind.is_dir() {
            continue;
        }
        let raw = long_name.unwrap_or_else(|| {
            entry
                .path()
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default()
        });
        if !kind.is_file() {
            out.skip(|| raw, "not a regular file");
            continue;
        }
        out.add(&raw, &mut entry)
            .map_err(|e| out.stream_stage_error(over, e))?;
    }
    Ok(())
}

/// The expanded stream of a tar (`gz`: a gzip of one) at `upload`, every
/// byte counted toward `limit` (headers and padding too) as it streams:
/// refused at the first byte over it, or once the request is gone.
fn tar_stream(
    upload: &Path,
    gz: bool,
    limit: u64,
    over: &Rc<Cell<Option<Over>>>,
    caps: &Caps,
) -> Result<Counted<Box<dyn Read>>, StageError> {
    let file =
        std::io::BufReader::new(std::fs::File::open(upload).map_err(|e| StageError::io(&e))?);
    // A gzip file may hold several members (`cat a.tar.gz b.tar.gz`) and
    // NUL padding after the last: read as `gzip -d` reads it.
    let inner: Box<dyn Read> = if gz {
        Box::new(GzMembers::new(file))
    } else {
        Box::new(file)
    };
    Ok(Counted {
        inner,
        count: 0,
        limit,
        over: over.clone(),
        cancel: caps.cancel.clone(),
    })
}

/// A tar reader over `stream` that reads concatenated archives (`cat a.tar
/// b.tar`, or several gzip members) whole: the end-of-archive marker
/// between them is read past, so an upload is never taken for its first
/// part alone.
fn tar_archive<R: Read>(stream: R) -> tar::Archive<R> {
    let mut tar = tar::Archive::new(stream);
    tar.set_ignore_zeros(true);
    tar
}

/// Reads a tar's headers only (entries' data is skipped, not written) and
/// refuses it when it holds more than `max` entries of any kind, before
/// any of them is expanded.
fn count_tar_entries<R: Read>(stream: R, max: usize) -> Result<(), StageError> {
    let mut tar = tar_archive(stream);
    let entries = tar
        .entries()
        .map_err(|e| StageError::Invalid(format!("not a readable tar archive: {e}")))?
        .raw(true);
    for (seen, entry) in entries.enumerate() {
        let entry = entry.map_err(|e| StageError::Invalid(format!("tar entry: {e}")))?;
        // Checked before the next entry skips past it.
        if is_name_record(entry.header().entry_type()) {
            check_name_record(entry.declared_size())?;
        }
        if seen >= max {
            return Err(StageError::TooLarge(format!(
                "the archive holds more than {max} entries (the limit; files, directories, links, hidden and unsafe entries all count)"
            )));
        }
    }
    Ok(())
}

/// The gzip members of a file, decompressed one after another, as `gzip -d`
/// reads them: NUL bytes after the last member (padding to a block size,
/// as tape tools and some archivers write) end the stream; any other byte
/// there is an error, never taken for the start of another member.
struct GzMembers<R: std::io::BufRead> {
    member: Option<flate2::bufread::GzDecoder<R>>,
}

impl<R: std::io::BufRead> GzMembers<R> {
    fn new(inner: R) -> Self {
        GzMembers {
            member: Some(flate2::bufread::GzDecoder::new(inner)),
        }
    }
}

impl<R: std::io::BufRead> Read for GzMembers<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let Some(member) = self.member.as_mut() else {
                return Ok(0);
            };
            let n = member.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            // This member ended: another follows, or padding, or nothing.
            let Some(mut rest) = self
                .member
                .take()
                .map(flate2::bufread::GzDecoder::into_inner)
            else {
                return Ok(0);
            };
            if another_member(&mut rest)? {
                self.member = Some(flate2::bufread::GzDecoder::new(rest));
            }
        }
    }
}

/// Whether another gzip member starts here; `false` at the end of the file
/// or of its NUL padding (consumed). Other bytes after padding are an error.
fn another_member(r: &mut impl std::io::BufRead) -> std::io::Result<bool> {
    let mut padded = false;
    loop {
        let buf = r.fill_buf()?;
        let Some(&first) = buf.first() else {
            return Ok(false);
        };
        if first != 0 {
            if padded {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "bytes after the gzip padding",
                ));
            }
            return Ok(true);
        }
        let zeros = buf.iter().take_while(|b| **b == 0).count();
        r.consume(zeros);
        padded = true;
    }
}

/// Refuses a zip archive whose central directory, as its end records
/// declare it, holds more than `max_entries` entries or more than
/// [`MAX_ZIP_DIRECTORY_BYTES`]: checked before a parser reads (and holds)
/// that directory.
fn check_zip_directory<F: Read + std::io::Seek>(
    file: &mut F,
    size: u64,
    max_entries: usize,
) -> Result<(), StageError> {
    let declared = zip_directory::declared_directory(file, size).map_err(|e| match e {
        zip_directory::EndRecordError::Io(m) => StageError::Io(m),
        e => StageError::Invalid(format!("not a readable zip archive: {e}")),
    })?;
    if declared.entries > max_entries as u64 {
        return Err(StageError::TooLarge(format!(
            "the archive declares {} entries; more than {max_entries} entries (the limit) are refused",
            declared.entries
        )));
    }
    if declared.bytes > MAX_ZIP_DIRECTORY_BYTES {
        return Err(StageError::TooLarge(format!(
            "the archive declares a central directory of {} bytes; at most {MAX_ZIP_DIRECTORY_BYTES} are accepted",
            declared.bytes
        )));
    }
    let smallest = declared
        .entries
        .saturating_mul(zip_directory::MIN_DIRECTORY_HEADER);
    if declared.bytes > size || smallest > declared.bytes {
        return Err(StageError::Invalid(format!(
            "not a readable zip archive: its central directory of {} bytes cannot hold {} entries in a file of {size} bytes",
            declared.bytes, declared.entries
        )));
    }
    Ok(())
}

/// Whether a raw tar entry is a metadata record: a GNU long name or link,
/// or a PAX header (local or global).
fn is_name_record(kind: tar::EntryType) -> bool {
    kind.is_gnu_longname()
        || kind.is_gnu_longlink()
        || kind.is_pax_local_extensions()
        || kind.is_pax_global_extensions()
}

/// Reads a metadata record of at most [`MAX_TAR_NAME_RECORD`] bytes
/// (refusing a larger one before reading it); returns the entry name it
/// gives the next entry, if any.
fn read_name_record(
    entry: &mut dyn ReadEntry,
    kind: tar::EntryType,
) -> Result<Option<String>, StageError> {
    let size = entry.declared_size();
    check_name_record(size)?;
    let mut data = Vec::with_capacity(size as usize);
    entry
        .take_reader(MAX_TAR_NAME_RECORD)
        .read_to_end(&mut data)
        .map_err(|e| StageError::Invalid(format!("tar name record: {e}")))?;
    if kind.is_gnu_longname() {
        let end = data.iter().position(|b| *b == 0).unwrap_or(data.len());
        return Ok(Some(String::from_utf8_lossy(&data[..end]).into_owned()));
    }
    if kind.is_pax_local_extensions() {
        for ext in tar::PaxExtensions::new(&data).flatten() {
            if ext.key() == Ok("path") {
                return Ok(Some(
                    String::from_utf8_lossy(ext.value_bytes()).into_owned(),
                ));
            }
        }
    }
    Ok(None)
}

/// Refuses a metadata record declaring more than [`MAX_TAR_NAME_RECORD`]
/// bytes, before any of it is read.
fn check_name_record(size: u64) -> Result<(), StageError> {
    if size > MAX_TAR_NAME_RECORD {
        return Err(StageError::TooLarge(format!(
            "the archive holds a tar name record of {size} bytes; at most {MAX_TAR_NAME_RECORD} are accepted"
        )));
    }
    Ok(())
}

/// A tar entry as [`read_name_record`] reads it.
trait ReadEntry {
    /// The size its header declares.
    fn declared_size(&self) -> u64;
    /// Its data, at most `limit` bytes.
    fn take_reader(&mut self, limit: u64) -> std::io::Take<&mut dyn Read>;
}

impl<R: Read> ReadEntry for tar::Entry<'_, R> {
    fn declared_size(&self) -> u64 {
        self.header().entry_size().unwrap_or(u64::MAX)
    }

    fn take_reader(&mut self, limit: u64) -> std::io::Take<&mut dyn Read> {
        (self as &mut dyn Read).take(limit)
    }
}

/// A name cut to [`MAX_REPORTED_NAME`] bytes (at a character boundary),
/// marked with `…` when cut.
fn cut_name(mut name: String) -> String {
    if name.len() > MAX_REPORTED_NAME {
        let mut end = MAX_REPORTED_NAME;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        name.truncate(end);
        name.push('…');
    }
    name
}

/// Why the expanded stream of an archive stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Over {
    Size,
    Cancelled,
}

/// A reader of an expanded stream that counts its bytes and fails past
/// `limit` or once cancelled, noting why in `over`.
struct Counted<R> {
    inner: R,
    count: u64,
    limit: u64,
    over: Rc<Cell<Option<Over>>>,
    cancel: Arc<AtomicBool>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.cancel.load(Ordering::Relaxed) {
            self.over.set(Some(Over::Cancelled));
            return Err(std::io::Error::other(crate::status::word::CANCELLED));
        }
        let n = self.inner.read(buf)?;
        self.count = self.count.saturating_add(n as u64);
        if self.count > self.limit {
            self.over.set(Some(Over::Size));
            return Err(std::io::Error::other("the expansion limit was reached"));
        }
        Ok(n)
    }
}

/// Writes expanded entries into the staging directory, counting bytes.
struct Expander {
    files_dir: PathBuf,
    dir: String,
    limit: u64,
    total_cap: u64,
    entries: usize,
    sync: bool,
    total: u64,
    files: Vec<(String, u64)>,
    seen: HashSet<String>,
    skipped: Vec<(String, String)>,
    skipped_count: usize,
    entries_seen: usize,
    buffer: Vec<u8>,
    cancel: Arc<AtomicBool>,
}

impl Expander {
    /// Counts one archive entry (of any kind) and `overhead` bytes of it
    /// toward the caps.
    fn count_entry(&mut self, overhead: u64) -> Result<(), StageError> {
        if self.cancel.load(Ordering::Relaxed) {
            return Err(StageError::Cancelled);
        }
        self.entries_seen = self.entries_seen.saturating_add(1);
        if self.entries_seen > self.entries {
            return Err(StageError::TooLarge(format!(
                "the archive holds more than {} entries (the limit; files, directories, links, hidden and unsafe entries all count)",
                self.entries
            )));
        }
        self.total = self.total.saturating_add(overhead);
        self.check_total()
    }

    fn check_total(&self) -> Result<(), StageError> {
        if self.total <= self.limit {
            return Ok(());
        }
        Err(self.too_large())
    }

    fn too_large(&self) -> StageError {
        StageError::TooLarge(if self.limit < self.total_cap {
            format!(
                "the archive expands beyond {} bytes ({}x its size, the limit): refused as a possible archive bomb",
                self.limit, MAX_EXPANSION_RATIO
            )
        } else {
            format!("the upload expands beyond the {} byte limit", self.limit)
        })
    }

    /// Notes a skipped entry: its name (cut short) among the first few,
    /// else a count.
    fn skip(&mut self, name: impl FnOnce() -> String, reason: &str) {
        self.skipped_count = self.skipped_count.saturating_add(1);
        if self.skipped.len() < MAX_SKIPPED_NAMES {
            self.skipped.push((cut_name(name()), reason.to_owned()));
        }
    }

    /// The error for a failed read of the expanded stream.
    fn stream_error(&self, over: &Cell<Option<Over>>, message: String) -> StageError {
        match over.get() {
            Some(Over::Size) => self.too_large(),
            Some(Over::Cancelled) => StageError::Cancelled,
            None => StageError::Invalid(message),
        }
    }

    fn stream_stage_error(&self, over: &Cell<Option<Over>>, e: StageError) -> StageError {
        match (over.get(), e) {
            (None, e) => e,
            (Some(_), StageError::Invalid(m)) => self.stream_error(over, m),
            (Some(_), e) => e,
        }
    }

    fn add(&mut self, raw: &str, reader: &mut dyn Read) -> Result<(), StageError> {
        let Some(path) = safe_path(raw) else {
            self.skip(|| raw.to_owned(), "unsafe path");
            return Ok(());
        };
        if is_clutter(&path) {
            self.skip(|| raw.to_owned(), "hidden");
            return Ok(());
        }
        let full = format!("{}/{path}", self.dir);
        if full.len() > MAX_PATH_BYTES {
            self.skip(|| raw.to_owned(), "path too long");
            return Ok(());
        }
        if self.files.len() >= self.entries {
            return Err(StageError::TooLarge(format!(
                "the archive holds more than {} entries (the limit)",
                self.entries
            )));
        }
        let target = safe_join(&self.files_dir, &full)
            .ok_or_else(|| StageError::Invalid(format!("unsafe path {raw:?}")))?;
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| StageError::creating(raw, &e))?;
        }
        let mut file = std::fs::File::create(&target).map_err(|e| StageError::creating(raw, &e))?;
        let mut size = 0u64;
        loop {
            let n = reader
                .read(&mut self.buffer)
                .map_err(|e| StageError::Invalid(format!("entry {raw:?}: {e}")))?;
            if n == 0 {
                break;
            }
            if self.cancel.load(Ordering::Relaxed) {
                return Err(StageError::Cancelled);
            }
            size = size.saturating_add(n as u64);
            self.total = self.total.saturating_add(n as u64);
            self.check_total()?;
            file.write_all(&self.buffer[..n])
                .map_err(|e| StageError::io(&e))?;
        }
        if self.sync {
            file.sync_all().map_err(|e| StageError::io(&e))?;
        }
        if self.seen.insert(full.clone()) {
            self.files.push((full, size));
        } else if let Some(slot) = self.files.iter_mut().find(|(p, _)| *p == full) {
            slot.1 = size;
        }
        Ok(())
    }
}

/// Checks staged files against a context: the byte limit once they replace
/// or join its sources (linear in the files), and no file/directory clash.
pub(crate) fn check_fits(ctx: &ContextRecord, staged: &Staged, limit: u64) -> LocalResult<()> {
    let mut total: u64 = ctx.sources.values().map(|m| m.size).sum();
    for (path, size) in &staged.files {
        if let Some(old) = ctx.sources.get(path) {
            total = total.saturating_sub(old.size);
        }
        total = total.saturating_add(*size);
        let mut prefix = path.as_str();
        while let Some((parent, _)) = prefix.rsplit_once('/') {
            if ctx.sources.contains_key(parent) {
                return Err(LocalError::conflict(format!(
                    "{path:?} would be below the file {parent:?}"
                )));
            }
            prefix = parent;
        }
        let below = format!("{path}/");
        if ctx
            .sources
            .range::<str, _>((
                std::ops::Bound::Included(below.as_str()),
                std::ops::Bound::Unbounded,
            ))
            .next()
            .is_some_and(|(k, _)| k.starts_with(&below))
        {
            return Err(LocalError::conflict(format!(
                "{path:?} is a directory of the context"
            )));
        }
    }
    if total > limit {
        return Err(LocalError::too_large(format!(
            "the context would exceed its {limit} byte limit"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
mod zip_directory;
