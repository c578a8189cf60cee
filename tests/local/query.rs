//! Query turns against the local Nexus, over the wire: synchronous, streamed,
//! background, replay and resume, cancel, sessions and bad requests.

use std::time::Duration;

use crate::support::local as local_support;
use crate::support::wait::until_some;
use local_support::*;
use nexus_knowql::local::LocalNexus;
use serde_json::json;

#[tokio::test]
async fn sync_turn_answers_extractively_with_citations() {
    let (_server, client, _dir) = seeded(LocalNexus::builder()).await;
    let q = client
        .api()
        .query(&request(
            json!({"ask": "How do I resume a broken stream?", "scope": ["docs"]}),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(q.status, "completed");
    assert_eq!(q.model.as_deref(), Some("local-extractive"));
    let text = q.answer_text();
    assert!(
        text.contains("reconnect with the Last-Event-ID header"),
        "{text}"
    );
    assert!(!text.contains("tea"), "{text}");
    let c = &q.citations[0];
    assert_eq!(c.source, "guide/streaming.md");
    assert_eq!(
        c.section_paths[0],
        vec!["Streaming".to_string(), "Resume".to_string()]
    );
    assert_eq!(q.steps.len(), 2);
    assert!(q.steps.iter().all(|s| s.status == "completed"));
    assert!(q.rollup.is_some() && q.synthesis.is_some());
}

#[tokio::test]
async fn a_question_without_matches_says_so_honestly() {
    let (_server, client, _dir) = seeded(LocalNexus::builder()).await;
    let q = client
        .api()
        .query(&request(
            json!({"ask": "zeppelin quaternion", "scope": ["docs"]}),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(q.status, "completed");
    assert!(q.citations.is_empty());
    assert!(q.answer_text().contains("No passage"));
}

#[tokio::test]
async fn stream_emits_ordered_events_then_the_query_frame() {
    let (server, _client, _dir) = seeded(LocalNexus::builder()).await;
    let resp = post_stream(
        server.base_url(),
        json!({"ask": "how long does green tea steep", "scope": ["docs"], "stream": true}),
    )
    .await;
    let frames = read_frames(resp).await.expect("clean end");
    let names: Vec<&str> = frames.iter().map(|f| f.event.as_str()).collect();
    assert_eq!(names[0], "response.created");
    assert_eq!(&names[1..5], ["response.step"; 4]);
    let last = names.len() - 1;
    assert_eq!(
        &names[last - 3..],
        [
            "response.turn_rollup",
            "response.synthesis",
            "response.completed",
            "query"
        ]
    );
    assert!(
        names[5..last - 3]
            .iter()
            .all(|n| *n == "response.output_text.delta")
    );
    // Step events: same id goes in_progress then completed.
    assert_eq!(frames[1].data["step_id"], frames[2].data["step_id"]);
    assert_eq!(frames[1].data["status"], "in_progress");
    assert_eq!(frames[2].data["status"], "completed");
    assert!(
        frames[1].data["commentary"]
            .as_str()
            .unwrap()
            .contains("docs")
    );
    // Ids count up from 1; the query frame has none.
    let ids: Vec<u64> = frames[..last].iter().map(|f| f.id.unwrap()).collect();
    assert_eq!(ids, (1..=last as u64).collect::<Vec<_>>());
    assert_eq!(frames[last].id, None);
    let query: nexus_knowql::types::Query =
        serde_json::from_value(frames[last].data.clone()).unwrap();
    assert_eq!(query.answer_text(), text_of(&frames));
    assert!(query.answer_text().contains("two minutes"));
    // Every event decodes as the spec's QueryEvent.
    for f in &frames[..last] {
        let e: nexus_knowql::types::QueryEvent = serde_json::from_value(f.data.clone()).unwrap();
        assert_eq!(e.type_, f.event);
        assert_eq!(e.query_id, query.id);
    }
}

#[tokio::test]
async fn background_turn_returns_202_then_completes() {
    let (server, client, _dir) =
        seeded(LocalNexus::builder().frame_delay(Duration::from_millis(5))).await;
    let resp = reqwest::Client::new()
        .post(format!("{}/query", server.base_url()))
        .json(&json!({"ask": "black tea", "scope": ["docs"], "background": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let q: nexus_knowql::types::Query = resp.json().await.unwrap();
    assert_eq!(q.status, "in_progress");
    let done = until_some(Duration::from_secs(30), "the turn ending", async || {
        let q = client.queries().get(&q.id).await.unwrap();
        q.is_terminal().then_some(q)
    })
    .await;
    assert_eq!(done.status, "completed");
    assert!(done.answer_text().contains("four minutes"));
    // The finished turn's events replay from the start.
    let frames = read_frames(get_events(server.base_url(), &q.id, None).await)
        .await
        .unwrap();
    assert_eq!(frames[0].event, "response.created");
    assert_eq!(text_of(&frames), done.answer_text());
}

#[tokio::test]
async fn events_replay_inclusively_from_last_event_id() {
    let (server, client, _dir) = seeded(LocalNexus::builder()).await;
    let q = client
        .api()
        .query(&request(json!({"ask": "green tea", "scope": ["docs"]})))
        .await
        .unwrap()
        .into_inner();
    let all = read_frames(get_events(server.base_url(), &q.id, None).await)
        .await
        .unwrap();
    let from4 = read_frames(get_events(server.base_url(), &q.id, Some(4)).await)
        .await
        .unwrap();
    assert_eq!(from4[0].id, Some(4));
    assert_eq!(&from4[..], &all[3..]);
    let past_end = read_frames(get_events(server.base_url(), &q.id, Some(10_000)).await)
        .await
        .unwrap();
    assert_eq!(past_end.len(), 1);
    assert_eq!(past_end[0].event, "query");
}

#[tokio::test]
async fn cut_streams_resume_with_exactly_once_text() {
    let (server, client, _dir) = seeded(
        LocalNexus::builder()
            .cut_streams_after(4)
            .frame_delay(Duration::from_millis(2)),
    )
    .await;
    let first = read_frames(
        post_stream(
            server.base_url(),
            json!({"ask": "how do I resume a stream", "scope": ["docs"], "stream": true}),
        )
        .await,
    )
    .await
    .expect_err("the stream is cut");
    assert_eq!(first.len(), 4);
    let query_id = first[0].data["query_id"].as_str().unwrap().to_owned();
    let mut delivered = first;
    let mut connections = 1;
    let final_frame = loop {
        let last = delivered.last().and_then(|f| f.id);
        let got = read_frames(get_events(server.base_url(), &query_id, last).await).await;
        connections += 1;
        let (frames, ended) = match got {
            Ok(f) => (f, true),
            Err(f) => (f, false),
        };
        for f in frames {
            // Drop what was already delivered (the replay is inclusive).
            if f.id.is_some() && f.id <= delivered.last().and_then(|d| d.id) {
                continue;
            }
            delivered.push(f);
        }
        if ended {
            break delivered.pop().unwrap();
        }
        assert!(connections < 200, "no progress");
    };
    assert!(connections > 2);
    assert_eq!(final_frame.event, "query");
    let ids: Vec<u64> = delivered.iter().map(|f| f.id.unwrap()).collect();
    assert_eq!(
        ids,
        (1..=ids.len() as u64).collect::<Vec<_>>(),
        "each event once"
    );
    let stored = client.queries().get(&query_id).await.unwrap();
    assert_eq!(text_of(&delivered), stored.answer_text());
    assert!(stored.answer_text().contains("Last-Event-ID"));
}

#[tokio::test]
async fn cancel_stops_a_running_turn() {
    let (server, client, _dir) =
        seeded(LocalNexus::builder().frame_delay(Duration::from_millis(200))).await;
    let resp = reqwest::Client::new()
        .post(format!("{}/query", server.base_url()))
        .json(&json!({"ask": "tea", "scope": ["docs"], "background": true}))
        .send()
        .await
        .unwrap();
    let q: nexus_knowql::types::Query = resp.json().await.unwrap();
    let cancelled = client.queries().cancel(&q.id).await.unwrap();
    assert_eq!(cancelled.status, "cancelled");
    assert!(cancelled.error.is_some());
    // Idempotent: a second cancel returns the turn unchanged.
    assert_eq!(client.queries().cancel(&q.id).await.unwrap(), cancelled);
    let frames = read_frames(get_events(server.base_url(), &q.id, None).await)
        .await
        .unwrap();
    let n = frames.len();
    assert_eq!(frames[n - 2].event, "response.cancelled");
    assert_eq!(frames[n - 1].event, "query");
}

#[tokio::test]
async fn sessions_continue_and_allow_one_turn_at_a_time() {
    let (server, client, _dir) =
        seeded(LocalNexus::builder().frame_delay(Duration::from_millis(30))).await;
    let first = client
        .api()
        .query(&request(json!({"ask": "green tea", "scope": ["docs"]})))
        .await
        .unwrap()
        .into_inner();
    let sid = first.session_id.clone();
    // A follow-up by previous_query_id lands in the same session.
    let second = client
        .api()
        .query(&request(
            json!({"ask": "and black?", "previous_query_id": first.id}),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.session_id, sid);
    assert_eq!(second.previous_query_id.as_deref(), Some(first.id.as_str()));
    // Earlier questions inform retrieval: "and black?" finds black tea.
    assert!(
        second.answer_text().contains("four minutes"),
        "{}",
        second.answer_text()
    );

    // A background turn is in flight: a second turn on the session gets 409,
    // while another session runs concurrently.
    let bg = reqwest::Client::new()
        .post(format!("{}/query", server.base_url()))
        .json(&json!({"ask": "tea", "session_id": sid, "background": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(bg.status(), 202);
    let err = client
        .api()
        .query(&request(json!({"ask": "again", "session_id": sid})))
        .await
        .unwrap_err();
    assert_eq!(err.status().map(|s| s.as_u16()), Some(409));
    let other = client
        .api()
        .query(&request(
            json!({"ask": "lighthouse ships", "scope": ["docs"]}),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(other.session_id, sid);
    assert!(other.answer_text().contains("42 ships"));

    let s = client.sessions().get(&sid).await.unwrap();
    assert_eq!(s.queries.len(), 3);
    assert_eq!(s.scope, vec!["docs".to_string()]);
    let listed = client.sessions().list().await.unwrap();
    assert!(listed.iter().any(|x| x.id == sid));
    client.sessions().delete(&other.session_id).await.unwrap();
    let gone = client.sessions().get(&other.session_id).await.unwrap_err();
    assert!(gone.is_not_found(), "{gone}");
    // Deleting it again succeeds: the session is gone either way.
    client.sessions().delete(&other.session_id).await.unwrap();
}

#[tokio::test]
async fn bad_query_requests_get_clear_4xx_and_the_server_keeps_running() {
    let (server, client, dir) = seeded(LocalNexus::builder()).await;
    // A second, uncurated context and a work context for the scope checks.
    for (slug, kind) in [("raw", "search"), ("desk", "work")] {
        let req =
            serde_json::from_value(json!({"slug": slug, "name": slug, "kind": kind})).unwrap();
        client.contexts().create(&req).await.unwrap();
    }
    let eleven: Vec<String> = (0..11).map(|_| "docs".to_string()).collect();
    let cases = [
        (json!({"ask": "", "scope": ["docs"]}), 400, "ask"),
        (json!({"ask": "   ", "scope": ["docs"]}), 400, "ask"),
        (json!({"ask": "q"}), 400, "scope"),
        (json!({"ask": "q", "scope": []}), 400, "scope"),
        (json!({"ask": "q", "scope": eleven}), 400, "scope"),
        (json!({"ask": "q", "scope": ["nope"]}), 404, "nope"),
        (json!({"ask": "q", "scope": ["raw"]}), 409, "curate"),
        (json!({"ask": "q", "scope": ["docs", "desk"]}), 400, "mix"),
        (
            json!({"ask": "q", "scope": ["docs"], "stream": true, "background": true}),
            400,
            "background",
        ),
        (
            json!({"ask": "q", "scope": ["docs"], "model": "gpt-9"}),
            400,
            "local-extractive",
        ),
        (
            json!({"ask": "q", "session_id": "ses_missing"}),
            404,
            "session",
        ),
        (
            json!({"ask": "q", "previous_query_id": "qry_missing"}),
            404,
            "query",
        ),
        (
            json!({"ask": "q", "scope": ["docs"], "shape": {"type": "array"}}),
            400,
            "shape",
        ),
    ];
    let http = reqwest::Client::new();
    for (body, status, needle) in cases {
        let resp = http
            .post(format!("{}/query", server.base_url()))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), status, "{body}");
        let err: nexus_knowql::types::Error = resp.json().await.unwrap();
        assert!(err.message.contains(needle), "{body}: {}", err.message);
    }
    let malformed = http
        .post(format!("{}/query", server.base_url()))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(malformed.status(), 400);
    let err: nexus_knowql::types::Error = malformed.json().await.unwrap();
    assert!(!err.message.is_empty());
    // Nothing was lost: the context still answers.
    let q = client
        .api()
        .query(&request(json!({"ask": "green tea", "scope": ["docs"]})))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(q.status, "completed");
    drop(dir);
}

#[tokio::test]
async fn retrieval_only_and_shaped_turns_fill_output_json() {
    let (_server, client, _dir) = seeded(LocalNexus::builder()).await;
    let q = client
        .api()
        .query(
            &request(json!({"ask": "tea steeps", "scope": ["docs"], "retrieval_only": true, "max_retrieved": 2, "max_retrieved_chars": 10})))
        .await
        .unwrap()
        .into_inner();
    let out = q.output_json.unwrap();
    let hits = out["hits"].as_array().unwrap();
    assert_eq!(hits.len(), 2);
    assert!(hits.iter().all(|h| h["source"] == "guide/tea.md"));
    assert!(hits[0]["text"].as_str().unwrap().chars().count() <= 10);
    assert!(q.output.is_empty(), "no synthesis on retrieval-only turns");

    let shaped = client
        .api()
        .query(
            &request(json!({
                "ask": "how many ships does the lighthouse keeper count",
                "scope": ["docs"],
                "shape": {"type": "object", "properties": {"ships": {"type": "integer"}}, "required": ["ships"]}
            })))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(shaped.output_json.unwrap()["ships"], json!(42));

    let impossible = client
        .api()
        .query(
            &request(json!({
                "ask": "green tea",
                "scope": ["docs"],
                "shape": {"type": "object", "properties": {"organic": {"type": "boolean"}}, "required": ["organic"]}
            })))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(impossible.status, "failed");
    assert!(impossible.error.unwrap().contains("organic"));
    assert!(impossible.output_json.is_none(), "never a fake value");
}

#[tokio::test]
async fn trace_and_feedback_of_a_finished_turn() {
    let (_server, client, _dir) = seeded(LocalNexus::builder()).await;
    let q = client
        .api()
        .query(&request(json!({"ask": "green tea", "scope": ["docs"]})))
        .await
        .unwrap()
        .into_inner();
    let trace = client.queries().trace(&q.id).await.unwrap();
    assert_eq!(trace.steps[0].calls[0].fn_, "search_chunks");
    assert_eq!(trace.steps[0].strategy.kind, "bm25");
    assert!(trace.rollup.unwrap().total_hits > 0);
    client
        .queries()
        .feedback(&q.id, nexus_knowql::Rating::Up, Some("useful"))
        .await
        .unwrap();
    let q = client.queries().get(&q.id).await.unwrap();
    assert_eq!(q.feedback.unwrap().rating, "up");
    let err = client.queries().get("qry_missing").await.unwrap_err();
    assert!(err.is_not_found());
}
