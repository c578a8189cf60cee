//! Unit tests of the error type: every accessor over every variant, and the texts.

use super::*;
use crate::status::TaskStatus;

#[test]
fn error_stays_small() {
    // Results of this crate are returned on every hot path; keep the error
    // a few words wide by boxing large payloads. 72 bytes today (the widest
    // variant is `Checkpoint`); it may shrink, never grow.
    assert!(
        std::mem::size_of::<Error>() <= 72,
        "{}",
        std::mem::size_of::<Error>()
    );
}

#[test]
fn display_names_operation_and_code() {
    let e = Error::api(
        "get_context",
        404,
        Some("nope".into()),
        "no such context".into(),
        None,
        None,
    );
    assert_eq!(
        e.to_string(),
        "get_context: server answered 404 (nope): no such context"
    );
    assert!(e.is_not_found());
    assert!(!e.is_retryable());
}

#[test]
fn nothing_that_could_start_a_second_turn_is_retryable() {
    let stream = Error::Stream {
        query_id: None,
        message: "cut".into(),
    };
    assert!(!stream.is_retryable());
    let gap = Error::ReplayGap {
        query_id: "q1".into(),
        last_event_id: Some(4),
        message: "the replay started at event 7".into(),
    };
    assert!(!gap.is_retryable());
    assert_eq!(gap.query_id(), Some("q1"));
    assert!(gap.to_string().contains("after event 4"), "{gap}");
    let timeout = |operation| Error::Timeout {
        operation,
        elapsed_ms: 1,
        query_id: None,
    };
    assert!(!timeout("create_query").is_retryable());
    assert!(timeout("list_contexts").is_retryable());
    let lost = |connect| Error::transport("create_query", "reset", connect);
    assert!(!lost(false).is_retryable());
    assert!(lost(true).is_retryable());
}

#[test]
fn api_errors_name_their_query() {
    let e = Error::api("stream_query_events", 403, None, "no".into(), None, None).for_query("q_9");
    assert_eq!(e.query_id(), Some("q_9"));
    assert_eq!(
        e.to_string(),
        "stream_query_events of query q_9: server answered 403: no"
    );
}

#[test]
fn snippet_is_bounded() {
    let body = vec![b'x'; 10_000];
    assert_eq!(snippet(&body).len(), SNIPPET_LIMIT);
}

fn api_err(operation: &'static str, status: u16) -> ApiError {
    ApiError {
        operation,
        status,
        code: None,
        message: "m".into(),
        request_id: None,
        raw_body: None,
        query_id: None,
        retry_after: None,
        rate_limits: RateLimits::default(),
    }
}

fn api(operation: &'static str, status: u16) -> Error {
    Error::Api(Box::new(api_err(operation, status)))
}

fn with_retry_after(operation: &'static str, status: u16) -> Error {
    let mut e = api_err(operation, status);
    e.retry_after = Some(std::time::Duration::from_secs(2));
    Error::Api(Box::new(e))
}

/// A `get_context` answer of `status` with a code, a request id and a
/// query id.
fn api_err_with_ids(status: u16, code: &str, request_id: &str, query_id: &str) -> ApiError {
    let mut e = api_err("get_context", status);
    e.code = Some(code.into());
    e.request_id = Some(request_id.into());
    e.query_id = Some(query_id.into());
    e
}

/// One error of every variant but `Api`, with the label its assertions use.
fn others() -> Vec<(&'static str, Error)> {
    let mut all = request_errors();
    all.extend(turn_and_listing_errors());
    all
}

/// The errors of a request as such: refused, cut, late or unreadable.
fn request_errors() -> Vec<(&'static str, Error)> {
    vec![
        (
            "version",
            Error::UnsupportedApiVersion(Box::new(UnsupportedVersion {
                operation: "list_contexts",
                sent: "2026-07".into(),
                message: "no".into(),
                request_id: Some("r_v".into()),
            })),
        ),
        (
            "unauthorized",
            Error::Unauthorized {
                operation: "list_contexts",
                message: "expired".into(),
                request_id: Some("r_u".into()),
            },
        ),
        (
            "transport",
            Error::transport("list_contexts", "reset", false),
        ),
        (
            "timeout",
            Error::Timeout {
                operation: "list_contexts",
                elapsed_ms: 7,
                query_id: None,
            },
        ),
        ("decode", Error::decode("get_context", "bad json", b"{x")),
        ("invalid", Error::InvalidRequest("empty question".into())),
    ]
}

