//! Conformance of the local Nexus's project, stats, manifest, fork,
//! curation-ledger, workflow, task-file and connector operations with
//! `openapi/nexus_2026-07.oas.yaml`: each is called and its JSON answer
//! (success and errors) is checked against the spec's schema for its
//! status. `conformance` checks the other operations.

use std::collections::BTreeSet;

use crate::support::local as local_support;
use crate::support::openapi;
use local_support::*;
use nexus_knowql::local::LocalNexus;
use openapi::*;
use serde_json::{Value, json};

/// The operations checked here.
const CHECKED: &[&str] = &[
    "get_project",
    "get_project_task_stats",
    "list_manifest_templates",
    "get_context_manifest",
    "get_context_task_stats",
    "get_curation_ledger",
    "get_source_stats",
    "get_source_manifest",
    "get_knowledge_stats",
    "get_task_stats",
    "list_task_files",
    "list_task_files_by_path",
    "get_task_file_metadata",
    "read_task_file",
    "delete_task_file",
    "fork_context",
    "explore_context",
    "profile_context",
    "optimize_context",
    "create_connector",
    "list_connectors",
    "get_connector",
    "list_connector_items",
    "start_connector_oauth",
    "list_context_connectors",
    "update_context_connector",
    "import_context_sources",
    "delete_connector",
    "delete_curated_sources",
    "delete_source_file",
];

struct Checker {
    spec: Value,
    base: String,
    http: reqwest::Client,
    seen: BTreeSet<String>,
}

impl Checker {
    /// Sends a request and checks its answer; returns the JSON body.
    async fn call(
        &mut self,
        op: &str,
        method: &str,
        template: &str,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method.parse().unwrap(), format!("{}{path}", self.base));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let value = conforms(&self.spec, template, method, resp).await;
        self.seen.insert(op.to_owned());
        (status, value)
    }
}

