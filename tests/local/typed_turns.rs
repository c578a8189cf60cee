//! Typed turns against the local Nexus: a nested struct with enums and
//! optional fields round-trips through `shape_of`, in each of the three
//! ways to run a turn, and an `output_json` that does not fit names the
//! field path.
use futures::StreamExt;
use nexus_knowql::local::LocalNexus;
use nexus_knowql::typed::{ShapeOf, decode, shape_for};
use nexus_knowql::{Error, QueryEvent};
use schemars::JsonSchema;
use serde::Deserialize;

#[derive(Debug, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "lowercase")]
enum Mode {
    /// Events as they come.
    Stream,
    /// Started now, read later.
    Background,
}

#[derive(Debug, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "snake_case")]
enum Verb {
    Post,
    Get,
}

#[derive(Debug, Deserialize, JsonSchema, PartialEq)]
struct Request {
    /// The HTTP verb to resume with.
    verb: Option<Verb>,
    /// The header that carries the last id.
    header: String,
}

#[derive(Debug, Deserialize, JsonSchema, PartialEq)]
struct Resume {
    /// How to resume a broken stream.
    how: String,
    /// Which mode the answer is about.
    mode: Mode,
    /// The request that resumes.
    request: Request,
    /// The steps, in order.
    steps: Vec<String>,
    /// A number mentioned, if any.
    retries: Option<u32>,
    /// Anything else worth noting.
    note: Option<String>,
}

async fn local() -> (LocalNexus, nexus_knowql::Client) {
    let corpus = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/corpus");
    let nexus = LocalNexus::builder()
        .context("docs", corpus)
        .start()
        .await
        .unwrap();
    let client = nexus.client().unwrap();
    (nexus, client)
}

const QUESTION: &str = "How do I resume a broken stream?";

#[tokio::test]
async fn a_nested_struct_with_enums_and_options_round_trips_three_ways() {
    let (_nexus, client) = local().await;
    let session = client.session(["docs"]).build().unwrap();
    let sent = session
        .ask(QUESTION)
        .shape_of::<Resume>()
        .send()
        .await
        .unwrap();
    let output = sent.query.output_json.clone().expect("output_json");
    assert!(
        output.contains_key("request") && output.contains_key("mode"),
        "{output:?}"
    );
    assert!(!sent.value.how.is_empty() && !sent.value.request.header.is_empty());
    assert!(!sent.value.steps.is_empty());
    // The value is exactly the output_json, decoded.
    let again: Resume = serde_json::from_value(serde_json::Value::Object(output)).unwrap();
    assert_eq!(again, sent.value);

    let mut streamed = session
        .ask(QUESTION)
        .shape_of::<Resume>()
        .stream()
        .await
        .unwrap();
    let mut text = String::new();
    while let Some(event) = streamed.next().await {
        if let QueryEvent::TextDelta { delta } = event.unwrap() {
            text.push_str(&delta);
        }
    }
    let typed = streamed.finish().await.unwrap();
    assert_eq!(text, typed.query.answer_text());
    assert_eq!(typed.value.mode, sent.value.mode);

    let mut handle = session
        .ask(QUESTION)
        .shape_of::<Resume>()
        .background()
        .await
        .unwrap();
    let waited = handle
        .wait(nexus_knowql::WaitPolicy::default())
        .await
        .unwrap();
    assert_eq!(waited.value.request, sent.value.request);
}

#[test]
fn the_shape_is_the_subset_with_refs_inlined_and_options_not_required() {
    let shape = serde_json::Value::Object(shape_for::<Resume>().unwrap());
    let text = shape.to_string();
    for gone in [
        "$ref", "$defs", "$schema", "format", "minimum", "null", "oneOf", "anyOf", "title",
    ] {
        assert!(!text.contains(gone), "{gone} in {text}");
    }
    assert_eq!(
        shape["required"],
        serde_json::json!(["how", "mode", "request", "steps"])
    );
    assert_eq!(
        shape["properties"]["mode"]["enum"],
        serde_json::json!(["stream", "background"])
    );
    assert_eq!(
        shape["properties"]["request"]["properties"]["verb"]["enum"],
        serde_json::json!(["post", "get"])
    );
    assert_eq!(
        shape["properties"]["request"]["required"],
        serde_json::json!(["header"])
    );
    assert_eq!(shape["properties"]["retries"]["type"], "integer");
    // Types outside the subset are refused with the field's path.
    #[derive(JsonSchema)]
    #[allow(dead_code)]
    enum WithData {
        A(String),
        B { n: u32 },
    }
    #[derive(JsonSchema)]
    #[allow(dead_code)]
    struct Holder {
        inner: Vec<WithData>,
    }
    let e = shape_for::<Holder>().unwrap_err();
    assert!(
        matches!(e, Error::InvalidRequest(_)) && e.to_string().contains("inner[]"),
        "{e}"
    );
    #[derive(JsonSchema)]
    #[allow(dead_code)]
    struct Node {
        next: Option<Box<Node>>,
    }
    assert!(
        shape_for::<Node>()
            .unwrap_err()
            .to_string()
            .contains("itself")
    );
}

#[test]
fn a_wrong_output_json_names_the_field_path() {
    let shape = shape_for::<Resume>().unwrap();
    let good = serde_json::json!({
        "how": "reconnect", "mode": "stream", "steps": ["a"],
        "request": { "header": "Last-Event-ID", "verb": "get" }, "note": null
    });
    let value: Resume = decode(&shape, good.as_object()).unwrap();
    assert_eq!(value.request.verb, Some(Verb::Get));
    let cases = [
        (
            serde_json::json!({"how": "x", "mode": "stream", "steps": [], "request": {"header": "h", "verb": "put"}}),
            "request.verb",
        ),
        (
            serde_json::json!({"how": "x", "mode": "stream", "steps": [], "request": {}}),
            "request.header",
        ),
        (
            serde_json::json!({"how": "x", "mode": "stream", "steps": ["a", 7], "request": {"header": "h"}}),
            "steps[1]",
        ),
        (
            serde_json::json!({"how": "x", "mode": "stream", "steps": [], "request": {"header": "h"}, "retries": -3}),
            "retries",
        ),
        (
            serde_json::json!({"how": "x", "mode": "fast", "steps": [], "request": {"header": "h"}}),
            "mode",
        ),
    ];
    for (bad, path) in cases {
        let e = decode::<Resume>(&shape, bad.as_object()).unwrap_err();
        assert!(matches!(e, Error::Decode { .. }), "{e:?}");
        assert!(e.to_string().contains(&format!("`{path}`")), "{path}: {e}");
    }
    // The schema check passes what only the type rules out; the decode names it too.
    let e = decode::<Resume>(
        &serde_json::Map::new(),
        serde_json::json!({"how": "x", "mode": "stream", "steps": [], "request": {"header": 5}})
            .as_object(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("request.header"), "{e}");
    assert!(
        decode::<Resume>(&shape, None)
            .unwrap_err()
            .to_string()
            .contains("no output_json")
    );
}
