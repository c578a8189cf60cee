use super::*;
use crate::local::store::SourceMeta;
use chrono::Utc;

struct Scratch(PathBuf);

impl Scratch {
    fn new(label: &str) -> Scratch {
        let dir = crate::local::scratch_dir::fresh(label);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    /// Stages `data` as `name` under a 1 MiB cap, expecting it taken.
    fn stage_ok(&self, name: &str, data: &[u8]) -> Staged {
        self.stage(name, data, Caps::new(1 << 20, false)).unwrap()
    }

    fn stage(&self, name: &str, data: &[u8], caps: Caps) -> Result<Staged, StageError> {
        let upload = self.0.join("upload");
        std::fs::write(&upload, data).unwrap();
        let root = self.0.join("root");
        let _ = std::fs::remove_dir_all(&root);
        stage(&upload, name, "uploads", StagingRoot::new(root), caps)
    }
}

/// The paths a staging took, in order.
fn paths_of(staged: &Staged) -> Vec<&str> {
    staged.files.iter().map(|(p, _)| p.as_str()).collect()
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn zip_of(entries: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut zw = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default();
    for (name, body) in entries {
        zw.start_file(*name, opts).unwrap();
        zw.write_all(body).unwrap();
    }
    zw.finish().unwrap().into_inner()
}

#[test]
fn paths_never_leave_the_tree() {
    assert_eq!(safe_path("a/./b//c.md").as_deref(), Some("a/b/c.md"));
    assert_eq!(safe_path("../etc/passwd"), None);
    assert_eq!(safe_path("a\\..\\b"), None);
    assert_eq!(safe_path("/abs/x").as_deref(), Some("abs/x"));
    assert!(check_file_name("../x").is_err());
    assert!(check_file_name("").is_err());
    assert!(check_file_name("ok.md").is_ok());
}

#[test]
fn paths_that_mean_something_else_on_some_platform_are_refused() {
    for bad in [
        "C:/Windows/x",
        "c:x",
        "docs/file.md:stream",
        "CON",
        "docs/nul.txt",
        "com1.md",
        "LPT9",
        "trailing.",
        "space ",
        "tab\tname",
        "nul\0byte",
    ] {
        assert_eq!(safe_path(bad), None, "{bad:?}");
    }
    assert_eq!(safe_path(&"a".repeat(256)), None);
    assert_eq!(safe_path(&["ab"; 400].join("/")), None);
    for ok in ["console.md", "docs/com10.md", "connect/x.md", "a.b/c"] {
        assert!(safe_path(ok).is_some(), "{ok:?}");
    }
}

#[test]
fn tar_gz_is_expanded_and_hidden_files_skipped() {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    for (p, body) in [
        ("docs/a.md", "# A\n"),
        (".git/config", "x"),
        ("b.txt", "bee"),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, p, body.as_bytes()).unwrap();
    }
    let data = b.into_inner().unwrap().finish().unwrap();
    let scratch = Scratch::new("tgz");
    let e = scratch.stage_ok("src.tar.gz", &data);
    assert_eq!(paths_of(&e), vec!["uploads/docs/a.md", "uploads/b.txt"]);
    assert_eq!(e.skipped.len(), 1);
    assert_eq!(
        std::fs::read(e.root.path().join("files/uploads/b.txt")).unwrap(),
        b"bee"
    );
}

/// A tar holding one GNU long-name record that declares `size` bytes
/// (only its header and the first block are written: a reader that
/// trusts the size reads past the end).
fn tar_with_long_name_record(size: u64) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.as_gnu_mut().unwrap().name[..13].copy_from_slice(b"././@LongLink");
    h.set_entry_type(tar::EntryType::GNULongName);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_cksum();
    let mut out = h.as_bytes().to_vec();
    out.extend(std::iter::repeat_n(b'a', 512));
    out
}

/// Catches long-name and PAX records read whole whatever their size
/// (the raw reading or the size check removed): a record declaring
/// 300 MB is refused as too large before it is read, while a long
/// name within the limit still names its file, and a report keeps
/// only the first bytes of a long skipped name.
#[test]
fn tar_name_records_are_bounded_before_they_are_read() {
    let scratch = Scratch::new("longname");
    let data = tar_with_long_name_record(300 * 1024 * 1024);
    match scratch.stage("big.tar", &data, Caps::new(1 << 40, false)) {
        Err(StageError::TooLarge(m)) => assert!(m.contains("name record"), "{m}"),
        other => panic!("a 300 MB name record was not refused: {other:?}"),
    }
    let long = format!("docs/{}.md", "n".repeat(200));
    let hidden = format!(".{}", "h".repeat(5000));
    let data = tar_of(&[
        (long.as_str(), tar::EntryType::Regular, "# Long\n"),
        (hidden.as_str(), tar::EntryType::Regular, "x"),
    ]);
    let e = scratch.stage_ok("names.tar", &data);
    let paths: Vec<_> = e.files.iter().map(|(p, _)| p.clone()).collect();
    assert_eq!(paths, vec![format!("uploads/{long}")]);
    assert_eq!(e.skipped.len(), 1);
    assert!(e.skipped[0].0.len() <= MAX_REPORTED_NAME + '…'.len_utf8());
    assert!(e.skipped[0].0.ends_with('…'));
}

