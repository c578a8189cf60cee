//! Properties of decoding what a server sends: arbitrary bytes to the SSE
//! parser and arbitrary JSON to event decoding never panic, and how the
//! bytes are split never changes the events.
//!
//! CI runs 512 cases per property (a few seconds); `PROPTEST_CASES` sets
//! another number, for example a long local session:
//! `PROPTEST_CASES=100000 cargo test --release --test sdk decode_props`.

use crate::support::props::regressions_beside_source;
use nexus_knowql::QueryEvent;
use nexus_knowql::query::{EventDecoder, names};
use proptest::prelude::*;

/// Everything a decoder yields for `chunks`: events, then the error (if any).
fn decode_all(chunks: &[&[u8]], limit: usize) -> (Vec<(Option<u64>, QueryEvent)>, bool) {
    let (events, error) = decode_with_error(chunks, limit);
    (events, error.is_some())
}

/// Like [`decode_all`], with the error's text.
fn decode_with_error(
    chunks: &[&[u8]],
    limit: usize,
) -> (Vec<(Option<u64>, QueryEvent)>, Option<String>) {
    let mut decoder = EventDecoder::with_max_frame_bytes(limit);
    let mut out = Vec::new();
    for chunk in chunks {
        decoder.feed(chunk);
        loop {
            match decoder.next_event() {
                Ok(Some(e)) => out.push(e),
                Ok(None) => break,
                Err(e) => return (out, Some(e.to_string())),
            }
        }
    }
    (out, None)
}

/// Bytes that look like an event stream often enough to reach deep states:
/// field names, line endings, digits, a BOM, JSON and random bytes.
fn sse_bytes() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(b"data: ".to_vec()),
        Just(b"data:".to_vec()),
        Just(b"id: ".to_vec()),
        Just(b"event: ".to_vec()),
        Just(b"event: query".to_vec()),
        Just(b"retry: ".to_vec()),
        Just(b"retry: 18446744073709551615".to_vec()),
        Just(b"id: 99999999999999999999999".to_vec()),
        Just(b": comment".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\n\n".to_vec()),
        Just(b"\xEF\xBB\xBF".to_vec()),
        // Multi-byte characters, so that splits land inside them.
        Just("é".as_bytes().to_vec()),
        Just("€".as_bytes().to_vec()),
        Just("✈️".as_bytes().to_vec()),
        Just("data: Grüße 😀 ".as_bytes().to_vec()),
        Just(br#"{"type":"response.output_text.delta","delta":"x"}"#.to_vec()),
        Just(names::TEXT_DELTA.as_bytes().to_vec()),
        Just(names::STEP.as_bytes().to_vec()),
        "[0-9]{1,25}".prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..16),
    ];
    proptest::collection::vec(piece, 0..64).prop_map(|p| p.concat())
}

/// Arbitrary JSON values, nested a few levels.
fn json() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<u64>().prop_map(serde_json::Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(serde_json::Value::from),
        ".{0,12}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
            proptest::collection::btree_map(
                prop_oneof![
                    Just("delta".to_owned()),
                    Just("query_id".to_owned()),
                    Just("step_id".to_owned()),
                    Just("cum_input_tokens".to_owned()),
                    Just("cum_output_tokens".to_owned()),
                    Just("type".to_owned()),
                    Just("id".to_owned()),
                    Just("status".to_owned()),
                    Just("usage".to_owned()),
                    Just("error".to_owned()),
                    "[a-z_]{1,8}",
                ],
                inner,
                0..6
            )
            .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

const EVENT_NAMES: &[&str] = &[
    names::CREATED,
    names::STEP,
    names::TEXT_DELTA,
    names::TURN_ROLLUP,
    names::SYNTHESIS,
    names::TRACE,
    names::COMPLETED,
    names::FAILED,
    names::CANCELLED,
    names::QUERY,
    "message",
    "response.future_thing",
];

/// 512 cases unless `PROPTEST_CASES` says otherwise.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    regressions_beside_source(ProptestConfig::with_cases(cases))
}

#[test]
fn the_default_frame_limit_is_4_mib() {
    // A frame just under 4 MiB decodes with the default decoder; one just
    // over is an error. Catches a default limit of another size.
    let frame = |data_len: usize| {
        let mut wire = b"event: response.future_thing\ndata: ".to_vec();
        wire.resize(wire.len() + data_len, b'x');
        wire.extend_from_slice(b"\n\n");
        wire
    };
    let limit = 4 * 1024 * 1024;
    let mut decoder = EventDecoder::new();
    decoder.feed(&frame(limit - 64));
    assert!(matches!(decoder.next_event(), Ok(Some(_))));
    let mut decoder = EventDecoder::new();
    decoder.feed(&frame(limit + 1));
    assert!(decoder.next_event().is_err());
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bytes_never_panic_and_splits_do_not_matter(
        bytes in sse_bytes(),
        split in 1usize..40,
        limit in prop_oneof![Just(16usize), Just(256usize), Just(1 << 20)],
    ) {
        // Splits change nothing: the same events, then the same error (or
        // none) at the same place. Catches a parser that decodes each chunk
        // as UTF-8 on its own (a character split across chunks then fails or
        // is replaced) and one that checks the frame limit per chunk.
        let (whole, whole_error) = decode_with_error(&[&bytes], limit);
        let chunks: Vec<&[u8]> = bytes.chunks(split).collect();
        let (pieces, pieces_error) = decode_with_error(&chunks, limit);
        prop_assert_eq!(&whole, &pieces);
        prop_assert_eq!(whole_error, pieces_error);
    }

    #[test]
    fn text_split_inside_characters_decodes_alike(
        text in "[a-zé€✈😀 ]{0,40}",
        split in 1usize..5,
    ) {
        // Valid UTF-8 split at every few bytes, most often inside a character:
        // the decoded text is exactly the text sent.
        let wire = format!("id: 1\nevent: response.output_text.delta\ndata: {{\"delta\":{}}}\n\n",
            serde_json::Value::from(text.clone()));
        let chunks: Vec<&[u8]> = wire.as_bytes().chunks(split).collect();
        let (events, error) = decode_with_error(&chunks, 1 << 20);
        prop_assert_eq!(error, None);
        prop_assert_eq!(events, vec![(Some(1), QueryEvent::TextDelta { delta: text })]);
    }

    #[test]
    fn raw_random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_all(&[&bytes], 1 << 20);
    }

    #[test]
    fn arbitrary_json_never_panics_any_event(
        value in json(),
        name in proptest::sample::select(EVENT_NAMES),
    ) {
        let data = value.to_string();
        let event = QueryEvent::decode(name, &data);
        // Whatever does not fit is kept raw, never lost.
        if let QueryEvent::Unknown { data: kept, .. } = &event {
            prop_assert_eq!(kept, &data);
        }
        // Through the SSE decoder too, with an id.
        let wire = format!("id: 7\nevent: {name}\ndata: {data}\n\n");
        let (events, failed) = decode_all(&[wire.as_bytes()], 1 << 20);
        prop_assert!(!failed);
        prop_assert_eq!(events.len(), 1);
        prop_assert_eq!(events[0].0, Some(7));
    }
}