/// The errors of a turn, a task, a redirect, a listing, a stream or a body.
fn turn_and_listing_errors() -> Vec<(&'static str, Error)> {
    vec![
        (
            "turn_failed",
            Error::TurnFailed {
                query_id: "q_f".into(),
                message: "boom".into(),
            },
        ),
        (
            "turn_cancelled",
            Error::TurnCancelled {
                query_id: "q_c".into(),
                message: String::new(),
            },
        ),
        (
            "task",
            Error::TaskFailed(Box::new(TaskFailure {
                task_id: "t1".into(),
                state: TaskStatus::Failed.as_str().into(),
                message: "disk".into(),
            })),
        ),
        (
            "redirect",
            Error::Redirect {
                operation: "get_context",
                location: "http://other/".into(),
                reason: "another origin",
            },
        ),
        (
            "paging",
            Error::Paging {
                operation: "list_contexts",
                message: "loop".into(),
            },
        ),
        (
            "busy",
            Error::SessionBusy {
                query_id: "q_b".into(),
            },
        ),
        (
            "stream",
            Error::Stream {
                query_id: Some("q_s".into()),
                message: "cut".into(),
            },
        ),
        (
            "gap",
            Error::ReplayGap {
                query_id: "q_g".into(),
                last_event_id: None,
                message: "gone".into(),
            },
        ),
        (
            "large",
            Error::ResponseTooLarge {
                operation: "get_context",
                limit: 10,
            },
        ),
        (
            "mismatch",
            Error::AnswerMismatch {
                query_id: "q_m".into(),
                delivered_len: 3,
                final_len: 4,
                first_difference: 2,
            },
        ),
    ]
}

#[test]
fn every_variant_reads_back_its_text() {
    let text: Vec<(&str, String)> = others()
        .into_iter()
        .map(|(n, e)| (n, e.to_string()))
        .collect();
    let expected = [
        (
            "version",
            "list_contexts: the server does not support API version `2026-07`: no",
        ),
        ("unauthorized", "list_contexts: unauthorized: expired"),
        ("transport", "list_contexts: the connection failed"),
        ("timeout", "list_contexts: timed out after 7 ms"),
        (
            "decode",
            "get_context: could not decode the response: bad json (body starts: \"{x\")",
        ),
        ("invalid", "invalid request: empty question"),
        ("turn_failed", "query q_f failed: boom"),
        ("turn_cancelled", "query q_c was cancelled"),
        ("task", "task t1 ended failed: disk"),
        (
            "redirect",
            "get_context: another origin: redirect to http://other/ not followed",
        ),
        ("paging", "list_contexts: paging: loop"),
        (
            "busy",
            "the session still runs query q_b: attach to it or cancel it before asking again",
        ),
        ("stream", "event stream of query q_s: cut"),
        (
            "gap",
            "event stream of query q_g: the events after the start could not be replayed: gone",
        ),
        (
            "large",
            "get_context: the answer is larger than the limit of 10 bytes",
        ),
        (
            "mismatch",
            "query q_m: the 3 bytes delivered do not match the first 3 bytes of the final answer (of 4 bytes); they first differ at byte 2",
        ),
    ];
    for ((name, got), (want_name, want)) in text.iter().zip(expected) {
        assert_eq!((*name, got.as_str()), (want_name, want));
    }
    let unnamed = Error::SessionBusy {
        query_id: String::new(),
    };
    assert_eq!(
        unnamed.to_string(),
        "the session still runs a turn the server has not named yet: attach to it or cancel it before asking again"
    );
    let with_text = Error::TurnCancelled {
        query_id: "q".into(),
        message: "by user".into(),
    };
    assert_eq!(with_text.to_string(), "query q was cancelled: by user");
    let no_text = Error::TaskFailed(Box::new(TaskFailure {
        task_id: "t".into(),
        state: TaskStatus::Cancelled.as_str().into(),
        message: String::new(),
    }));
    assert_eq!(no_text.to_string(), "task t ended cancelled");
    let anonymous = Error::Stream {
        query_id: None,
        message: "cut".into(),
    };
    assert_eq!(anonymous.to_string(), "event stream: cut");
    assert_eq!(
        api("get_context", 500).to_string(),
        "get_context: server answered 500: m"
    );
}

