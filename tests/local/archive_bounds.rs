//! Bounds on what an archive says about itself: a gzip of several members
//! is read whole, a zip's central directory is counted and sized from its
//! end records before it is parsed, and a staging step that runs out of
//! disk answers 503 with a code instead of blaming the request.

use crate::support::local::*;
use serde_json::json;

/// A `.tar.gz` of `files` (`(path, text)`), one gzip member.
fn tar_gz(files: &[(&str, &str)]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    for (path, text) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(text.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        tar.append_data(&mut header, path, text.as_bytes()).unwrap();
    }
    tar.into_inner().unwrap().finish().unwrap()
}

/// Uploads `body` as `name` into the context `slug`: status and body text.
async fn upload(base: &str, slug: &str, name: &str, body: Vec<u8>) -> (u16, String) {
    let form = reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(body).file_name(name.to_owned()),
    );
    let resp = http()
        .post(format!("{base}/contexts/{slug}/import/upload"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap())
}

async fn create_context(base: &str, slug: &str) {
    let (status, body) = post_json(
        &format!("{base}/contexts"),
        json!({"slug": slug, "name": slug}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

/// Catches a multi-member gzip imported in part: `cat a.tar.gz b.tar.gz`
/// is a valid gzip file (`gzip -d` gives both tars, one after the other),
/// and every file of both members is served once the upload is answered.
#[tokio::test]
async fn a_gzip_of_two_members_is_imported_whole() {
    let first = [("a/one.md", "# One\n"), ("a/two.md", "# Two\n")];
    let second = [("b/three.md", "# Three\n"), ("b/four.md", "# Four\n")];
    let mut archive = tar_gz(&first);
    archive.extend(tar_gz(&second));
    let server = LocalBinary::start(&[], &[]);
    let base = server.url.clone();
    create_context(&base, "cat").await;
    let (status, body) = upload(&base, "cat", "both.tar.gz", archive).await;
    assert_eq!(status, 200, "{body}");
    for (path, text) in first.iter().chain(&second) {
        let resp = http()
            .get(format!("{base}/contexts/cat/source/read/uploads/{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path} is served");
        assert_eq!(resp.text().await.unwrap(), *text, "{path}");
    }
    server.kill();
}

/// A zip of one empty local file and a central directory of `entries`
/// headers (all naming that file's record), a zip64 end record declaring
/// them, its locator and the classic end record pointing at it: what a
/// parser reads into memory before anyone counts the entries.
fn zip_with_directory_of(entries: u32) -> Vec<u8> {
    let name = b"a";
    let mut out = Vec::new();
    // Local file header of "a": stored, empty.
    out.extend(0x0403_4b50u32.to_le_bytes());
    out.extend([20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    out.extend([0u8; 12]);
    out.extend((name.len() as u16).to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out.extend(name);
    let directory_at = out.len() as u64;
    for i in 0..entries {
        let entry = format!("d/{i:010}.md");
        out.extend(0x0201_4b50u32.to_le_bytes());
        out.extend([20, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        out.extend([0u8; 12]);
        out.extend((entry.len() as u16).to_le_bytes());
        out.extend([0u8; 12]);
        out.extend(0u32.to_le_bytes());
        out.extend(entry.as_bytes());
    }
    let directory_bytes = out.len() as u64 - directory_at;
    let zip64_at = out.len() as u64;
    out.extend(0x0606_4b50u32.to_le_bytes());
    out.extend(44u64.to_le_bytes());
    out.extend([45, 0, 45, 0]);
    out.extend([0u8; 8]);
    out.extend(u64::from(entries).to_le_bytes());
    out.extend(u64::from(entries).to_le_bytes());
    out.extend(directory_bytes.to_le_bytes());
    out.extend(directory_at.to_le_bytes());
    out.extend(0x0706_4b50u32.to_le_bytes());
    out.extend(0u32.to_le_bytes());
    out.extend(zip64_at.to_le_bytes());
    out.extend(1u32.to_le_bytes());
    out.extend(0x0605_4b50u32.to_le_bytes());
    out.extend([0u8; 4]);
    out.extend([0xff; 4]);
    out.extend([0xff; 8]);
    out.extend(0u16.to_le_bytes());
    out
}

/// Peak resident memory of a process, in KiB (Linux).
#[cfg(target_os = "linux")]
fn peak_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Catches a zip's central directory parsed before its entries are
/// counted: 1,500,000 entries (a 92 MB upload) took the server past 1 GB
/// of resident memory before the entry cap refused it. The end records
/// declare the count, so the upload is refused from them (413, the limit
/// named) and the server's peak stays under 400 MiB.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_zip_declaring_too_many_entries_is_refused_before_its_directory_is_read() {
    let archive = zip_with_directory_of(1_500_000);
    let server = LocalBinary::start(&["--upload-limit-mb", "512"], &[]);
    let base = server.url.clone();
    create_context(&base, "dir").await;
    let (status, body) = upload(&base, "dir", "many.zip", archive).await;
    assert_eq!(status, 413, "{body}");
    assert!(
        body.contains("100000 entries"),
        "the limit is named: {body}"
    );
    let peak = peak_kib(server.child.id());
    assert!(peak < 400 * 1024, "peak resident memory {peak} KiB");
    // A zip within the caps still imports whole.
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for i in 0..3 {
        writer
            .start_file(
                format!("z/{i}.md"),
                zip::write::SimpleFileOptions::default(),
            )
            .unwrap();
        std::io::Write::write_all(&mut writer, format!("# Zip {i}\n").as_bytes()).unwrap();
    }
    let few = writer.finish().unwrap().into_inner();
    let (status, body) = upload(&base, "dir", "few.zip", few).await;
    assert_eq!(status, 200, "{body}");
    for i in 0..3 {
        let resp = http()
            .get(format!("{base}/contexts/dir/source/read/uploads/z/{i}.md"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.text().await.unwrap(), format!("# Zip {i}\n"));
    }
    server.kill();
}

/// Catches a full disk while staging answered as an uncoded 500: the
/// upload gets 503 `resource_exhausted` with `Retry-After`, and nothing
/// of it is served.
#[cfg(feature = "failpoints")]
#[tokio::test]
async fn a_full_disk_while_staging_is_503_with_a_code() {
    let data = TempDir::new("staging-full");
    let dir = data.path().to_str().unwrap().to_owned();
    let server = LocalBinary::start(
        &["--data", &dir],
        &[(nexus_knowql::local::ENV_FAILPOINTS, "staging.write=enospc")],
    );
    let base = server.url.clone();
    create_context(&base, "full").await;
    let form = reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(b"# Full\n".to_vec()).file_name("full.md"),
    );
    let resp = http()
        .post(format!("{base}/contexts/full/import/upload"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["retry-after"], "5");
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["code"], "resource_exhausted", "{body}");
    let (status, _) = get_json(&format!("{base}/contexts/full/source/read/uploads/full.md")).await;
    assert_eq!(status, 404);
    server.kill();
}
