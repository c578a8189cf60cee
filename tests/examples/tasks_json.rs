//! `nexus --json tasks` prints the tasks the API answers: the input and
//! output of an import and a curate task are the same as in the raw
//! `GET /tasks` answer.

use std::path::Path;

use crate::support::examples::nexus_ok;
use nexus_knowql::local::LocalNexus;
use serde_json::Value;

#[test]
fn nexus_json_tasks_shows_the_input_and_output_the_api_answers() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(LocalNexus::builder().start()).unwrap();
    let url = server.base_url().to_owned();
    let corpus = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/corpus"));

    nexus_ok(&url, &["create", "kb"]);
    nexus_ok(&url, &["upload", "kb", corpus.to_str().unwrap()]);
    nexus_ok(&url, &["curate", "kb", "--wait"]);

    let printed: Value = serde_json::from_str(&nexus_ok(&url, &["--json", "tasks"])).unwrap();
    let raw: Value = rt
        .block_on(async {
            reqwest::get(format!("{url}/tasks"))
                .await
                .unwrap()
                .json()
                .await
        })
        .unwrap();
    let raw = raw["items"].as_array().unwrap();
    let printed = printed.as_array().unwrap();
    assert_eq!(printed.len(), raw.len(), "{printed:?}");
    let mut workflows = Vec::new();
    for task in raw {
        let id = &task["id"];
        let shown = printed
            .iter()
            .find(|t| t["id"] == *id)
            .unwrap_or_else(|| panic!("task {id} is not printed"));
        for field in ["input", "output"] {
            assert!(
                !task[field].as_object().is_none_or(|o| o.is_empty()),
                "the API answers task {id} with an empty {field}: {task}"
            );
            assert_eq!(
                shown[field], task[field],
                "task {id} ({}): `nexus --json tasks` prints another {field}",
                task["workflow"]
            );
        }
        workflows.push(task["workflow"].as_str().unwrap().to_owned());
    }
    workflows.sort();
    workflows.dedup();
    assert_eq!(workflows, ["curate", "import"]);
}