#[test]
fn api_error_formats_show_status_and_message() {
    let mut e = api_err_with_ids(409, "busy", "r_1", "q_1");
    e.raw_body = Some("<html>".into());
    e.retry_after = Some(std::time::Duration::from_secs(3));
    assert_eq!(e.to_string(), "409: m");
    assert_eq!(
        format!("{e:?}"),
        "ApiError { operation: \"get_context\", status: 409, code: Some(\"busy\"), \
         message: \"m\", request_id: Some(\"r_1\"), raw_body: Some(\"<html>\"), \
         query_id: Some(\"q_1\"), retry_after: Some(3s), rate_limits: RateLimits([]) }"
    );
}

#[test]
fn accessors_answer_for_every_variant() {
    let full = api_err_with_ids(404, "nope", "r_a", "q_a");
    let full = Error::Api(Box::new(full));
    assert_eq!(full.status(), Some(http::StatusCode::NOT_FOUND));
    assert_eq!(full.code(), Some("nope"));
    assert_eq!(full.request_id(), Some("r_a"));
    assert_eq!(full.query_id(), Some("q_a"));
    assert_eq!(full.as_api().map(|e| e.status), Some(404));
    assert_eq!(full.retry_after(), None);
    assert!(full.is_not_found() && !full.is_conflict() && !full.is_timeout());
    let bare = api("get_context", 409);
    assert_eq!(
        (bare.code(), bare.request_id(), bare.query_id()),
        (None, None, None)
    );
    assert!(bare.is_conflict() && !bare.is_not_found());
    assert_eq!(
        with_retry_after("get_context", 429).retry_after(),
        Some(std::time::Duration::from_secs(2))
    );
    for (name, e) in others() {
        let status = match name {
            "version" => Some(400),
            "unauthorized" => Some(401),
            _ => None,
        };
        assert_eq!(e.status().map(|s| s.as_u16()), status, "{name}");
        let code = (name == "version").then_some("unsupported_api_version");
        assert_eq!(e.code(), code, "{name}");
        let request_id = match name {
            "version" => Some("r_v"),
            "unauthorized" => Some("r_u"),
            _ => None,
        };
        assert_eq!(e.request_id(), request_id, "{name}");
        let query_id = match name {
            "turn_failed" => Some("q_f"),
            "turn_cancelled" => Some("q_c"),
            "busy" => Some("q_b"),
            "stream" => Some("q_s"),
            "gap" => Some("q_g"),
            "mismatch" => Some("q_m"),
            _ => None,
        };
        assert_eq!(e.query_id(), query_id, "{name}");
        assert!(e.as_api().is_none(), "{name}");
        assert_eq!(e.retry_after(), None, "{name}");
        assert!(!e.is_not_found(), "{name}");
        assert_eq!(e.is_conflict(), name == "busy", "{name}");
        assert_eq!(e.is_timeout(), name == "timeout", "{name}");
        assert_eq!(
            e.is_retryable(),
            matches!(name, "transport" | "timeout"),
            "{name}"
        );
        let started = matches!(name, "stream" | "gap" | "mismatch");
        assert_eq!(e.may_have_started(), started, "{name}");
    }
    assert_eq!(
        Error::SessionBusy {
            query_id: String::new()
        }
        .query_id(),
        None
    );
    assert_eq!(
        Error::Stream {
            query_id: None,
            message: "x".into()
        }
        .query_id(),
        None
    );
}

