//! The local directory connector through the SDK's `Client` against
//! `LocalNexus`: create, list items, enable on a context, import, delete,
//! and the local OAuth flow.

use crate::support::local as local_support;
use local_support::*;
use nexus_knowql::local::LocalNexus;
use nexus_knowql::types;
use serde_json::{Value, json};

fn body<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

fn status<T>(r: Result<T, nexus_knowql::api::Error<types::Error>>) -> u16 {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.status().map(|s| s.as_u16()).unwrap(),
    }
}

fn roots() -> TempDir {
    let roots = TempDir::new("connector-roots");
    roots.write(
        "drive/handbook/intro.md",
        "# Intro\n\nThe handbook opens here.\n",
    );
    roots.write(
        "drive/handbook/policies/leave.md",
        "# Leave\n\nTwenty days of leave a year.\n",
    );
    roots.write("drive/handbook/.draft.md", "# Draft\n\nnot shared\n");
    roots.write("drive/readme.txt", "top level\n");
    roots
}

#[tokio::test]
async fn the_connector_lifecycle_runs_end_to_end() {
    let roots = roots();
    let server = LocalNexus::builder()
        .connector_root(roots.path())
        .start()
        .await
        .unwrap();
    let client = server.client().unwrap();
    let api = client.api();
    let conn = api
        .create_connector(
            "local",
            &body(json!({"api_key": "drive", "account_label": "Team drive"})),
        )
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (conn.provider.as_str(), conn.account_label.as_deref()),
        ("local", Some("Team drive"))
    );
    let all = api.list_connectors(None).await.unwrap().into_inner();
    assert_eq!(all.len(), 1);
    assert_eq!(
        api.get_connector(&conn.id).await.unwrap().into_inner().id,
        conn.id
    );

    let top = api
        .list_connector_items(&conn.id, None)
        .await
        .unwrap()
        .into_inner();
    let items: Vec<(&str, &str)> = top
        .items
        .iter()
        .map(|i| (i.id.as_str(), i.type_.as_str()))
        .collect();
    assert_eq!(items, [("handbook", "folder"), ("readme.txt", "file")]);
    let inner = api
        .list_connector_items(&conn.id, Some("handbook"))
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<&str> = inner.items.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(
        ids,
        ["handbook/intro.md", "handbook/policies"],
        "hidden files are not listed"
    );
    assert_eq!(
        status(api.list_connector_items(&conn.id, Some("../..")).await),
        404
    );
    assert_eq!(
        status(api.list_connector_items(&conn.id, Some("nope")).await),
        404
    );

    client
        .contexts()
        .create(&body(json!({"slug": "hb", "name": "Handbook"})))
        .await
        .unwrap();
    let import = json!({"connector_id": conn.id, "folder": "handbook", "path": "handbook"});
    assert_eq!(
        status(
            api.import_context_sources("hb", &body(import.clone()))
                .await
        ),
        409,
        "a connector must be enabled on the context first"
    );
    let views = api
        .list_context_connectors("hb")
        .await
        .unwrap()
        .into_inner();
    assert!(!views[0].enabled);
    let on = api
        .update_context_connector("hb", &conn.id, &body(json!({"enabled": true})))
        .await
        .unwrap()
        .into_inner();
    assert!(on.enabled);
    let trigger = api
        .import_context_sources("hb", &body(import))
        .await
        .unwrap()
        .into_inner();
    client
        .tasks()
        .wait_completed(&trigger.task_id, Default::default())
        .await
        .unwrap();
    let files = api
        .get_source_manifest("hb")
        .await
        .unwrap()
        .into_inner()
        .files;
    let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["handbook/intro.md", "handbook/policies/leave.md"]);
    let leave = client
        .sources("hb")
        .read("handbook/policies/leave.md")
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&leave).contains("Twenty days"));
    // One file by name.
    let one = json!({"connector_id": conn.id, "folder": "readme.txt", "item_type": "file"});
    let t = api
        .import_context_sources("hb", &body(one))
        .await
        .unwrap()
        .into_inner();
    client
        .tasks()
        .wait_completed(&t.task_id, Default::default())
        .await
        .unwrap();
    assert_eq!(
        api.get_source_manifest("hb")
            .await
            .unwrap()
            .into_inner()
            .files
            .len(),
        3
    );
    // Curated and queryable like any import.
    let trigger = client
        .contexts()
        .curate("hb", &Default::default())
        .await
        .unwrap();
    client
        .tasks()
        .wait_completed(&trigger.task_id, Default::default())
        .await
        .unwrap();
    let q = client
        .session(["hb"])
        .build()
        .unwrap()
        .ask("How many days of leave?")
        .send()
        .await
        .unwrap();
    assert!(
        q.answer_text().contains("Twenty days"),
        "{}",
        q.answer_text()
    );

    let off = api
        .update_context_connector("hb", &conn.id, &body(json!({"enabled": false})))
        .await
        .unwrap()
        .into_inner();
    assert!(!off.enabled);
    let gone = api.delete_connector(&conn.id).await.unwrap().into_inner();
    assert_eq!(gone.deleted, conn.id);
    assert_eq!(status(api.get_connector(&conn.id).await), 404);
    assert_eq!(status(api.delete_connector(&conn.id).await), 404);
    assert!(
        api.list_connectors(None)
            .await
            .unwrap()
            .into_inner()
            .is_empty()
    );
}

