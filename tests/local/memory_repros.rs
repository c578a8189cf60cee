//! Memory reproductions against the `nexus-local` binary: a small archive
//! that declares huge name records, and a flood of turns while the
//! database writer is stalled. Memory is read from `/proc/<pid>/status`.

#[cfg(feature = "failpoints")]
use std::time::{Duration, Instant};

use flate2::{Compress, Compression, Crc, FlushCompress};
use serde_json::json;

use crate::support::local::*;

/// Peak and current resident memory of a process, in KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap()
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// A gzip stream built without compressing every byte: `parts` are
/// `(bytes, times)`; each is compressed once (sync-flushed, so it ends on a
/// byte boundary) after one warm-up copy, and its output repeated. Valid
/// as long as every part is at least the deflate window (32 KiB) long or
/// follows a copy of itself.
fn repeated_gz(parts: &[(&[u8], u64)]) -> Vec<u8> {
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    let mut z = Compress::new(Compression::fast(), false);
    let mut crc = Crc::new();
    let mut deflate = |input: &[u8], flush: FlushCompress, out: &mut Vec<u8>| {
        let start = out.len();
        let mut buf = vec![0u8; input.len() + 1024];
        let before_in = z.total_in();
        let before_out = z.total_out();
        z.compress(input, &mut buf, flush).unwrap();
        assert_eq!((z.total_in() - before_in) as usize, input.len());
        buf.truncate((z.total_out() - before_out) as usize);
        out.extend_from_slice(&buf);
        out[start..].to_vec()
    };
    for (bytes, times) in parts {
        let mut one = Crc::new();
        one.update(bytes);
        if *times == 0 {
            continue;
        }
        deflate(bytes, FlushCompress::Sync, &mut out);
        crc.combine(&one);
        if *times > 1 {
            let again = deflate(bytes, FlushCompress::Sync, &mut out);
            crc.combine(&one);
            for _ in 2..*times {
                out.extend_from_slice(&again);
                crc.combine(&one);
            }
        }
    }
    deflate(&[], FlushCompress::Finish, &mut out);
    out.extend_from_slice(&crc.sum().to_le_bytes());
    out.extend_from_slice(&crc.amount().to_le_bytes());
    out
}

fn long_name_header(size: u64) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.as_gnu_mut().unwrap().name[..13].copy_from_slice(b"././@LongLink");
    h.set_entry_type(tar::EntryType::GNULongName);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_cksum();
    h.as_bytes().to_vec()
}

fn file_header(name: &str, size: u64) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.set_path(name).unwrap();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_cksum();
    h.as_bytes().to_vec()
}