fn tar_of(entries: &[(&str, tar::EntryType, &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (p, kind, body) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(*kind);
        h.set_cksum();
        b.append_data(&mut h, p, body.as_bytes()).unwrap();
    }
    b.into_inner().unwrap()
}

#[test]
fn every_tar_entry_counts_and_only_the_first_skipped_names_are_kept() {
    let hidden: Vec<String> = (0..30).map(|i| format!(".h/{i}")).collect();
    let mut entries: Vec<(&str, tar::EntryType, &str)> = hidden
        .iter()
        .map(|p| (p.as_str(), tar::EntryType::Regular, ""))
        .collect();
    entries.push(("dir/", tar::EntryType::Directory, ""));
    entries.push(("dir/a.md", tar::EntryType::Regular, "# A"));
    let data = tar_of(&entries);
    let scratch = Scratch::new("count-tar");
    // 32 entries: one file, a directory and 30 hidden files.
    let caps = |n| Caps {
        entries: n,
        ..Caps::new(1 << 20, false)
    };
    assert!(matches!(
        scratch.stage("t.tar", &data, caps(31)),
        Err(StageError::TooLarge(m)) if m.contains("31 entries")
    ));
    let e = scratch.stage("t.tar", &data, caps(32)).unwrap();
    assert_eq!(e.files.len(), 1);
    assert_eq!(e.skipped_count, 30);
    assert_eq!(e.skipped.len(), MAX_SKIPPED_NAMES);
}

#[test]
fn tar_headers_count_toward_the_size_limit() {
    // 3,000 empty hidden files: no content, 1.5 MB of headers.
    let hidden: Vec<String> = (0..3000).map(|i| format!(".h/{i}")).collect();
    let entries: Vec<(&str, tar::EntryType, &str)> = hidden
        .iter()
        .map(|p| (p.as_str(), tar::EntryType::Regular, ""))
        .collect();
    let data = tar_of(&entries);
    let scratch = Scratch::new("headers");
    assert!(matches!(
        scratch.stage("t.tar", &data, Caps::new(1 << 20, false)),
        Err(StageError::TooLarge(_))
    ));
}

#[test]
fn a_cancelled_expansion_stops() {
    let data = tar_of(&[("a.md", tar::EntryType::Regular, "# A")]);
    let scratch = Scratch::new("cancel");
    let caps = Caps::new(1 << 20, false);
    caps.cancel.store(true, Ordering::Relaxed);
    assert!(matches!(
        scratch.stage("t.tar", &data, caps),
        Err(StageError::Cancelled)
    ));
}

#[test]
fn zip_is_expanded_within_the_limit() {
    let data = zip_of(&[("notes/n.md", vec![b'x'; 100])]);
    let scratch = Scratch::new("zip");
    let e = scratch.stage_ok("n.zip", &data);
    assert_eq!(e.files, [("uploads/notes/n.md".to_owned(), 100)]);
    assert!(matches!(
        scratch.stage("n.zip", &data, Caps::new(50, false)),
        Err(StageError::TooLarge(_))
    ));
}

#[test]
fn a_zip_bomb_is_refused_by_its_ratio() {
    // 8 MiB of zeros compress to a few KiB: far beyond the ratio cap.
    let data = zip_of(&[("zeros.md", vec![0u8; 8 << 20])]);
    assert!((data.len() as u64) * MAX_EXPANSION_RATIO < 8 << 20);
    let scratch = Scratch::new("bomb");
    let err = scratch
        .stage("bomb.zip", &data, Caps::new(1 << 30, false))
        .unwrap_err();
    assert!(
        matches!(&err, StageError::TooLarge(m) if m.contains("archive bomb")),
        "{err:?}"
    );
}

#[test]
fn entry_counts_are_capped() {
    let entries: Vec<(String, Vec<u8>)> = (0..5)
        .map(|i| (format!("f{i}.md"), b"x".to_vec()))
        .collect();
    let refs: Vec<(&str, Vec<u8>)> = entries
        .iter()
        .map(|(n, b)| (n.as_str(), b.clone()))
        .collect();
    let data = zip_of(&refs);
    let scratch = Scratch::new("count");
    let caps = Caps {
        entries: 4,
        ..Caps::new(1 << 20, false)
    };
    assert!(matches!(
        scratch.stage("many.zip", &data, caps),
        Err(StageError::TooLarge(_))
    ));
}

#[test]
fn a_plain_file_lands_in_its_directory() {
    let scratch = Scratch::new("plain");
    let e = scratch
        .stage("guide.md", b"# G", Caps::new(100, false))
        .unwrap();
    assert_eq!(e.files[0].0, "uploads/guide.md");
}

#[test]
fn fitting_counts_replaced_files_once_and_refuses_clashes() {
    let now = Utc::now();
    let meta = |size| SourceMeta { size, mtime: now };
    let mut ctx: ContextRecord = serde_json::from_value(serde_json::json!({
        "id": "ctx_1", "slug": "s", "name": "S", "kind": "search",
        "description": null, "guide": null, "manifest": null,
        "created_at": now, "updated_at": now, "last_curated_at": null,
        "last_source_import_at": null, "curate_task_id": null, "import_task_id": null,
        "sample_queries": [], "index_generation": 0, "sources": {}
    }))
    .unwrap();
    ctx.sources.insert("uploads/a.md".into(), meta(60));
    ctx.sources.insert("uploads/dir/x.md".into(), meta(10));
    let staged = |files: &[(&str, u64)]| Staged {
        name: "n".into(),
        dir: "uploads".into(),
        root: StagingRoot::new(PathBuf::new()),
        files: files.iter().map(|(p, s)| ((*p).to_owned(), *s)).collect(),
        skipped: Vec::new(),
        skipped_count: 0,
    };
    assert!(check_fits(&ctx, &staged(&[("uploads/a.md", 90)]), 100).is_ok());
    assert_eq!(
        check_fits(&ctx, &staged(&[("uploads/b.md", 40)]), 100)
            .unwrap_err()
            .status,
        413
    );
    assert!(check_fits(&ctx, &staged(&[("uploads/a.md/x", 1)]), 100).is_err());
    assert!(check_fits(&ctx, &staged(&[("uploads/dir", 1)]), 100).is_err());
}

/// A gzip member holding a tar of `files`.
fn tar_gz_member(files: &[(&str, &str)]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    for (p, body) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, p, body.as_bytes()).unwrap();
    }
    b.into_inner().unwrap().finish().unwrap()
}