#[test]
fn retry_and_started_advice_for_every_answer() {
    // (operation, status, Retry-After, retryable, may have started)
    let cases = [
        ("create_query", 429, false, true, false),
        ("create_query", 503, true, true, false),
        ("create_query", 503, false, false, true),
        ("create_query", 500, true, false, true),
        ("query_turn", 502, false, false, true),
        ("create_query", 408, false, false, true),
        ("create_query", 404, false, false, false),
        ("create_query", 499, false, false, false),
        ("get_context", 408, false, true, false),
        ("get_context", 429, false, true, false),
        ("get_context", 500, false, true, false),
        ("get_context", 599, false, true, false),
        ("get_context", 503, true, true, false),
        ("get_context", 404, false, false, false),
        ("get_context", 600, false, false, false),
    ];
    for (operation, status, ra, retryable, started) in cases {
        let e = if ra {
            with_retry_after(operation, status)
        } else {
            api(operation, status)
        };
        assert_eq!(e.is_retryable(), retryable, "{operation} {status} {ra}");
        assert_eq!(e.may_have_started(), started, "{operation} {status} {ra}");
    }
    // (operation, connect failure, reached server, retryable, may have started)
    let cases = [
        ("create_query", true, false, true, false),
        ("create_query", false, true, false, true),
        ("query_turn", false, true, false, true),
        ("list_contexts", true, false, true, false),
        ("list_contexts", false, true, true, false),
    ];
    for (operation, connect, reached, retryable, started) in cases {
        let e = Error::transport(operation, "reset", connect);
        assert_eq!(
            e.may_have_reached_server(),
            reached,
            "{operation} {connect}"
        );
        assert_eq!(e.is_retryable(), retryable, "{operation} {connect}");
        assert_eq!(e.may_have_started(), started, "{operation} {connect}");
    }
    for (operation, turn) in [
        ("create_query", true),
        ("query_turn", true),
        ("list_contexts", false),
    ] {
        let e = Error::Timeout {
            operation,
            elapsed_ms: 1,
            query_id: None,
        };
        assert!(e.may_have_reached_server());
        assert_eq!(
            (e.is_retryable(), e.may_have_started()),
            (!turn, turn),
            "{operation}"
        );
        assert_eq!(starts_turn(operation), turn);
    }
}

#[test]
fn naming_a_query_keeps_one_already_named() {
    let e = api("get_query", 404).for_query("q_1").for_query("q_2");
    assert_eq!(e.query_id(), Some("q_1"));
    let other = Error::InvalidRequest("x".into()).for_query("q_1");
    assert_eq!(other.query_id(), None);
}

#[test]
fn helpers_keep_their_numbers_and_bytes() {
    assert_eq!(millis(std::time::Duration::from_millis(1_500)), 1_500);
    assert_eq!(millis(std::time::Duration::MAX), u64::MAX);
    assert_eq!(snippet(b"short body"), "short body");
    assert_eq!(snippet(&[0xff, b'a']), "\u{fffd}a");
}

/// An error of every kind that carries a cause, its cause nested once more.
fn with_causes() -> Vec<Error> {
    #[derive(Debug, thiserror::Error)]
    #[error("tls handshake")]
    struct Outer(#[source] std::io::Error);
    let nested = Outer(std::io::Error::other("certificate expired"));
    vec![
        Error::transport("list_contexts", nested, true),
        Error::transport("list_contexts", "connection reset", false),
        Error::Io {
            operation: "import_dir",
            action: "read",
            path: "/data/a.md".into(),
            source: std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied"),
        },
    ]
}

#[test]
fn every_cause_is_printed_once_along_the_chain() {
    let mut kinds = std::collections::BTreeSet::new();
    let all = others()
        .into_iter()
        .map(|(_, e)| e)
        .chain(with_causes())
        .chain([api("get_context", 500)]);
    for e in all {
        let mut texts = vec![e.to_string()];
        let mut next = std::error::Error::source(&e);
        while let Some(cause) = next {
            texts.push(cause.to_string());
            next = cause.source();
        }
        if texts.len() > 1 {
            kinds.insert(
                format!("{e:?}")
                    .split([' ', '(', '{'])
                    .next()
                    .unwrap_or_default()
                    .to_owned(),
            );
        }
        for (i, outer) in texts.iter().enumerate() {
            for inner in &texts[i + 1..] {
                assert!(
                    !outer.contains(inner.as_str()),
                    "{outer:?} repeats {inner:?}"
                );
            }
        }
    }
    // Every variant with a cause was walked.
    assert_eq!(kinds.into_iter().collect::<Vec<_>>(), ["Io", "Transport"]);
}