#[tokio::test]
async fn connectors_read_only_below_their_roots() {
    let roots = roots();
    let elsewhere = TempDir::new("connector-elsewhere");
    elsewhere.write("secret.md", "# Secret\n");
    let server = LocalNexus::builder()
        .connector_root(roots.path().join("drive"))
        .start()
        .await
        .unwrap();
    let client = server.client().unwrap();
    let api = client.api();
    let create = |key: String| body::<types::CreateConnectorBody>(json!({"api_key": key}));
    let outside = elsewhere.path().to_str().unwrap().to_owned();
    assert_eq!(
        status(api.create_connector("local", &create(outside)).await),
        400
    );
    assert_eq!(
        status(api.create_connector("local", &create("../".into())).await),
        400
    );
    assert_eq!(
        status(
            api.create_connector("local", &create("readme.txt".into()))
                .await
        ),
        400,
        "a file is not a directory"
    );
    assert_eq!(
        status(
            api.create_connector("box", &create("handbook".into()))
                .await
        ),
        400
    );
    #[cfg(unix)]
    {
        // A link out of a root is followed to where it leads, and refused.
        std::os::unix::fs::symlink(elsewhere.path(), roots.path().join("drive/link")).unwrap();
        assert_eq!(
            status(api.create_connector("local", &create("link".into())).await),
            400
        );
        let c = api
            .create_connector("local", &create("handbook".into()))
            .await
            .unwrap()
            .into_inner();
        std::os::unix::fs::symlink(elsewhere.path(), roots.path().join("drive/handbook/out"))
            .unwrap();
        let items = api
            .list_connector_items(&c.id, None)
            .await
            .unwrap()
            .into_inner();
        assert!(
            items.items.iter().all(|i| i.name != "out"),
            "links are not listed"
        );
        assert_eq!(
            status(api.list_connector_items(&c.id, Some("out")).await),
            404
        );
    }
    // Without roots nothing can be connected.
    let bare = LocalNexus::start().await.unwrap();
    let bare_client = bare.client().unwrap();
    let bare_api = bare_client.api();
    assert_eq!(
        status(
            bare_api
                .create_connector("local", &create("/".into()))
                .await
        ),
        400
    );
    assert_eq!(
        status(bare_api.start_connector_oauth("local", None).await),
        400
    );
}

#[tokio::test]
async fn the_local_oauth_flow_completes_without_the_network() {
    let roots = roots();
    let server = LocalNexus::builder()
        .connector_root(roots.path())
        .start()
        .await
        .unwrap();
    let client = server.client().unwrap();
    let api = client.api();
    let started = api
        .start_connector_oauth("local", None)
        .await
        .unwrap()
        .into_inner();
    let url = started.authorize_url;
    assert!(
        url.starts_with(&format!(
            "{}/connectors/oauth/local/callback?state=",
            server.base_url()
        )),
        "{url}"
    );
    // The callback (what a browser would open) makes the connector.
    let done: serde_json::Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
    let id = done["id"].as_str().unwrap();
    let conn = api.get_connector(id).await.unwrap().into_inner();
    assert_eq!(conn.provider, "local");
    let items = api
        .list_connector_items(id, None)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(items.items[0].name, "drive");
    let all = api.list_connectors(None).await.unwrap().into_inner();
    assert_eq!(all.len(), 1);
    assert_eq!(status(api.start_connector_oauth("gdrive", None).await), 400);
}
