//! The clients of the model: each issues random writes and reads and
//! records what it was answered.

use super::*;
use crate::support::wait::until_found;

/// One client's operations until `stop` (or `budget` operations).
pub(super) async fn run_client(
    base: String,
    model: Shared,
    mut rng: Rng,
    who: usize,
    budget: usize,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let http = client();
    let mut own_turns: Vec<String> = Vec::new();
    let mut session: Option<String> = None;
    for n in 0..budget {
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let ctx = MODEL_CONTEXTS[rng.below(2) as usize];
        let tag = format!("c{who}-{n}-{}", rng.next() % 1_000_000);
        let kind = rng.below(12);
        let start = Instant::now();
        let (name, answer): (&'static str, Option<(u16, Value)>) = match kind {
            0..=2 => {
                let file = format!("p{}.md", rng.below(NAMES as u64));
                let text = format!("# {tag}\n\nwritten by {tag}\n");
                let form = reqwest::multipart::Form::new().part(
                    "file",
                    reqwest::multipart::Part::bytes(text.clone().into_bytes())
                        .file_name(file.clone()),
                );
                let a = send(
                    http.post(format!("{base}/contexts/{ctx}/import/upload"))
                        .multipart(form),
                )
                .await;
                let o = outcome(&a);
                if o != Outcome::Refused {
                    let end = (o == Outcome::Acked).then(Instant::now);
                    record_writes(
                        &model,
                        ctx,
                        vec![(format!("uploads/{file}"), Some(text))],
                        Write {
                            value: None,
                            start,
                            end,
                            outcome: o,
                        },
                    );
                }
                if let Some(t) = a
                    .as_ref()
                    .filter(|_| o == Outcome::Acked)
                    .and_then(|(_, b)| b["task_id"].as_str())
                {
                    note_new_id(&model, "task", t);
                    lock(&model).imports.push(t.to_owned());
                }
                ("upload", a)
            }
            3 => {
                let files: Vec<(String, String)> = (0..2)
                    .map(|k| {
                        (
                            format!("a/p{}.md", (rng.below(NAMES as u64) + k) % NAMES as u64),
                            format!("# {tag} {k}\n\narchived by {tag}\n"),
                        )
                    })
                    .collect::<BTreeMap<_, _>>()
                    .into_iter()
                    .collect();
                let form = reqwest::multipart::Form::new().part(
                    "file",
                    reqwest::multipart::Part::bytes(tar_gz(&files)).file_name("batch.tar.gz"),
                );
                let a = send(
                    http.post(format!("{base}/contexts/{ctx}/import/upload"))
                        .multipart(form),
                )
                .await;
                let o = outcome(&a);
                if o != Outcome::Refused {
                    let end = (o == Outcome::Acked).then(Instant::now);
                    let writes = files
                        .into_iter()
                        .map(|(p, t)| (format!("uploads/{p}"), Some(t)))
                        .collect();
                    record_writes(
                        &model,
                        ctx,
                        writes,
                        Write {
                            value: None,
                            start,
                            end,
                            outcome: o,
                        },
                    );
                }
                if let Some(t) = a
                    .as_ref()
                    .filter(|_| o == Outcome::Acked)
                    .and_then(|(_, b)| b["task_id"].as_str())
                {
                    note_new_id(&model, "task", t);
                    lock(&model).imports.push(t.to_owned());
                }
                ("archive", a)
            }
            4 | 5 => {
                let path = if rng.below(2) == 0 {
                    format!("uploads/p{}.md", rng.below(NAMES as u64))
                } else {
                    format!("uploads/a/p{}.md", rng.below(NAMES as u64))
                };
                let a =
                    send(http.delete(format!("{base}/contexts/{ctx}/source/delete/{path}"))).await;
                let o = outcome(&a);
                if o != Outcome::Refused {
                    let end = (o == Outcome::Acked).then(Instant::now);
                    record_writes(
                        &model,
                        ctx,
                        vec![(path, None)],
                        Write {
                            value: None,
                            start,
                            end,
                            outcome: o,
                        },
                    );
                }
                ("delete", a)
            }
            6 => {
                let target = format!("fork-{tag}");
                if rng.below(2) == 0 {
                    // A client that goes away mid-fork, then retries.
                    let gone = reqwest::Client::builder()
                        .timeout(Duration::from_millis(1 + rng.below(20)))
                        .build()
                        .unwrap();
                    let first = send(
                        gone.post(format!("{base}/contexts/{ctx}/fork"))
                            .json(&json!({"target_slug": target})),
                    )
                    .await;
                    note_fork(&model, &target, &first);
                    if first.is_some() {
                        ("fork", first)
                    } else {
                        // Busy while the first request still builds it.
                        let url = format!("{base}/contexts/{ctx}/fork");
                        let a = until_found(
                            Duration::from_secs(30),
                            "the retried fork's slug no longer busy",
                            || {
                                let retry = http.post(&url).json(&json!({"target_slug": target}));
                                async move {
                                    let a = send(retry).await;
                                    match &a {
                                        Some((503, b)) if b["code"] == "busy" => None,
                                        _ => Some(a),
                                    }
                                }
                            },
                        )
                        .await;
                        if let Some((409, b)) = &a
                            && b["message"]
                                .as_str()
                                .is_some_and(|m| m.contains("already exists"))
                        {
                            // Only a fork the first request published
                            // (whole) makes its retry a conflict on its
                            // slug (an import on the source is another).
                            let seen = send(http.get(format!("{base}/contexts/{target}"))).await;
                            if let Some((code, seen)) = seen
                                && (code != 200 || seen["is_importing"] == true)
                            {
                                lock(&model).violations.push(format!(
                                    "the retry of fork {target} whose client went away got {b}; the fork: {code} {seen}"
                                ));
                            }
                        }
                        note_fork(&model, &target, &a);
                        ("fork retried", a)
                    }
                } else {
                    let a = send(
                        http.post(format!("{base}/contexts/{ctx}/fork"))
                            .json(&json!({"target_slug": target})),
                    )
                    .await;
                    note_fork(&model, &target, &a);
                    ("fork", a)
                }
            }
            7 => {
                let a = send(
                    http.post(format!("{base}/contexts/{ctx}/curate"))
                        .json(&json!({})),
                )
                .await;
                if let Some(t) = a
                    .as_ref()
                    .filter(|_| outcome(&a) == Outcome::Acked)
                    .and_then(|(_, b)| b["task_id"].as_str())
                {
                    lock(&model).tasks.push(t.to_owned());
                }
                ("curate", a)
            }
            8 => {
                let mut body = json!({"ask": "What was written?", "scope": ["m0"]});
                if let Some(s) = &session {
                    body["session_id"] = json!(s);
                }
                let a = send(http.post(format!("{base}/query")).json(&body)).await;
                if outcome(&a) == Outcome::Acked
                    && let Some((_, q)) = &a
                {
                    let id = q["id"].as_str().unwrap_or_default().to_owned();
                    let sid = q["session_id"].as_str().unwrap_or_default().to_owned();
                    note_new_id(&model, "turn", &id);
                    if session.is_none() {
                        note_new_id(&model, "session", &sid);
                    }
                    let mut m = lock(&model);
                    m.turns
                        .insert(id.clone(), q["status"].as_str().map(str::to_owned));
                    if session.is_none() && !sid.is_empty() {
                        m.sessions.push(sid.clone());
                        session = Some(sid);
                    }
                    own_turns.push(id);
                }
                ("turn", a)
            }
            9 => {
                let body =
                    json!({"ask": "What was archived?", "scope": ["m0"], "background": true});
                let a = send(http.post(format!("{base}/query")).json(&body)).await;
                if let Some(id) = a
                    .as_ref()
                    .filter(|_| outcome(&a) == Outcome::Acked)
                    .and_then(|(_, q)| q["id"].as_str())
                {
                    note_new_id(&model, "turn", id);
                    lock(&model).turns.insert(id.to_owned(), None);
                    let c = send(
                        http.post(format!("{base}/queries/{id}/cancel"))
                            .json(&json!({})),
                    )
                    .await;
                    if let Some((200, q)) = &c
                        && q["status"] == "cancelled"
                    {
                        lock(&model).cancelled.push(id.to_owned());
                    }
                    own_turns.push(id.to_owned());
                }
                ("background+cancel", a)
            }
            10 => {
                let Some(id) = own_turns
                    .get(rng.below(own_turns.len() as u64) as usize)
                    .cloned()
                else {
                    continue;
                };
                let rating = if rng.below(2) == 0 { "up" } else { "down" };
                let a = send(
                    http.post(format!("{base}/queries/{id}/feedback"))
                        .json(&json!({"rating": rating})),
                )
                .await;
                let o = outcome(&a);
                let mut m = lock(&model);
                if not_saved(&a) {
                    if !m.touched_feedback.contains(&id) && !m.refused_feedback.contains(&id) {
                        m.refused_feedback.push(id.clone());
                    }
                } else if !m.touched_feedback.contains(&id) {
                    m.refused_feedback.retain(|t| t != &id);
                    m.touched_feedback.push(id.clone());
                }
                match o {
                    Outcome::Acked => {
                        m.feedback.insert(id, rating.to_owned());
                    }
                    // Either rating may be the one kept.
                    Outcome::Unknown => {
                        m.feedback.remove(&id);
                    }
                    Outcome::Refused => {}
                }
                ("feedback", a)
            }
            _ => {
                let a = send(
                    http.post(format!("{base}/query"))
                        .json(&json!({"ask": "Anything?", "scope": ["m1"]})),
                )
                .await;
                let Some(sid) = a
                    .as_ref()
                    .filter(|_| outcome(&a) == Outcome::Acked)
                    .and_then(|(_, q)| q["session_id"].as_str())
                    .map(str::to_owned)
                else {
                    lock(&model).ops += 1;
                    continue;
                };
                note_new_id(&model, "session", &sid);
                let d = send(http.delete(format!("{base}/sessions/{sid}"))).await;
                if outcome(&d) == Outcome::Acked {
                    lock(&model).deleted_sessions.push(sid);
                }
                ("session delete", d)
            }
        };
        let mut m = lock(&model);
        m.ops += 1;
        *m.kinds.entry(name).or_default() += 1;
        if outcome(&answer) == Outcome::Acked {
            m.acked += 1;
        }
        if answer.is_none() {
            // The server is gone: stop issuing.
            return;
        }
    }
}