async fn wait(client: &nexus_knowql::Client, task_id: &str) {
    client
        .tasks()
        .wait_completed(task_id, Default::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn new_operations_match_the_spec() {
    let roots = TempDir::new("roots");
    roots.write("drive/manual/intro.md", "# Intro\n\nThe drive manual.\n");
    roots.write("drive/manual/more/deep.txt", "deep text\n");
    let (server, client, dir) = seeded(LocalNexus::builder().connector_root(roots.path())).await;
    let mut c = Checker {
        spec: spec(),
        base: server.base_url().to_owned(),
        http: reqwest::Client::new(),
        seen: BTreeSet::new(),
    };

    let (s, project) = c
        .call("get_project", "GET", "/project", "/project", None)
        .await;
    assert_eq!((s, project["id"].as_str()), (200, Some("local")));
    let (_, stats) = c
        .call("get_project_task_stats", "GET", "/stats", "/stats", None)
        .await;
    assert!(stats["tasks_total"].as_i64().unwrap() >= 1);
    let (_, templates) = c
        .call(
            "list_manifest_templates",
            "GET",
            "/manifest/templates",
            "/manifest/templates",
            None,
        )
        .await;
    assert!(!templates["templates"].as_array().unwrap().is_empty());
    c.call(
        "get_context_manifest",
        "GET",
        "/contexts/{slug}/manifest",
        "/contexts/docs/manifest",
        None,
    )
    .await;
    c.call(
        "get_context_manifest",
        "GET",
        "/contexts/{slug}/manifest",
        "/contexts/nope/manifest",
        None,
    )
    .await;
    c.call(
        "get_context_task_stats",
        "GET",
        "/contexts/{slug}/tasks/stats",
        "/contexts/docs/tasks/stats",
        None,
    )
    .await;
    let (_, ledger) = c
        .call(
            "get_curation_ledger",
            "GET",
            "/contexts/{slug}/curate",
            "/contexts/docs/curate",
            None,
        )
        .await;
    assert_eq!(ledger["manifest"].as_object().unwrap().len(), 3);
    c.call(
        "get_source_stats",
        "GET",
        "/contexts/{slug}/source/stats",
        "/contexts/docs/source/stats",
        None,
    )
    .await;
    c.call(
        "get_source_manifest",
        "GET",
        "/contexts/{slug}/source/manifest",
        "/contexts/docs/source/manifest",
        None,
    )
    .await;
    c.call(
        "get_knowledge_stats",
        "GET",
        "/contexts/{slug}/knowledge/stats",
        "/contexts/docs/knowledge/stats",
        None,
    )
    .await;

    // Task stats and files, on the seed's curate task.
    let tasks = client
        .api()
        .list_tasks(Some("docs"), None, None, None, None, None, None)
        .await
        .unwrap()
        .into_inner();
    let task = tasks.items[0].id.clone();
    c.call(
        "get_task_stats",
        "GET",
        "/tasks/{id}/stats",
        &format!("/tasks/{task}/stats"),
        None,
    )
    .await;
    c.call(
        "get_task_stats",
        "GET",
        "/tasks/{id}/stats",
        "/tasks/nope/stats",
        None,
    )
    .await;
    let (_, files) = c
        .call(
            "list_task_files",
            "GET",
            "/tasks/{id}/files/list",
            &format!("/tasks/{task}/files/list"),
            None,
        )
        .await;
    assert_eq!(files["total"], 2, "{files:#}");
    c.call(
        "list_task_files_by_path",
        "GET",
        "/tasks/{id}/files/list/{path}",
        &format!("/tasks/{task}/files/list/report.json"),
        None,
    )
    .await;
    let (s, meta) = c
        .call(
            "get_task_file_metadata",
            "GET",
            "/tasks/{id}/files/metadata/{path}",
            &format!("/tasks/{task}/files/metadata/report.json"),
            None,
        )
        .await;
    assert_eq!((s, meta["kind"].as_str()), (200, Some("file")));
    let (s, _) = c
        .call(
            "read_task_file",
            "GET",
            "/tasks/{id}/files/read/{path}",
            &format!("/tasks/{task}/files/read/report.json"),
            None,
        )
        .await;
    assert_eq!(s, 200);
    c.call(
        "read_task_file",
        "GET",
        "/tasks/{id}/files/read/{path}",
        &format!("/tasks/{task}/files/read/nope.json"),
        None,
    )
    .await;
    let (s, _) = c
        .call(
            "delete_task_file",
            "DELETE",
            "/tasks/{id}/files/delete/{path}",
            &format!("/tasks/{task}/files/delete/curated.tsv"),
            None,
        )
        .await;
    assert_eq!(s, 200);

    // Fork and the workflows.
    let (s, _) = c
        .call(
            "fork_context",
            "POST",
            "/contexts/{slug}/fork",
            "/contexts/docs/fork",
            Some(json!({"target_slug": "docs2"})),
        )
        .await;
    assert_eq!(s, 200);
    let (s, _) = c
        .call(
            "fork_context",
            "POST",
            "/contexts/{slug}/fork",
            "/contexts/docs/fork",
            Some(json!({"target_slug": "docs2"})),
        )
        .await;
    assert_eq!(s, 409);
    for (op, path) in [
        ("explore_context", "explore"),
        ("profile_context", "profile"),
        ("optimize_context", "optimize"),
    ] {
        let (s, trigger) = c
            .call(
                op,
                "POST",
                &format!("/contexts/{{slug}}/{path}"),
                &format!("/contexts/docs/{path}"),
                Some(json!({})),
            )
            .await;
        assert_eq!(s, 200, "{op}");
        wait(&client, trigger["task_id"].as_str().unwrap()).await;
    }
    let (s, _) = c
        .call(
            "explore_context",
            "POST",
            "/contexts/{slug}/explore",
            "/contexts/docs2/explore",
            Some(json!({})),
        )
        .await;
    assert_eq!(s, 409, "a fork is not curated yet");

    // Connectors.
    let drive = roots.path().join("drive");
    let (s, conn) = c
        .call(
            "create_connector",
            "POST",
            "/connectors/keys/{provider}",
            "/connectors/keys/local",
            Some(json!({"api_key": drive.to_str().unwrap(), "account_label": "drive"})),
        )
        .await;
    assert_eq!(s, 200);
    let id = conn["id"].as_str().unwrap().to_owned();
    let (s, _) = c
        .call(
            "create_connector",
            "POST",
            "/connectors/keys/{provider}",
            "/connectors/keys/box",
            Some(json!({"api_key": "k"})),
        )
        .await;
    assert_eq!(s, 400);
    c.call("list_connectors", "GET", "/connectors", "/connectors", None)
        .await;
    c.call(
        "get_connector",
        "GET",
        "/connectors/{id}",
        &format!("/connectors/{id}"),
        None,
    )
    .await;
    let (_, items) = c
        .call(
            "list_connector_items",
            "GET",
            "/connectors/{id}/items",
            &format!("/connectors/{id}/items?folder=manual"),
            None,
        )
        .await;
    assert_eq!(items["items"].as_array().unwrap().len(), 2, "{items:#}");
    let (_, oauth) = c
        .call(
            "start_connector_oauth",
            "GET",
            "/connectors/oauth/{provider}/start",
            "/connectors/oauth/local/start",
            None,
        )
        .await;
    assert!(
        oauth["authorize_url"]
            .as_str()
            .unwrap()
            .contains("/connectors/oauth/local/callback?state=")
    );
    c.call(
        "list_context_connectors",
        "GET",
        "/contexts/{slug}/connectors",
        "/contexts/docs/connectors",
        None,
    )
    .await;
    let (s, _) = c
        .call(
            "import_context_sources",
            "POST",
            "/contexts/{slug}/import",
            "/contexts/docs/import",
            Some(json!({"connector_id": id})),
        )
        .await;
    assert_eq!(s, 409, "not enabled yet");
    let (_, view) = c
        .call(
            "update_context_connector",
            "PUT",
            "/contexts/{slug}/connectors/{connector_id}",
            &format!("/contexts/docs/connectors/{id}"),
            Some(json!({"enabled": true})),
        )
        .await;
    assert_eq!(view["enabled"], true);
    let (s, trigger) = c
        .call(
            "import_context_sources",
            "POST",
            "/contexts/{slug}/import",
            "/contexts/docs/import",
            Some(json!({"connector_id": id, "folder": "manual", "path": "drive"})),
        )
        .await;
    assert_eq!(s, 200);
    wait(&client, trigger["task_id"].as_str().unwrap()).await;
    let (s, _) = c
        .call(
            "delete_connector",
            "DELETE",
            "/connectors/{id}",
            &format!("/connectors/{id}"),
            None,
        )
        .await;
    assert_eq!(s, 200);
    let (s, _) = c
        .call(
            "get_connector",
            "GET",
            "/connectors/{id}",
            &format!("/connectors/{id}"),
            None,
        )
        .await;
    assert_eq!(s, 404);

    // Removing sources.
    let (s, _) = c
        .call(
            "delete_curated_sources",
            "POST",
            "/contexts/{slug}/curate/delete-sources",
            "/contexts/docs/curate/delete-sources",
            Some(json!({"sources": ["notes.txt"]})),
        )
        .await;
    assert_eq!(s, 200);
    let (s, del) = c
        .call(
            "delete_source_file",
            "DELETE",
            "/contexts/{slug}/source/delete/{path}",
            "/contexts/docs/source/delete/drive/intro.md",
            None,
        )
        .await;
    assert_eq!((s, &del["deleted"]), (200, &json!(true)));
    let (s, _) = c
        .call(
            "delete_source_file",
            "DELETE",
            "/contexts/{slug}/source/delete/{path}",
            "/contexts/docs/source/delete/drive/intro.md",
            None,
        )
        .await;
    assert_eq!(s, 404);

    let expected: BTreeSet<String> = CHECKED.iter().map(|s| (*s).to_owned()).collect();
    assert_eq!(c.seen, expected, "every operation listed was checked");
    drop(dir);
}
