//! `list()` returns every item across the API's pages; `pages()` stops when
//! the caller does; a server that repeats a page or a cursor ends the
//! listing with an error instead of a loop.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use nexus_knowql::{Client, Error, RetryPolicy};
use serde_json::json;
use wiremock::matchers::{method, path, path_regex};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

fn client(server: &MockServer) -> Client {
    Client::builder()
        .base_url(format!("{}/api", server.uri()))
        .api_key("pcsk_pages")
        .retry(RetryPolicy::never())
        .build()
        .unwrap()
}

fn query(r: &Request) -> HashMap<String, String> {
    r.url.query_pairs().into_owned().collect()
}

fn num(q: &HashMap<String, String>, key: &str, default: u64) -> u64 {
    q.get(key).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn task(i: usize) -> serde_json::Value {
    json!({
        "id": format!("task_{i:04}"), "workflow": "import", "state": "completed",
        "context_id": "ctx_1", "created_at": "2026-07-01T10:00:00Z", "created_by": "me",
        "project_id": "p", "input": {}, "steps": [], "tokens_prompt": 0,
        "tokens_completion": 0, "runtime_seconds": 1
    })
}

/// `GET /tasks` over `n` tasks, paged by `page` (or `offset`) and `limit`.
struct TaskPages {
    n: usize,
    calls: Arc<AtomicUsize>,
}

impl Respond for TaskPages {
    fn respond(&self, r: &Request) -> ResponseTemplate {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let q = query(r);
        let limit = num(&q, "limit", 30);
        let page = num(&q, "page", 1).max(1);
        let offset = q
            .get("offset")
            .and_then(|v| v.parse().ok())
            .unwrap_or((page - 1) * limit);
        let items: Vec<_> = (0..self.n)
            .skip(offset as usize)
            .take(limit as usize)
            .map(task)
            .collect();
        let pages = (self.n as u64).div_ceil(limit).max(1);
        ResponseTemplate::new(200).set_body_json(json!({
            "items": items, "total": self.n, "limit": limit, "offset": offset,
            "page": page, "pages": pages
        }))
    }
}

#[tokio::test]
async fn tasks_list_returns_every_item_across_pages() {
    let server = MockServer::start().await;
    let calls = Arc::new(AtomicUsize::new(0));
    Mock::given(method("GET"))
        .and(path("/api/tasks"))
        .respond_with(TaskPages {
            n: 237,
            calls: calls.clone(),
        })
        .mount(&server)
        .await;
    let c = client(&server);
    let all = c.tasks().list().page_size(50).await.unwrap();
    assert_eq!(all.len(), 237);
    let ids: Vec<_> = all.iter().map(|t| t.id.clone()).collect();
    let expected: Vec<_> = (0..237).map(|i| format!("task_{i:04}")).collect();
    assert_eq!(ids, expected);
    assert_eq!(calls.load(Ordering::SeqCst), 5);

    // The default page size works as well.
    assert_eq!(c.tasks().list().await.unwrap().len(), 237);
}

#[tokio::test]
async fn task_filters_are_sent_as_query_parameters() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/tasks"))
        .respond_with(TaskPages {
            n: 3,
            calls: Arc::default(),
        })
        .mount(&server)
        .await;
    client(&server)
        .tasks()
        .list()
        .context("docs")
        .state("running")
        .workflow("curate")
        .search("abc")
        .await
        .unwrap();
    let got = server.received_requests().await.unwrap();
    let q = query(&got[0]);
    assert_eq!(q["context"], "docs");
    assert_eq!(q["state"], "running");
    assert_eq!(q["workflow"], "curate");
    assert_eq!(q["q"], "abc");
    assert_eq!(q["page"], "1");
}

#[tokio::test]
async fn pages_stop_when_the_caller_stops() {
    let server = MockServer::start().await;
    let calls = Arc::new(AtomicUsize::new(0));
    Mock::given(method("GET"))
        .and(path("/api/tasks"))
        .respond_with(TaskPages {
            n: 1000,
            calls: calls.clone(),
        })
        .mount(&server)
        .await;
    let c = client(&server);
    let mut pages = c.tasks().list().page_size(10).pages();
    let first = pages.next().await.unwrap().unwrap();
    assert_eq!(first.items.len(), 10);
    assert_eq!(first.total, Some(1000));
    assert!(first.has_more);
    let second = pages.next().await.unwrap().unwrap();
    assert_eq!(second.items[0].id, "task_0010");
    assert_eq!(second.offset, 10);
    drop(pages);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn items_stream_one_by_one_and_fetch_a_page_only_when_reached() {
    let server = MockServer::start().await;
    let calls = Arc::new(AtomicUsize::new(0));
    Mock::given(method("GET"))
        .and(path("/api/tasks"))
        .respond_with(TaskPages {
            n: 25,
            calls: calls.clone(),
        })
        .mount(&server)
        .await;
    let c = client(&server);
    let mut items = c.tasks().list().page_size(10).items();
    let mut ids = Vec::new();
    for _ in 0..11 {
        ids.push(items.next().await.unwrap().unwrap().id);
    }
    assert_eq!(ids[10], "task_0010");
    // The eleventh item needed the second page, and nothing more.
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let rest: Vec<_> = items.map(|t| t.unwrap().id).collect().await;
    assert_eq!(rest.len(), 14);
    assert_eq!(rest.last().map(String::as_str), Some("task_0024"));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn items_end_with_the_error_that_ends_the_pages() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/tasks"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "items": [task(0), task(1)], "total": 10, "limit": 2, "offset": 0,
            "page": 1, "pages": 5
        })))
        .mount(&server)
        .await;
    let c = client(&server);
    let got: Vec<_> = c.tasks().list().page_size(2).items().collect().await;
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got[1].as_ref().unwrap().id, "task_0001");
    assert!(matches!(got[2], Err(Error::Paging { .. })), "{:?}", got[2]);
}