async fn upload(base: &str, slug: &str, name: &str, data: Vec<u8>) -> (u16, String) {
    let form = reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(data).file_name(name.to_owned()),
    );
    let resp = http()
        .post(format!("{base}/contexts/{slug}/import/upload"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

/// Catches name records read whole and skipped names kept whole: a
/// `.tar.gz` of about 2 MB whose GNU long-name record declares 300 MiB
/// (and holds it) is refused, and one of 1,000 entries whose 60 KiB
/// hidden names are skipped makes a task small enough to list. Peak
/// memory stays under 400 MiB, `GET /tasks` under 1 MiB, and the
/// import's report is valid JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archives_with_huge_names_cost_little_memory() {
    let server = LocalBinary::start(&[], &[]);
    let base = server.url.clone();
    let (status, _) = post_json(
        &format!("{base}/contexts"),
        json!({"slug": "n", "name": "N"}),
    )
    .await;
    assert_eq!(status, 200);

    // One long-name record of 300 MiB of 'a', then a file it would name.
    let mib = vec![b'a'; 1 << 20];
    let file = file_header("x.md", 4);
    let body = b"# X\n".repeat(128);
    let zeros = [0u8; 1024];
    let big = repeated_gz(&[
        (&long_name_header(300 << 20), 1),
        (&mib, 300),
        (&file, 1),
        (&body[..512], 1),
        (&zeros, 1),
    ]);
    assert!(big.len() < 3 << 20, "the archive is {} bytes", big.len());
    let (status, text) = upload(&base, "n", "big.tar.gz", big.clone()).await;
    assert_eq!(status, 413, "{text}");
    assert!(text.contains("name record"), "{text}");

    // 1,000 files whose 60 KiB hidden names are skipped, and one kept.
    let name = format!(".{}", "h".repeat(60 * 1024 - 1));
    let mut entry = long_name_header(name.len() as u64);
    entry.extend_from_slice(name.as_bytes());
    entry.resize(entry.len().div_ceil(512) * 512, 0);
    entry.extend_from_slice(&file_header("hidden", 0));
    let kept = [file_header("kept.md", 4), {
        let mut b = b"# K\n".to_vec();
        b.resize(512, 0);
        b
    }]
    .concat();
    let many = repeated_gz(&[(&entry, 1000), (&kept, 1), (&zeros, 1)]);
    let (status, text) = upload(&base, "n", "many.tar.gz", many.clone()).await;
    assert_eq!(status, 200, "{text}");
    let resp = http().get(format!("{base}/tasks")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let tasks = resp.bytes().await.unwrap();
    let listed: serde_json::Value = serde_json::from_slice(&tasks).unwrap();
    let import = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["workflow"] == "import")
        .unwrap_or_else(|| panic!("no import task: {listed}"))
        .clone();
    let task_id = import["id"].as_str().unwrap();
    let report = http()
        .get(format!("{base}/tasks/{task_id}/files/read/report.json"))
        .send()
        .await
        .unwrap();
    let report_status = report.status().as_u16();
    let report = report.bytes().await.unwrap();
    let (peak, now) = memory_kib(server.child.id());
    eprintln!(
        "archives of {} and {} bytes: peak {} MiB, resident {} MiB; GET /tasks {} bytes; report.json {} bytes",
        big.len(),
        many.len(),
        peak >> 10,
        now >> 10,
        tasks.len(),
        report.len()
    );
    assert!(peak < 400 << 10, "peak memory {peak} KiB");
    assert!(tasks.len() < 1 << 20, "GET /tasks is {} bytes", tasks.len());
    if report_status == 200 {
        let parsed: Result<serde_json::Value, _> = serde_json::from_slice(&report);
        assert!(parsed.is_ok(), "report.json is not JSON");
    }
    server.kill();
}

/// Catches a writer backlog without a bound: with every commit stalled
/// 20 s (failpoint `db.commit=delay`), a flood of turns from many
/// clients gets 503 `busy` with `Retry-After` once the backlog passes
/// `--max-write-backlog-mb 1`, and resident memory stays flat.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_turns_against_a_stalled_writer_is_refused_not_buffered() {
    let corpus = corpus();
    let data = TempDir::new("stalled");
    let ctx = format!("docs={}", corpus.path().display());
    let dir = data.path().to_str().unwrap();
    // Curated first, by a server without failpoints.
    LocalBinary::start(&["--data", dir, "--context", &ctx], &[]).kill();
    let server = LocalBinary::start(
        &["--data", dir, "--max-write-backlog-mb", "1"],
        &[(
            nexus_knowql::local::ENV_FAILPOINTS,
            "db.commit=delay(20000)",
        )],
    );
    let base = server.url.clone();
    let pid = server.child.id();
    // Turns wait for a commit that does not come: the client lets go
    // after a moment; the turn goes on in the server.
    let quick = reqwest::Client::builder()
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let ask = "how long does green tea steep? ".repeat(200);
    let flood = |n: usize| {
        let quick = quick.clone();
        let base = base.clone();
        let ask = ask.clone();
        async move {
            let (mut busy, mut other, mut retry_after) = (0usize, 0usize, true);
            for _ in 0..n {
                let resp = quick
                    .post(format!("{base}/query"))
                    .json(&json!({"ask": ask, "scope": ["docs"], "stream": true}))
                    .send()
                    .await;
                match resp {
                    Ok(r) if r.status() == 503 => {
                        retry_after &= r.headers().contains_key("retry-after");
                        busy += 1;
                    }
                    _ => other += 1,
                }
            }
            (busy, other, retry_after)
        }
    };
    // Warm up to the limit, then measure while 3,000 more are sent.
    let warm: Vec<_> = (0..6).map(|_| tokio::spawn(flood(50))).collect();
    let mut warm_busy = 0;
    for w in warm {
        warm_busy += w.await.unwrap().0;
    }
    assert!(warm_busy > 0, "no refusal after 300 turns");
    let (_, before) = memory_kib(pid);
    let started = Instant::now();
    let clients: Vec<_> = (0..6).map(|_| tokio::spawn(flood(500))).collect();
    let (mut busy, mut other, mut retry_after) = (0, 0, true);
    for c in clients {
        let (b, o, r) = c.await.unwrap();
        busy += b;
        other += o;
        retry_after &= r;
    }
    let (peak, after) = memory_kib(pid);
    eprintln!(
        "3,000 turns in {:?} against a stalled writer: {busy} refused 503 busy, {other} not; \
         resident {} -> {} MiB (peak {} MiB)",
        started.elapsed(),
        before >> 10,
        after >> 10,
        peak >> 10
    );
    assert!(retry_after, "a 503 without Retry-After");
    assert!(busy >= 2_900, "only {busy} of 3,000 refused");
    assert!(
        after < before + (32 << 10),
        "resident memory grew from {before} to {after} KiB"
    );
    server.kill();
}