/// Reproduction: a `.tar.gz` padded with NUL blocks after its last member
/// (which GNU tar and `gzip -t` accept) was refused "invalid gzip header".
/// It is read as GNU tar reads it, every member; bytes other than NUL
/// after the padding are still refused.
#[test]
fn a_tar_gz_padded_with_nul_blocks_is_read_as_gnu_tar_reads_it() {
    let mut data = tar_gz_member(&[("a.md", "# A\n")]);
    data.extend(tar_gz_member(&[("b.md", "# B\n")]));
    data.resize(data.len().next_multiple_of(10240) + 10240, 0);
    let scratch = Scratch::new("padded");
    let e = scratch.stage_ok("padded.tar.gz", &data);
    assert_eq!(paths_of(&e), vec!["uploads/a.md", "uploads/b.md"]);
    data.extend(b"trailing garbage");
    let err = scratch
        .stage("padded.tar.gz", &data, Caps::new(1 << 20, false))
        .unwrap_err();
    assert!(matches!(err, StageError::Invalid(_)), "{err:?}");
}

/// Reproduction: an archive of one entry more than the limit was refused
/// only after every entry below the limit had been written (100,001 tiny
/// files took 57 s). The entries are counted first: nothing is written.
#[test]
fn an_archive_over_the_entry_limit_is_refused_before_anything_is_written() {
    let files: Vec<(String, String)> = (0..11)
        .map(|i| (format!("f{i}.md"), format!("# {i}\n")))
        .collect();
    let files: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, b)| (p.as_str(), b.as_str()))
        .collect();
    let data = tar_gz_member(&files);
    let scratch = Scratch::new("entries");
    // Nothing can be written where the entries would go: writing one
    // before the refusal fails as a clash, not as too many entries.
    let root = scratch.0.join("blocked");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("files"), b"").unwrap();
    let upload = scratch.0.join("many.tar.gz");
    std::fs::write(&upload, &data).unwrap();
    let mut caps = Caps::new(1 << 20, false);
    caps.entries = 10;
    let err = stage(
        &upload,
        "many.tar.gz",
        "uploads",
        StagingRoot::new(root),
        caps,
    )
    .unwrap_err();
    assert!(
        matches!(&err, StageError::TooLarge(m) if m.contains("10 entries")),
        "{err:?}"
    );
    let mut caps = Caps::new(1 << 20, false);
    caps.entries = 11;
    assert_eq!(
        scratch
            .stage("many.tar.gz", &data, caps)
            .unwrap()
            .files
            .len(),
        11
    );
}
