//! The local Nexus on a developer's machine: foreign `Host`/`Origin`
//! refused everywhere, unguessable bearer tokens, turns that survive their
//! request, bounded uploads.

use std::collections::HashSet;
use std::time::Duration;

use crate::support::local::*;
use crate::support::wait::{until, until_some};
use nexus_knowql::local::LocalNexus;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

/// Every route of the server, with sample parameters (`docs` exists).
const ROUTES: &[(&str, &str)] = &[
    ("POST", "/auth/login"),
    ("GET", "/auth"),
    ("GET", "/contexts"),
    ("POST", "/contexts"),
    ("GET", "/contexts/docs"),
    ("PUT", "/contexts/docs"),
    ("DELETE", "/contexts/docs"),
    ("POST", "/contexts/docs/import/upload"),
    ("GET", "/contexts/docs/source/list"),
    ("GET", "/contexts/docs/source/list/guide"),
    ("GET", "/contexts/docs/source/read/notes.txt"),
    ("POST", "/contexts/docs/curate"),
    ("GET", "/contexts/docs/curate"),
    ("GET", "/contexts/docs/knowledge/list"),
    ("GET", "/contexts/docs/knowledge/list/chunks"),
    ("GET", "/contexts/docs/knowledge/read/chunks/notes.txt.md"),
    ("GET", "/tasks"),
    ("GET", "/tasks/tsk_x"),
    ("DELETE", "/tasks/tsk_x"),
    ("GET", "/models"),
    ("POST", "/query"),
    ("GET", "/queries/qry_x"),
    ("POST", "/queries/qry_x/cancel"),
    ("GET", "/queries/qry_x/events"),
    ("GET", "/queries/qry_x/trace"),
    ("POST", "/queries/qry_x/feedback"),
    ("GET", "/sessions"),
    ("GET", "/sessions/ses_x"),
    ("DELETE", "/sessions/ses_x"),
    ("GET", "/project"),
    ("GET", "/stats"),
    ("GET", "/manifest/templates"),
    ("GET", "/connectors"),
    ("GET", "/connectors/c"),
    ("DELETE", "/connectors/c"),
    ("GET", "/connectors/c/items"),
    ("GET", "/connectors/oauth/p/start"),
    ("POST", "/connectors/keys/p"),
    ("GET", "/contexts/docs/connectors"),
    ("PUT", "/contexts/docs/connectors/c"),
    ("POST", "/contexts/docs/fork"),
    ("GET", "/contexts/docs/manifest"),
    ("GET", "/contexts/docs/tasks/stats"),
    ("POST", "/contexts/docs/curate/delete-sources"),
    ("POST", "/contexts/docs/optimize"),
    ("POST", "/contexts/docs/explore"),
    ("POST", "/contexts/docs/profile"),
    ("POST", "/contexts/docs/import"),
    ("GET", "/contexts/docs/source/stats"),
    ("GET", "/contexts/docs/source/manifest"),
    ("DELETE", "/contexts/docs/source/delete/notes.txt"),
    ("GET", "/contexts/docs/knowledge/stats"),
    ("GET", "/tasks/t/stats"),
    ("GET", "/tasks/t/files/read/x"),
    ("GET", "/tasks/t/files/metadata/x"),
    ("GET", "/tasks/t/files/list"),
    ("GET", "/tasks/t/files/list/x"),
    ("DELETE", "/tasks/t/files/delete/x"),
    ("GET", "/no/such/route"),
];

/// A body that would succeed if the request were accepted.
fn body_for(method: &str, path: &str) -> Option<reqwest::Body> {
    let json = match (method, path) {
        ("POST", "/contexts") => json!({"slug": "evil", "name": "Evil"}),
        ("PUT", "/contexts/docs") => json!({"name": "owned"}),
        ("POST", "/query") => json!({"ask": "lighthouse", "scope": ["docs"]}),
        ("POST", "/auth/login") => json!({}),
        _ => return None,
    };
    Some(json.to_string().into())
}