#[tokio::test]
async fn a_server_that_ignores_the_page_ends_with_an_error_not_a_loop() {
    let server = MockServer::start().await;
    // Always the first page, with a page count that promises more.
    Mock::given(method("GET"))
        .and(path("/api/tasks"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "items": [task(0), task(1)], "total": 10, "limit": 2, "offset": 0,
            "page": 1, "pages": 5
        })))
        .mount(&server)
        .await;
    let err = tokio::time::timeout(
        Duration::from_secs(10),
        client(&server).tasks().list().page_size(2),
    )
    .await
    .expect("the listing ended")
    .unwrap_err();
    assert!(matches!(err, Error::Paging { .. }), "{err:?}");
    assert!(!err.is_retryable());
    assert_eq!(server.received_requests().await.unwrap().len(), 2);
}

#[tokio::test]
async fn the_item_bound_is_an_error() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/tasks"))
        .respond_with(TaskPages {
            n: 25,
            calls: Arc::default(),
        })
        .mount(&server)
        .await;
    let err = client(&server)
        .tasks()
        .list()
        .page_size(10)
        .max_items(20)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Paging { .. }), "{err:?}");
    assert!(err.to_string().contains("more than 20"), "{err}");
}

fn entry(i: usize) -> serde_json::Value {
    json!({"name": format!("file_{i:03}.md"), "kind": "file", "size": i, "mtime": "2026-07-01T10:00:00Z"})
}

/// A directory listing of `n` entries, paged by `offset`/`limit` with `next_offset`.
struct DirPages {
    n: usize,
    /// Leave `next_offset` out (the total tells).
    no_next: bool,
}

impl Respond for DirPages {
    fn respond(&self, r: &Request) -> ResponseTemplate {
        let q = query(r);
        let limit = num(&q, "limit", 100);
        let offset = num(&q, "offset", 0);
        let entries: Vec<_> = (0..self.n)
            .skip(offset as usize)
            .take(limit as usize)
            .map(entry)
            .collect();
        let end = offset + entries.len() as u64;
        let mut body =
            json!({"entries": entries, "total": self.n, "offset": offset, "limit": limit});
        if !self.no_next && end < self.n as u64 {
            body["next_offset"] = json!(end);
        }
        ResponseTemplate::new(200).set_body_json(body)
    }
}

#[tokio::test]
async fn source_and_knowledge_listings_follow_next_offset() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path_regex(
            "^/api/contexts/docs/source/list/uploads(/|%2F)guide$",
        ))
        .respond_with(DirPages {
            n: 205,
            no_next: false,
        })
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/api/contexts/docs/knowledge/list"))
        .respond_with(DirPages {
            n: 120,
            no_next: true,
        })
        .mount(&server)
        .await;
    let c = client(&server);
    let files = c
        .sources("docs")
        .list()
        .path("uploads/guide")
        .page_size(50)
        .await
        .unwrap();
    assert_eq!(files.len(), 205);
    assert_eq!(files[204].name, "file_204.md");
    let knowledge = c.knowledge("docs").list().await.unwrap();
    assert_eq!(knowledge.len(), 120);
}

#[tokio::test]
async fn a_repeated_next_offset_ends_with_an_error() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/contexts/docs/source/list"))
        .respond_with(move |r: &Request| {
            let offset = num(&query(r), "offset", 0);
            let entries: Vec<_> = (offset as usize..offset as usize + 2).map(entry).collect();
            // The cursor never moves past 2.
            ResponseTemplate::new(200).set_body_json(json!({
                "entries": entries, "total": 100, "offset": offset, "limit": 2, "next_offset": 2
            }))
        })
        .mount(&server)
        .await;
    let err = tokio::time::timeout(
        Duration::from_secs(10),
        client(&server).sources("docs").list().page_size(2),
    )
    .await
    .expect("the listing ended")
    .unwrap_err();
    assert!(matches!(err, Error::Paging { .. }), "{err:?}");
    assert!(err.to_string().contains("pointed back"), "{err}");
}

#[tokio::test]
async fn sessions_are_listed_with_the_api_maximum() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/sessions"))
        .respond_with(|r: &Request| {
            let limit = num(&query(r), "limit", 50) as usize;
            let sessions: Vec<_> = (0..limit.min(120))
                .map(|i| {
                    json!({
                        "id": format!("sess_{i}"), "project_id": "p", "created_by": "me",
                        "scope": ["docs"], "models": [], "tools": [],
                        "created_at": "2026-07-01T10:00:00Z", "updated_at": "2026-07-01T10:00:00Z"
                    })
                })
                .collect();
            ResponseTemplate::new(200).set_body_json(json!({ "sessions": sessions }))
        })
        .mount(&server)
        .await;
    let c = client(&server);
    assert_eq!(c.sessions().list().await.unwrap().len(), 120);
    assert_eq!(c.sessions().list().page_size(7).await.unwrap().len(), 7);
    let err = c.sessions().list().page_size(0).await.unwrap_err();
    assert!(matches!(err, Error::InvalidRequest(_)), "{err:?}");
    let got = server.received_requests().await.unwrap();
    assert_eq!(query(&got[0])["limit"], "200");
}
