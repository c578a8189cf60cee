//! Metadata-filter validation, with property tests.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::obj;
use crate::mcp::pinecone::filter::validate_filter;

fn filter_err(v: Value) -> (String, String) {
    let e = validate_filter(&obj(v)).unwrap_err();
    (e.field, e.message)
}

#[test]
fn valid_filters_pass() {
    for f in [
        json!({"year": 2020}),
        json!({"tags": ["a", "b"]}),
        json!({"tags": []}),
        json!({"year": {"$gte": 2000, "$lt": 2030}}),
        json!({"author": {"$in": ["a", 1, true]}}),
        json!({"$or": [{"a": 1}, {"b": {"$ne": "x"}}]}),
        json!({"title": {"$exists": true}}),
    ] {
        assert!(validate_filter(&obj(f.clone())).is_ok(), "{f}");
    }
}

#[test]
fn invalid_filters_name_the_path() {
    assert_eq!(
        filter_err(json!({"year": {"$regex": "x"}})).0,
        "year.$regex"
    );
    assert_eq!(
        filter_err(json!({"tags": {"$in": "x"}})),
        (
            "tags.$in".into(),
            "Operator \"$in\" at \"tags\" must use an array of primitive values.".into()
        )
    );
    assert_eq!(
        filter_err(json!({"tags": {"$nin": []}})).1,
        "Operator \"$nin\" at \"tags\" must contain at least one value."
    );
    assert_eq!(
        filter_err(json!({"a": null})),
        ("a".into(), "Invalid null/undefined at \"a\".".into())
    );
    assert_eq!(
        filter_err(json!({"$and": []})).1,
        "Operator \"$and\" at \"$and\" must contain at least one filter object."
    );
    assert_eq!(
        filter_err(json!({"$and": [{"a": 1}, 3]})),
        (
            "$and.1".into(),
            "Operator \"$and\" at \"$and.1\" must use an array of filter objects.".into()
        )
    );
    assert_eq!(
        filter_err(json!({"$or": [{"a": {"$in": []}}]})).0,
        "$or.0.a.$in"
    );
    assert_eq!(filter_err(json!({"a": {"nested": 1}})).0, "a.nested");
    assert_eq!(
        filter_err(json!({"a": {"$eq": [1]}})).1,
        "Operator \"$eq\" at \"a\" must use a primitive value."
    );
    assert_eq!(
        filter_err(json!({"a": {"$exists": 1}})).1,
        "Operator \"$exists\" at \"a\" must use a boolean value."
    );
}

fn primitive() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<bool>().prop_map(Value::from),
        any::<i32>().prop_map(Value::from),
        "[a-z]{0,6}".prop_map(Value::from)
    ]
}

fn valid_filter() -> impl Strategy<Value = Value> {
    let leaf = (
        "[a-z]{1,5}",
        prop_oneof![
            primitive(),
            (
                prop_oneof![Just("$eq"), Just("$ne"), Just("$gt"), Just("$lte")],
                primitive()
            )
                .prop_map(|(op, v)| json!({op: v})),
            (
                prop_oneof![Just("$in"), Just("$nin")],
                prop::collection::vec(primitive(), 1..5)
            )
                .prop_map(|(op, v)| json!({op: v})),
        ],
    )
        .prop_map(|(k, v)| json!({k: v}));
    leaf.prop_recursive(4, 32, 4, |inner| {
        (
            prop_oneof![Just("$and"), Just("$or")],
            prop::collection::vec(inner, 1..4),
        )
            .prop_map(|(op, v)| json!({op: v}))
    })
}

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![Just(Value::Null), primitive()];
    leaf.prop_recursive(5, 64, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop_oneof![
                        Just("$and".to_owned()),
                        Just("$in".to_owned()),
                        Just("$or".to_owned()),
                        Just("$bad".to_owned()),
                        "[a-z]{1,3}"
                    ],
                    inner
                ),
                0..4
            )
            .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn generated_valid_filters_are_accepted(f in valid_filter()) {
        prop_assert!(validate_filter(f.as_object().unwrap()).is_ok(), "{}", f);
    }

    #[test]
    fn validation_never_panics_and_errors_point_into_the_filter(v in any_json()) {
        if let Value::Object(m) = &v
            && let Err(e) = validate_filter(m)
        {
            prop_assert!(!e.message.is_empty());
            let root = e.field.split('.').next().unwrap_or("");
            prop_assert!(e.field.is_empty() || m.contains_key(root), "{} not in {}", e.field, v);
        }
    }

    #[test]
    fn large_mixed_in_lists_are_accepted(n in 900usize..1100) {
        let values: Vec<Value> = (0..n).map(|i| match i % 3 { 0 => json!(i), 1 => json!(format!("s{i}")), _ => json!(i % 2 == 0) }).collect();
        let filter = obj(json!({"f": {"$in": values}}));
        prop_assert!(validate_filter(&filter).is_ok());
    }
}