async fn send(
    url: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (reqwest::StatusCode, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut req = reqwest::Client::new().request(method.clone(), format!("{url}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if path.ends_with("/import/upload") {
        let form = reqwest::multipart::Form::new().part(
            "file",
            reqwest::multipart::Part::bytes(b"# Pwned\n\nplanted".to_vec()).file_name("pwned.md"),
        );
        req = req.multipart(form);
    } else if let Some(body) = body_for(method.as_str(), path) {
        req = req.header("content-type", "application/json").body(body);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    let body = resp.json::<Value>().await.unwrap_or(Value::Null);
    (status, body)
}

#[tokio::test]
async fn a_foreign_host_or_origin_is_refused_on_every_route_and_changes_nothing() {
    let (server, client, _dir) = seeded(LocalNexus::builder()).await;
    let url = server.base_url().to_owned();
    let port = server.addr().port().to_string();
    let evil_host = format!("evil.example:{port}");
    let tasks_before = client.tasks().list().await.unwrap().len();
    for (method, path) in ROUTES {
        for headers in [
            vec![("host", evil_host.as_str())],
            vec![("host", "attacker.test")],
            vec![("origin", "http://evil.example")],
            vec![("origin", "null")],
            vec![("origin", "http://localhost.evil.example:80")],
        ] {
            let (status, body) = send(&url, method, path, &headers).await;
            assert_eq!(status, 403, "{method} {path} with {headers:?}: {body}");
            let message = body["message"].as_str().unwrap_or("");
            assert!(
                message.contains("not allowed"),
                "{method} {path}: enveloped refusal expected, got {body}"
            );
        }
    }
    // Nothing the refused requests asked for happened.
    let ctx = client.contexts().get("docs").await.unwrap();
    assert_eq!(ctx.name, "docs");
    assert!(
        client
            .contexts()
            .get("evil")
            .await
            .unwrap_err()
            .is_not_found()
    );
    let listed = client.sources("docs").list().await.unwrap();
    assert!(listed.iter().all(|e| e.name != "uploads"));
    assert_eq!(client.tasks().list().await.unwrap().len(), tasks_before);
    assert!(client.sessions().list().await.unwrap().is_empty());
    server.shutdown().await;
}

#[tokio::test]
async fn local_pages_and_allowed_hosts_and_origins_pass() {
    let server = LocalNexus::builder()
        .allow_hosts(["nexus.internal"])
        .allow_origins(["https://app.example:8443", "http://tool.example:*"])
        .start()
        .await
        .unwrap();
    let url = server.base_url().to_owned();
    let port = server.addr().port().to_string();
    let local_host = format!("localhost:{port}");
    for headers in [
        vec![],
        vec![("origin", "http://localhost:3000")],
        vec![("origin", "http://127.0.0.1:5173")],
        vec![("host", local_host.as_str())],
        vec![("host", "nexus.internal")],
        vec![("origin", "https://app.example:8443")],
        vec![("origin", "http://tool.example:9999")],
    ] {
        let (status, body) = send(&url, "GET", "/models", &headers).await;
        assert_eq!(status, 200, "{headers:?}: {body}");
    }
    let (status, _) = send(
        &url,
        "GET",
        "/models",
        &[("origin", "https://app.example:443")],
    )
    .await;
    assert_eq!(status, 403);
    server.shutdown().await;
}

#[tokio::test]
async fn tokens_are_128_bit_random_unique_and_accepted_case_insensitively() {
    let server = LocalNexus::builder().api_key("k").start().await.unwrap();
    let url = server.base_url().to_owned();
    let http = reqwest::Client::new();
    let mut seen = HashSet::new();
    for _ in 0..10_000 {
        let resp: Value = http
            .post(format!("{url}/auth/login"))
            .json(&json!({"api_key": "k"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let token = resp["token"].as_str().unwrap().to_owned();
        let hex = token.strip_prefix("nlt_").expect("nlt_ prefix");
        assert_eq!(hex.len(), 32, "{token}");
        assert!(
            hex.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{token}"
        );
        assert!(seen.insert(token), "a token was issued twice");
    }
    // Random, not merely unique: over 10,000 tokens every one of the 128
    // bits is set about half the time (a counter or a timestamp leaves most
    // bits constant; 42%..58% is more than 15 standard deviations wide).
    let mut ones = [0u32; 128];
    for token in &seen {
        let hex = &token[4..];
        for (i, ones) in ones.iter_mut().enumerate() {
            let nibble = u32::from_str_radix(&hex[i / 4..i / 4 + 1], 16).unwrap();
            *ones += (nibble >> (3 - i % 4)) & 1;
        }
    }
    for (bit, &n) in ones.iter().enumerate() {
        assert!(
            (4_200..=5_800).contains(&n),
            "bit {bit} set in {n} of 10000 tokens"
        );
    }
    // The first and the last tokens both work, whatever the scheme's case.
    let mut tokens: Vec<_> = seen.into_iter().collect();
    tokens.sort();
    for (scheme, token) in [
        ("Bearer", &tokens[0]),
        ("bearer", &tokens[1]),
        ("BEARER", &tokens[tokens.len() - 1]),
    ] {
        let status = http
            .get(format!("{url}/models"))
            .header("authorization", format!("{scheme} {token}"))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 200, "{scheme} {token}");
    }
    // A token differing in one digit, a truncated one and the old format fail.
    let t = &tokens[0];
    let flipped = format!(
        "{}{}",
        &t[..t.len() - 1],
        if t.ends_with('0') { '1' } else { '0' }
    );
    for forged in [
        flipped.as_str(),
        &t[..t.len() - 2],
        "nlt_01a22e4c7465000003",
        "",
    ] {
        let status = http
            .get(format!("{url}/models"))
            .header("authorization", format!("Bearer {forged}"))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 401, "{forged:?}");
    }
    server.shutdown().await;
}

/// Sends `POST /query` on a raw connection and closes it at once, without
/// reading anything.
async fn post_and_disconnect(addr: std::net::SocketAddr, body: Value) {
    let body = body.to_string();
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /api/query HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(body.as_bytes()).await.unwrap();
    tcp.flush().await.unwrap();
    drop(tcp);
}

#[tokio::test]
async fn a_client_that_disconnects_after_post_query_never_leaves_its_session_stuck() {
    let data = TempDir::new("disconnect");
    let (server, client, _dir) = seeded(
        LocalNexus::builder()
            .data_dir(data.path())
            .frame_delay(Duration::from_millis(20)),
    )
    .await;
    let api = client.api();
    let first = api
        .query(&request(
            json!({"ask": "lighthouse ships", "scope": ["docs"]}),
        ))
        .await
        .unwrap()
        .into_inner();
    let session = first.session_id.clone();
    for stream in [true, false] {
        post_and_disconnect(
            server.addr(),
            json!({"ask": "green tea", "session_id": session, "stream": stream}),
        )
        .await;
        // The dropped turn runs to its end; then the session takes a new one.
        let next = until_some(Duration::from_secs(20), "the session free", async || {
            let resp = reqwest::Client::new()
                .post(format!("{}/query", server.base_url()))
                .json(&json!({"ask": "black tea", "session_id": session}))
                .send()
                .await
                .unwrap();
            match resp.status().as_u16() {
                200 => Some(resp.json::<nexus_knowql::types::Query>().await.unwrap()),
                409 => None,
                other => panic!("the session stayed busy (stream={stream}): {other}"),
            }
        })
        .await;
        assert_eq!(next.status, "completed");
        assert!(next.answer_text().contains("four minutes"), "{next:?}");
        // The abandoned turn ended and its event log is closed.
        let s = api.get_session(&session).await.unwrap().into_inner();
        let abandoned = s
            .queries
            .iter()
            .find(|q| {
                q.input
                    .first()
                    .is_some_and(|i| i.content == "green tea" && q.id != next.id)
                    && q.status != "in_progress"
            })
            .expect("the abandoned turn is recorded");
        assert_eq!(abandoned.status, "completed");
        let frames = read_frames(get_events(server.base_url(), &abandoned.id, None).await)
            .await
            .expect("the log of the abandoned turn is closed");
        assert_eq!(frames.last().unwrap().event, "query");
    }
    server.shutdown().await;
}

async fn upload_raw(url: &str, slug: &str, name: &str, data: Vec<u8>) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{url}/contexts/{slug}/import/upload"))
        .multipart(reqwest::multipart::Form::new().part(
            "file",
            reqwest::multipart::Part::bytes(data).file_name(name.to_owned()),
        ))
        .send()
        .await
        .unwrap()
}

/// Every file below `dir` with its contents, staging excluded.
fn tree(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
            // The database's files change on an idle checkpoint, with the
            // same rows: what the rows say is checked through the API.
            if rel.starts_with("staging") || rel == ".lock" || rel.starts_with("state.db") {
                continue;
            }
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

fn zip_of(name: &str, body: &[u8]) -> Vec<u8> {
    let mut zw = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    zw.start_file(name, zip::write::SimpleFileOptions::default())
        .unwrap();
    std::io::Write::write_all(&mut zw, body).unwrap();
    zw.finish().unwrap().into_inner()
}

#[tokio::test]
async fn a_zip_bomb_and_an_oversized_upload_are_refused_with_nothing_changed_on_disk() {
    let data = TempDir::new("bomb");
    let (server, client, _dir) = seeded(
        LocalNexus::builder()
            .data_dir(data.path())
            .upload_limit(64 * 1024)
            .context_bytes_limit(64 << 20),
    )
    .await;
    let url = server.base_url().to_owned();
    let before = tree(data.path());
    let sources_before = client.contexts().get("docs").await.unwrap();

    // 32 MiB of zeros in a zip of a few tens of KiB.
    let bomb = zip_of("zeros.md", &vec![0u8; 32 << 20]);
    assert!(bomb.len() < 64 * 1024, "{}", bomb.len());
    let resp = upload_raw(&url, "docs", "bomb.zip", bomb).await;
    assert_eq!(resp.status(), 413);
    let body: Value = resp.json().await.unwrap();
    assert!(body["message"].as_str().unwrap().contains("bomb"), "{body}");

    let resp = upload_raw(&url, "docs", "big.md", vec![b'x'; 65 * 1024]).await;
    assert_eq!(resp.status(), 413);

    // An archive within the upload limit that would overflow the context.
    let tight = TempDir::new("tight");
    let (small, small_client, _d) = seeded(
        LocalNexus::builder()
            .data_dir(tight.path())
            .context_bytes_limit(2048),
    )
    .await;
    let tight_before = tree(tight.path());
    let resp = upload_raw(small.base_url(), "docs", "more.md", vec![b'y'; 1900]).await;
    assert_eq!(resp.status(), 413);
    assert_eq!(tree(tight.path()), tight_before);
    small.shutdown().await;
    drop(small_client);

    assert_eq!(tree(data.path()), before, "the data directory changed");
    let after = client.contexts().get("docs").await.unwrap();
    assert_eq!(
        after.last_source_import_at,
        sources_before.last_source_import_at
    );
    // Staging is cleaned up.
    let staging = data.path().join("staging");
    until(Duration::from_secs(5), "staging cleaned", async || {
        !std::fs::read_dir(&staging).is_ok_and(|mut d| d.next().is_some())
    })
    .await;
    // A fitting upload still works.
    let resp = upload_raw(&url, "docs", "ok.md", b"# Ok\n\nfine".to_vec()).await;
    assert_eq!(resp.status(), 200);
    let read = client.sources("docs").read("uploads/ok.md").await.unwrap();
    assert_eq!(read.as_ref(), b"# Ok\n\nfine");
    server.shutdown().await;
}

#[tokio::test]
async fn unsafe_upload_paths_are_refused() {
    let (server, _client, _dir) = seeded(LocalNexus::builder()).await;
    let url = server.base_url().to_owned();
    for name in ["CON", "c:evil.md", "a:b.md", "nul.txt", "x.md."] {
        let resp = upload_raw(&url, "docs", name, b"x".to_vec()).await;
        assert_eq!(resp.status(), 400, "{name}");
    }
    for path in ["C:/x", "..", "a/../../b", "d:stream"] {
        let resp = reqwest::Client::new()
            .post(format!("{url}/contexts/docs/import/upload?path={path}"))
            .multipart(reqwest::multipart::Form::new().part(
                "file",
                reqwest::multipart::Part::bytes(b"x".to_vec()).file_name("a.md"),
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400, "{path}");
    }
    server.shutdown().await;
}

#[tokio::test]
async fn a_curation_whose_context_is_deleted_ends_its_task() {
    let (server, client, dir) =
        seeded(LocalNexus::builder().frame_delay(Duration::from_millis(400))).await;
    let req: nexus_knowql::types::CreateContextRequest =
        serde_json::from_value(json!({"slug": "gone", "name": "Gone"})).unwrap();
    client.contexts().create(&req).await.unwrap();
    client
        .sources("gone")
        .import_dir(dir.path(), |_| {})
        .await
        .unwrap();
    let t = client
        .contexts()
        .curate("gone", &Default::default())
        .await
        .unwrap();
    client.contexts().delete("gone").await.unwrap();
    let task = tokio::time::timeout(
        Duration::from_secs(20),
        client.tasks().wait(&t.task_id, Default::default()),
    )
    .await
    .expect("the task ended")
    .unwrap();
    assert!(
        matches!(task.state.as_str(), "cancelled" | "failed"),
        "{}",
        task.state.as_str()
    );
    server.shutdown().await;
}

#[tokio::test]
async fn an_import_cancelled_after_it_applied_reports_completed() {
    let (server, client, _dir) =
        seeded(LocalNexus::builder().frame_delay(Duration::from_millis(400))).await;
    let url = server.base_url().to_owned();
    // The upload is acknowledged once its files are in place; the task then
    // lingers (injected delay) but can no longer be undone.
    let resp = upload_raw(&url, "docs", "late.md", b"# Late\n\nkept".to_vec()).await;
    assert_eq!(resp.status(), 200);
    let trigger: Value = resp.json().await.unwrap();
    let task_id = trigger["task_id"].as_str().unwrap().to_owned();
    client.tasks().cancel(&task_id, None).await.unwrap();
    let task = client
        .tasks()
        .wait(&task_id, Default::default())
        .await
        .unwrap();
    assert_eq!(task.state.as_str(), "completed");
    let read = client
        .sources("docs")
        .read("uploads/late.md")
        .await
        .unwrap();
    assert_eq!(read.as_ref(), b"# Late\n\nkept");
    server.shutdown().await;
}
