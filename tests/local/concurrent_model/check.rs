//! The check after each stop: what a clean start serves against what
//! the clients were answered.

use super::*;

/// The value each path may have: every write no acknowledged write
/// started after the end of; the base value when none was acknowledged.
fn allowed(base: &Option<String>, writes: &[Write]) -> Vec<Option<String>> {
    let last_acked_start = writes
        .iter()
        .filter(|w| w.outcome == Outcome::Acked)
        .map(|w| w.start)
        .max();
    let mut out: Vec<Option<String>> = writes
        .iter()
        .filter(|w| match (w.end, last_acked_start) {
            (_, None) | (None, _) => true,
            (Some(end), Some(s)) => end >= s,
        })
        .map(|w| w.value.clone())
        .collect();
    if last_acked_start.is_none() {
        out.push(base.clone());
    }
    out
}

/// Every listed source of `ctx` with its content; asserts each is
/// readable and its listed size is its real size.
async fn served_sources(base: &str, ctx: &str, why: &str) -> BTreeMap<String, String> {
    let (status, manifest) = get_json(&format!("{base}/contexts/{ctx}/source/manifest")).await;
    assert_eq!(status, 200, "{why}: manifest of {ctx}: {manifest}");
    let mut out = BTreeMap::new();
    for f in manifest["files"].as_array().cloned().unwrap_or_default() {
        let path = f["path"].as_str().unwrap().to_owned();
        let resp = http()
            .get(format!("{base}/contexts/{ctx}/source/read/{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(
            resp.status(),
            200,
            "{why}: {ctx}/{path} is listed but not readable"
        );
        let text = resp.text().await.unwrap();
        assert_eq!(
            f["size"].as_u64(),
            Some(text.len() as u64),
            "{why}: {ctx}/{path}: listed size is not its size"
        );
        out.insert(path, text);
    }
    out
}

/// Compares the served state with the model, then makes what is served
/// the model's new base.
pub(super) async fn check(base: &str, model: &Shared, why: &str) {
    let mut served = BTreeMap::new();
    for ctx in MODEL_CONTEXTS {
        for (path, text) in served_sources(base, ctx, why).await {
            served.insert((ctx.to_owned(), path), text);
        }
    }
    // What this round acknowledged is checked now; sessions every round.
    let violations = std::mem::take(&mut lock(model).violations);
    assert!(violations.is_empty(), "{why}: {violations:#?}");
    let (refused_forks, open_forks, refused_feedback) = {
        let mut m = lock(model);
        (
            std::mem::take(&mut m.refused_forks),
            std::mem::take(&mut m.open_forks),
            std::mem::take(&mut m.refused_feedback),
        )
    };
    let (writes, turns, cancelled, feedback, sessions, deleted, forks, tasks, imports) = {
        let mut m = lock(model);
        (
            std::mem::take(&mut m.writes),
            std::mem::take(&mut m.turns),
            std::mem::take(&mut m.cancelled),
            std::mem::take(&mut m.feedback),
            m.sessions.clone(),
            m.deleted_sessions.clone(),
            std::mem::take(&mut m.forks),
            std::mem::take(&mut m.tasks),
            std::mem::take(&mut m.imports),
        )
    };
    let base_values = lock(model).base.clone();
    for (key, ws) in &writes {
        let now = served.get(key).cloned();
        let was = base_values.get(key).cloned().flatten();
        let ok = allowed(&was, ws);
        assert!(
            ok.contains(&now),
            "{why}: {key:?} serves {now:?}, allowed {ok:?}; writes {ws:#?}"
        );
    }
    for (key, was) in &base_values {
        if !writes.contains_key(key) {
            assert_eq!(
                served.get(key),
                was.as_ref(),
                "{why}: {key:?} changed without a write"
            );
        }
    }
    for key in served.keys() {
        assert!(
            writes.contains_key(key) || base_values.contains_key(key),
            "{why}: {key:?} appeared from nowhere"
        );
    }
    let mut records = Vec::new();
    for (id, status) in &turns {
        let (code, q) = get_json(&format!("{base}/queries/{id}")).await;
        assert_eq!(code, 200, "{why}: turn {id}: {q}");
        records.push(Record::of(
            format!("/queries/{id}"),
            &q,
            &["id", "status", "session_id"],
        ));
        if let Some(s) = status {
            assert_eq!(
                q["status"].as_str(),
                Some(s.as_str()),
                "{why}: turn {id} answered {s}, now {q}"
            );
        }
        if cancelled.contains(id) {
            assert_eq!(
                q["status"], "cancelled",
                "{why}: turn {id} was answered cancelled: {q}"
            );
        }
        if let Some(r) = feedback.get(id) {
            assert_eq!(
                q["feedback"]["rating"].as_str(),
                Some(r.as_str()),
                "{why}: feedback on {id}: {q}"
            );
        }
    }
    for s in &sessions {
        if deleted.contains(s) {
            continue;
        }
        let (code, body) = get_json(&format!("{base}/sessions/{s}")).await;
        assert_eq!(code, 200, "{why}: session {s}: {body}");
    }
    for s in &deleted {
        let (code, body) = get_json(&format!("{base}/sessions/{s}")).await;
        assert_eq!(code, 404, "{why}: deleted session {s} is back: {body}");
    }
    for f in &forks {
        let (code, body) = get_json(&format!("{base}/contexts/{f}")).await;
        assert_eq!(code, 200, "{why}: fork {f}: {body}");
        served_sources(base, f, why).await;
        let id = body["id"].as_str().unwrap_or_default().to_owned();
        assert!(
            lock(model).ids.insert(format!("context {id}")),
            "{why}: fork {f} has the id of an earlier record: {body}"
        );
        records.push(Record::of(format!("/contexts/{f}"), &body, &["id", "slug"]));
    }
    for f in &refused_forks {
        let (code, body) = get_json(&format!("{base}/contexts/{f}")).await;
        assert_eq!(
            code, 404,
            "{why}: fork {f} answered not_saved exists: {body}"
        );
    }
    for f in &open_forks {
        let (code, body) = get_json(&format!("{base}/contexts/{f}")).await;
        assert!(
            code == 404 || (code == 200 && body["is_importing"] != true),
            "{why}: fork {f} (no answer) is half made: {code} {body}"
        );
    }
    for id in &refused_feedback {
        let (code, q) = get_json(&format!("{base}/queries/{id}")).await;
        if code == 200 {
            assert!(
                q["feedback"].is_null(),
                "{why}: feedback on {id} answered not_saved is stored: {q}"
            );
        }
    }
    for t in &tasks {
        let (code, body) = get_json(&format!("{base}/tasks/{t}")).await;
        assert_eq!(code, 200, "{why}: task {t}: {body}");
        records.push(Record::of(
            format!("/tasks/{t}"),
            &body,
            &["id", "context_id"],
        ));
    }
    for t in &imports {
        let (code, body) = get_json(&format!("{base}/tasks/{t}")).await;
        assert_eq!(code, 200, "{why}: import task {t}: {body}");
        assert_eq!(
            body["state"], "completed",
            "{why}: acknowledged import {t}: {body}"
        );
        records.push(Record::of(
            format!("/tasks/{t}"),
            &body,
            &["id", "context_id", "state"],
        ));
    }
    let mut m = lock(model);
    m.history.extend(records);
    m.base = served.into_iter().map(|(k, v)| (k, Some(v))).collect();
}

/// An acknowledged record as a check saw it: what a later start must
/// still serve at `path` (a record with a repeated id would replace it).
#[derive(Debug, Clone)]
pub(super) struct Record {
    path: String,
    fields: Vec<(&'static str, Value)>,
}

impl Record {
    fn of(path: String, body: &Value, names: &[&'static str]) -> Record {
        let fields = names.iter().map(|n| (*n, body[*n].clone())).collect();
        Record { path, fields }
    }
}

/// Every record acknowledged since the run began is served as it was
/// first seen (a repeated clock must not have replaced any).
pub(super) async fn check_history(base: &str, model: &Shared, why: &str) {
    use futures::StreamExt;
    let history = lock(model).history.clone();
    let found: Vec<(Record, u16, Value)> = futures::stream::iter(history)
        .map(|r| async move {
            let (code, body) = get_json(&format!("{base}{}", r.path)).await;
            (r, code, body)
        })
        .buffer_unordered(8)
        .collect()
        .await;
    for (r, code, body) in found {
        assert_eq!(code, 200, "{why}: {} is gone: {body}", r.path);
        for (name, was) in &r.fields {
            assert_eq!(
                &body[*name], was,
                "{why}: {} changed its {name}: {body}",
                r.path
            );
        }
    }
}
