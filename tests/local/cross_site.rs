//! Private by default: no GET changes state (the connector OAuth start
//! included), other pages — other `localhost` ports too — may read but not
//! write, a browser's `Sec-Fetch-Site: cross-site` write is refused
//! (multipart uploads included), and login tokens outlive a restart
//! without the database holding them.

use nexus_knowql::local::LocalNexus;
use serde_json::{Value, json};

use crate::support::local::*;

async fn send(
    method: reqwest::Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> u16 {
    let mut req = http().request(method, url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    req.send().await.unwrap().status().as_u16()
}

async fn upload(url: &str, headers: &[(&str, &str)]) -> u16 {
    let mut req = http().post(format!("{url}/contexts/docs/import/upload"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.multipart(
        reqwest::multipart::Form::new().part(
            "file",
            reqwest::multipart::Part::bytes(b"# Planted\n\nfrom another page\n".to_vec())
                .file_name("planted.md"),
        ),
    )
    .send()
    .await
    .unwrap()
    .status()
    .as_u16()
}

/// Catches writes trusted from any local page (`check_write` not called,
/// or passing other ports) and a browser's cross-site write let through:
/// JSON and multipart writes from another `localhost` port or marked
/// cross-site get 403 and change nothing, while reads from those pages
/// and writes from the server's own page pass.
#[tokio::test]
async fn other_pages_may_read_but_not_write() {
    let (server, client, _dir) = seeded(LocalNexus::builder()).await;
    let url = server.base_url().to_owned();
    let own = format!("http://127.0.0.1:{}", server.addr().port());
    let other = "http://localhost:3000";
    let ctx = |slug: &str| json!({"slug": slug, "name": slug});
    let tasks_before = client.tasks().list().await.unwrap().len();
    let refused: [&[(&str, &str)]; 4] = [
        &[("origin", other)],
        &[
            ("origin", "http://127.0.0.1:5173"),
            ("sec-fetch-site", "same-site"),
        ],
        &[("sec-fetch-site", "cross-site")],
        &[("origin", "null")],
    ];
    for headers in refused {
        let post = send(
            reqwest::Method::POST,
            &format!("{url}/contexts"),
            headers,
            Some(ctx("planted")),
        )
        .await;
        assert_eq!(post, 403, "POST /contexts {headers:?}");
        assert_eq!(upload(&url, headers).await, 403, "upload {headers:?}");
        let delete = send(
            reqwest::Method::DELETE,
            &format!("{url}/contexts/docs"),
            headers,
            None,
        )
        .await;
        assert_eq!(delete, 403, "DELETE {headers:?}");
    }
    let contexts = client.contexts().list().await.unwrap();
    assert_eq!(contexts.len(), 1, "a refused write changed something");
    let tasks = client.tasks().list().await.unwrap().len();
    assert_eq!(tasks, tasks_before, "a refused upload started an import");
    // Reads from another local page still pass.
    let read = send(
        reqwest::Method::GET,
        &format!("{url}/contexts"),
        &[("origin", other), ("sec-fetch-site", "same-site")],
        None,
    )
    .await;
    assert_eq!(read, 200);
    // The server's own page writes.
    let mine = send(
        reqwest::Method::POST,
        &format!("{url}/contexts"),
        &[("origin", &own), ("sec-fetch-site", "same-origin")],
        Some(ctx("mine")),
    )
    .await;
    assert_eq!(mine, 200);
    server.shutdown().await;
}

/// Catches a connector made by `GET .../oauth/local/start` (an `<img>` on
/// any page could make one): only the callback with the one-time state
/// the start handed out makes it, once.
#[tokio::test]
async fn the_oauth_start_changes_nothing_and_its_state_works_once() {
    let roots = TempDir::new("oauth-roots");
    roots.write("drive/a.md", "# A\n");
    let server = LocalNexus::builder()
        .connector_root(roots.path())
        .start()
        .await
        .unwrap();
    let url = server.base_url().to_owned();
    let start = format!("{url}/connectors/oauth/local/start?return_to=http://127.0.0.1:9/done");
    let mut authorize = Vec::new();
    for _ in 0..3 {
        let (status, body) = get_json(&start).await;
        assert_eq!(status, 200, "{body}");
        authorize.push(body["authorize_url"].as_str().unwrap().to_owned());
    }
    let (_, listed) = get_json(&format!("{url}/connectors")).await;
    assert_eq!(listed, json!([]), "a GET made a connector");
    let callback = &authorize[0];
    assert!(
        callback.starts_with(&format!("{url}/connectors/oauth/local/callback?state=")),
        "{callback}"
    );
    // A guessed state does nothing.
    let forged = format!(
        "{url}/connectors/oauth/local/callback?state={}",
        "0".repeat(32)
    );
    assert_eq!(get_json(&forged).await.0, 400);
    // The real one completes the flow once, back to `return_to`.
    let no_redirect = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let done = no_redirect.get(callback).send().await.unwrap();
    assert_eq!(done.status(), 303);
    let location = done.headers()["location"].to_str().unwrap().to_owned();
    assert!(
        location.starts_with("http://127.0.0.1:9/done?connector_id=con_"),
        "{location}"
    );
    assert_eq!(
        no_redirect.get(callback).send().await.unwrap().status(),
        400
    );
    // A cross-site navigation cannot complete one either.
    let cross = no_redirect
        .get(&authorize[1])
        .header("sec-fetch-site", "cross-site")
        .send()
        .await
        .unwrap();
    assert_eq!(cross.status(), 403);
    let (_, listed) = get_json(&format!("{url}/connectors")).await;
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    // Another flow reuses the connector on the same root.
    let again = no_redirect.get(&authorize[2]).send().await.unwrap();
    assert_eq!(again.status(), 303);
    let id = listed[0]["id"].as_str().unwrap();
    assert!(
        location.ends_with(&format!("connector_id={id}")),
        "{location}"
    );
    assert_eq!(
        again.headers()["location"].to_str().unwrap(),
        location,
        "a second connector on the same root"
    );
    server.shutdown().await;
}

/// Catches tokens kept only in memory (a restart drops every login) or
/// saved as they are: a token from `POST /auth/login` works after a
/// SIGKILL and restart, the database does not contain it, and it stops
/// working when the server restarts with another API key.
#[tokio::test]
async fn login_tokens_outlive_a_restart_and_are_stored_hashed() {
    let data = TempDir::new("tokens");
    let dir = data.path().to_str().unwrap().to_owned();
    let server = LocalBinary::start(&["--data", &dir, "--api-key", "key-one"], &[]);
    let (status, login) = post_json(
        &format!("{}/auth/login", server.url),
        json!({"api_key": "key-one"}),
    )
    .await;
    assert_eq!(status, 200, "{login}");
    let token = login["token"].as_str().unwrap().to_owned();
    server.kill();
    let db = std::fs::read(data.path().join("state.db")).unwrap_or_default();
    let wal = std::fs::read(data.path().join("state.db-wal")).unwrap_or_default();
    let secret = token.trim_start_matches("nlt_").as_bytes();
    for (name, bytes) in [("state.db", &db), ("state.db-wal", &wal)] {
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret),
            "{name} holds the token"
        );
    }
    let bearer = |url: &str| {
        http()
            .get(format!("{url}/contexts"))
            .bearer_auth(&token)
            .send()
    };
    let server = LocalBinary::start(&["--data", &dir, "--api-key", "key-one"], &[]);
    assert_eq!(bearer(&server.url).await.unwrap().status(), 200);
    server.kill();
    let server = LocalBinary::start(&["--data", &dir, "--api-key", "key-two"], &[]);
    assert_eq!(bearer(&server.url).await.unwrap().status(), 401);
    server.kill();
}

/// Catches tokens that outlive their key: a token from a login under
/// `key-one` stops working when the server restarts with `key-two`, and
/// stays refused when it restarts with `key-one` again (the switch revoked
/// it on disk); a login after the switch back works across a restart.
#[tokio::test]
async fn switching_the_key_away_and_back_does_not_bring_back_its_tokens() {
    let data = TempDir::new("key-switch");
    let dir = data.path().to_str().unwrap().to_owned();
    let login = |url: String, key: &'static str| async move {
        let (status, body) = post_json(&format!("{url}/auth/login"), json!({"api_key": key})).await;
        assert_eq!(status, 200, "{body}");
        body["token"].as_str().unwrap().to_owned()
    };
    let status = |url: String, token: String| async move {
        http()
            .get(format!("{url}/contexts"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    let server = LocalBinary::start(&["--data", &dir, "--api-key", "key-one"], &[]);
    let old = login(server.url.clone(), "key-one").await;
    assert_eq!(status(server.url.clone(), old.clone()).await, 200);
    server.kill();
    let server = LocalBinary::start(&["--data", &dir, "--api-key", "key-two"], &[]);
    assert_eq!(status(server.url.clone(), old.clone()).await, 401);
    server.kill();
    let server = LocalBinary::start(&["--data", &dir, "--api-key", "key-one"], &[]);
    assert_eq!(
        status(server.url.clone(), old.clone()).await,
        401,
        "a token of the old key came back with it"
    );
    let new = login(server.url.clone(), "key-one").await;
    server.kill();
    let server = LocalBinary::start(&["--data", &dir, "--api-key", "key-one"], &[]);
    assert_eq!(status(server.url.clone(), new).await, 200);
    assert_eq!(status(server.url.clone(), old).await, 401);
    server.kill();
}
