//! Fidelity of the generated types (`nexus_knowql::types`): JSON instances
//! generated from the spec's own schemas, the generated type of every
//! component schema, and [`normalise`], the one statement of what a decode
//! and encode through those types may change.
#![allow(dead_code, unreachable_pub)]

use std::borrow::Cow;

use chrono::{DateTime, FixedOffset, SecondsFormat, Utc};
use nexus_knowql::types;
use proptest::prelude::*;
use proptest::strategy::Union;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// The spec as JSON.
pub fn spec() -> Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/openapi/nexus_2026-07.oas.yaml"
    ))
    .expect("read the spec");
    let yaml: serde_yaml::Value = serde_yaml::from_str(&text).expect("parse the spec");
    serde_json::to_value(yaml).expect("the spec as JSON")
}

/// The component schemas of the spec, by name.
pub fn component_schemas(spec: &Value) -> &Map<String, Value> {
    spec["components"]["schemas"]
        .as_object()
        .expect("components.schemas")
}

/// Decodes a JSON document with a generated type and encodes it again.
pub type RoundTrip = fn(&Value) -> Result<Value, String>;

/// `value` decoded as `T` and encoded again, or why it did not decode.
pub fn round_trip<T: DeserializeOwned + Serialize>(value: &Value) -> Result<Value, String> {
    let decoded: T = serde_json::from_value(value.clone()).map_err(|e| format!("decode: {e}"))?;
    serde_json::to_value(&decoded).map_err(|e| format!("encode: {e}"))
}

macro_rules! registry {
    ($($name:ident),* $(,)?) => {
        vec![$((stringify!($name), round_trip::<types::$name> as RoundTrip)),*]
    };
}

/// The generated type of every component schema, by schema name. A schema
/// missing here fails `every_schema_has_a_generated_type`.
pub fn registry() -> Vec<(&'static str, RoundTrip)> {
    // The open enums the crate generates as its own typed enums.
    let typed: Vec<(&'static str, RoundTrip)> = vec![
        ("Workflow", round_trip::<nexus_knowql::Workflow>),
        ("TaskState", round_trip::<nexus_knowql::TaskStatus>),
    ];
    let generated = registry![
        Error,
        Project,
        ProjectWithWorkspaces,
        ContextKind,
        ContextStats,
        TemplateMatch,
        ManifestSuggestion,
        ContextResponse,
        CreateContextRequest,
        UpdateContextRequest,
        WorkflowTriggerResponse,
        DirListing,
        FileStats,
        SourceStats,
        TaskFileListing,
        TaskFileMetadata,
        Manifest,
        CurateManifest,
        ChunksConfig,
        ChunkingConfig,
        ArtifactsConfig,
        ArtifactType,
        EdgeType,
        OptimizeManifest,
        ManifestTemplateCatalog,
        ManifestTemplate,
        SourceManifestEntry,
        CorpusGroup,
        PointerEntry,
        GlossaryEntry,
        ArtifactReclaim,
        ChunkReclaim,
        SourceRemoved,
        CurationState,
        PackDetails,
        PackTaskOutput,
        ConnectorView,
        ContextConnectorView,
        ConnectorItem,
        QueryRequest,
        QueryComparisonMember,
        Citation,
        QueryStep,
        Query,
        Session,
        ModelCatalog,
        QueryEvent,
        Trace,
        TraceStep,
        TraceCall,
        TaskResponse,
        TaskProgress,
        TaskStep,
        TaskStats,
        TaskInput,
        SearchInput,
        CurateInput,
        ImportInput,
        PreviewLimits,
        PackInput,
        RestoreInput,
        ExploreInput,
        ProfileInput,
        CandidateQuery,
        OptimizeInput,
        GroomInput,
        TaskOutput,
        ModelUsage,
        SeamUsage,
        ChatUsage,
        CurateUsage,
        SearchTurnCompletedOutput,
        SearchCcTurnCompletedOutput,
        SearchTurnFailedOutput,
        RestoreTaskOutput,
        OptimizeNoopOutput,
        OptimizeResultOutput,
        GroomMetricsOutput,
        CurateNoopOutput,
        CurateRunOutput,
        CurateManifestTuneOutput,
        ExploreOutput,
        ProfileEmptyOutput,
        ProfileEstimateOutput,
        ProfileTierCost,
        ImportOutput,
        ImportManifestEntry,
        StatusErrorOutput,
        StateFailedOutput,
    ];
    typed.into_iter().chain(generated).collect()
}

/// The round trip of the generated type named `name`.
pub fn round_trip_of(name: &str) -> RoundTrip {
    registry()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, f)| f)
        .unwrap_or_else(|| panic!("no generated type registered for schema {name}"))
}

/// The schema with `$ref`s followed and `allOf` merged into one object
/// schema; `nullable` on the outer schema carries over.
pub fn flatten<'a>(spec: &'a Value, schema: &'a Value) -> Cow<'a, Value> {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let name = r
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("unsupported $ref {r}"));
        let target = component_schemas(spec)
            .get(name)
            .unwrap_or_else(|| panic!("unresolved $ref {r}"));
        return flatten(spec, target);
    }
    let Some(parts) = schema.get("allOf").and_then(Value::as_array) else {
        return Cow::Borrowed(schema);
    };
    let nullable = is_nullable(schema);
    let own_properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .is_some_and(|p| !p.is_empty());
    let mut merged = if parts.len() == 1 && !own_properties {
        // `allOf: [X]` with `nullable` or `type` beside it: X itself.
        flatten(spec, &parts[0]).into_owned()
    } else {
        let mut properties = Map::new();
        let mut required = Vec::new();
        let mut extra = None;
        let own = std::iter::once(schema.clone());
        for part in parts
            .iter()
            .map(|p| flatten(spec, p).into_owned())
            .chain(own)
        {
            if let Some(p) = part.get("properties").and_then(Value::as_object) {
                properties.extend(p.clone());
            }
            if let Some(r) = part.get("required").and_then(Value::as_array) {
                required.extend(r.iter().cloned());
            }
            if let Some(a) = part.get("additionalProperties") {
                extra = Some(a.clone());
            }
        }
        let mut object = serde_json::json!({
            "type": "object",
            "properties": properties,
            "required": required,
        });
        if let Some(a) = extra {
            object["additionalProperties"] = a;
        }
        object
    };
    if nullable {
        merged["nullable"] = Value::Bool(true);
    }
    Cow::Owned(merged)
}

fn is_nullable(schema: &Value) -> bool {
    schema.get("nullable").and_then(Value::as_bool) == Some(true)
}

fn branches(schema: &Value) -> Option<&Vec<Value>> {
    schema
        .get("anyOf")
        .or_else(|| schema.get("oneOf"))
        .and_then(Value::as_array)
}

fn properties(schema: &Value) -> Option<&Map<String, Value>> {
    schema.get("properties").and_then(Value::as_object)
}

fn required(schema: &Value) -> Vec<&str> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// What an object schema says about properties it does not declare:
/// `Some(schema)` when they are allowed (with the schema their values
/// follow; `true` is any value), `None` when they are not. An object schema
/// that declares properties and says nothing about others is closed: the
/// spec declares every field the service sends.
fn extra_properties(schema: &Value) -> Option<Value> {
    match schema.get("additionalProperties") {
        Some(Value::Bool(true)) => Some(Value::Object(Map::new())),
        Some(Value::Bool(false)) => None,
        Some(s) => Some(s.clone()),
        None if properties(schema).is_none_or(Map::is_empty) => Some(Value::Object(Map::new())),
        None => None,
    }
}

fn schema_type(schema: &Value) -> Option<&str> {
    schema.get("type").and_then(Value::as_str)
}

/// A map-shaped object schema: no declared properties.
fn is_map(schema: &Value) -> bool {
    schema_type(schema) == Some("object") && properties(schema).is_none_or(Map::is_empty)
}

/// Whether `value` is an instance of `schema` (the OpenAPI 3.0 subset the
/// spec uses; `x-enum` is open; see [`extra_properties`] for undeclared
/// fields).
pub fn conforms(spec: &Value, schema: &Value, value: &Value) -> bool {
    let schema = flatten(spec, schema);
    let schema = schema.as_ref();
    if value.is_null() {
        return is_nullable(schema) || schema.as_object().is_some_and(Map::is_empty);
    }
    if let Some(branches) = branches(schema) {
        return branches.iter().any(|b| conforms(spec, b, value));
    }
    match schema_type(schema) {
        Some("object") => {
            let Some(object) = value.as_object() else {
                return false;
            };
            let declared = properties(schema);
            let extra = extra_properties(schema);
            required(schema).iter().all(|r| object.contains_key(*r))
                && object
                    .iter()
                    .all(|(k, v)| match (declared.and_then(|d| d.get(k)), &extra) {
                        (Some(p), _) => conforms(spec, p, v),
                        (None, Some(e)) => conforms(spec, e, v),
                        (None, None) => false,
                    })
        }
        Some("array") => value.as_array().is_some_and(|items| {
            let item = schema.get("items").cloned().unwrap_or_default();
            items.iter().all(|v| conforms(spec, &item, v))
        }),
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        _ => true,
    }
}

/// THE normalisation: what decoding a document with the generated types and
/// encoding it again may change. Applied to both documents before they are
/// compared, directed by `schema`; everything else must come back unchanged.
///
/// 1. An optional property (not in `required`) that is `null`, equal to the
///    schema's `default`, or an empty array or empty map is the same as an
///    absent one (the generated fields are `Option`s, defaults and empty
///    collections that are skipped when encoding). A required property keeps
///    its `null`, `[]` and `{}`.
/// 2. A `format: date-time` string is the instant it names (`+02:00` and
///    `Z`, `.5` and `.500` write the same instant).
/// 3. A `type: number` is its `f64` value (`1` and `1.0` are the same).
///
/// In a union (`anyOf`/`oneOf`) the rules of the first branch the document
/// is an instance of apply.
pub fn normalise(spec: &Value, schema: &Value, value: &Value) -> Value {
    let schema = flatten(spec, schema);
    let schema = schema.as_ref();
    if value.is_null() {
        return Value::Null;
    }
    if let Some(branches) = branches(schema) {
        return match branches.iter().find(|b| conforms(spec, b, value)) {
            Some(branch) => normalise(spec, branch, value),
            None => value.clone(),
        };
    }
    match (schema_type(schema), value) {
        (Some("object") | None, Value::Object(object)) => {
            let declared = properties(schema);
            let required = required(schema);
            let extra = extra_properties(schema);
            let mut out = Map::new();
            for (k, v) in object {
                let (property, optional) = match declared.and_then(|d| d.get(k)) {
                    Some(p) => (Some(p.clone()), !required.contains(&k.as_str())),
                    None => (extra.clone(), false),
                };
                let Some(property) = property else {
                    out.insert(k.clone(), v.clone());
                    continue;
                };
                let v = normalise(spec, &property, v);
                if optional && is_unset(spec, &property, &v) {
                    continue;
                }
                out.insert(k.clone(), v);
            }
            Value::Object(out)
        }
        (Some("array"), Value::Array(items)) => {
            let item = schema.get("items").cloned().unwrap_or_default();
            Value::Array(items.iter().map(|v| normalise(spec, &item, v)).collect())
        }
        (Some("string"), Value::String(s))
            if schema.get("format").and_then(Value::as_str) == Some("date-time") =>
        {
            match DateTime::parse_from_rfc3339(s) {
                Ok(t) => Value::String(
                    t.with_timezone(&Utc)
                        .to_rfc3339_opts(SecondsFormat::Nanos, true),
                ),
                Err(_) => value.clone(),
            }
        }
        (Some("number"), Value::Number(n)) => n
            .as_f64()
            .and_then(serde_json::Number::from_f64)
            .map_or_else(|| value.clone(), Value::Number),
        _ => value.clone(),
    }
}

/// Rule 1 of [`normalise`]: an optional property with this (normalised)
/// value is the same as an absent one.
fn is_unset(spec: &Value, property: &Value, value: &Value) -> bool {
    let property = flatten(spec, property);
    let property = property.as_ref();
    if value.is_null() {
        return true;
    }
    if let Some(default) = property.get("default")
        && normalise(spec, property, default) == *value
    {
        return true;
    }
    match value {
        Value::Array(items) => items.is_empty() && schema_type(property) == Some("array"),
        Value::Object(map) => map.is_empty() && is_map(property),
        _ => false,
    }
}

/// How many elements a generated array or map has at most.
const MAX_ITEMS: usize = 3;

/// Instances of `schema`: every branch of a union, required and optional
/// properties (absent, present, `null` where nullable), known `x-enum`
/// values and unknown strings, arrays, maps and undeclared properties where
/// the schema allows them, integers and strings within the schema's bounds.
pub fn instances(spec: &Value, schema: &Value) -> BoxedStrategy<Value> {
    let schema = flatten(spec, schema);
    let schema = schema.as_ref();
    let value = instances_not_null(spec, schema);
    if is_nullable(schema) {
        prop_oneof![1 => Just(Value::Null), 4 => value].boxed()
    } else {
        value
    }
}

fn instances_not_null(spec: &Value, schema: &Value) -> BoxedStrategy<Value> {
    if let Some(branches) = branches(schema) {
        return Union::new(branches.iter().map(|b| instances(spec, b))).boxed();
    }
    match schema_type(schema) {
        Some("object") => objects(spec, schema),
        Some("array") => {
            let item = instances(spec, &schema.get("items").cloned().unwrap_or_default());
            let min = bound(schema, "minItems").unwrap_or(0) as usize;
            let max = bound(schema, "maxItems").map_or(MAX_ITEMS, |m| (m as usize).min(MAX_ITEMS));
            proptest::collection::vec(item, min..=max.max(min))
                .prop_map(Value::Array)
                .boxed()
        }
        Some("string") => strings(schema),
        Some("integer") => {
            let min = bound(schema, "minimum").unwrap_or(i64::MIN);
            let max = bound(schema, "maximum").unwrap_or(i64::MAX);
            prop_oneof![
                Just(min),
                Just(max),
                (min..=max),
                (min.max(-3)..=max.min(3).max(min.max(-3))),
            ]
            .prop_map(Value::from)
            .boxed()
        }
        Some("number") => prop_oneof![
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            (-1000i64..1000).prop_map(Value::from),
        ]
        .boxed(),
        Some("boolean") => any::<bool>().prop_map(Value::Bool).boxed(),
        _ => any_json(),
    }
}

fn bound(schema: &Value, key: &str) -> Option<i64> {
    schema.get(key).and_then(Value::as_i64)
}

fn objects(spec: &Value, schema: &Value) -> BoxedStrategy<Value> {
    let declared: Vec<(String, Value)> = properties(schema)
        .map(|p| p.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    let required = required(schema);
    let fields: Vec<BoxedStrategy<Option<(String, Value)>>> = declared
        .iter()
        .map(|(name, property)| {
            let is_required = required.contains(&name.as_str());
            let name = name.clone();
            let value = instances(spec, property).prop_map(move |v| Some((name.clone(), v)));
            if is_required {
                value.boxed()
            } else {
                prop_oneof![1 => Just(None), 3 => value].boxed()
            }
        })
        .collect();
    let names: Vec<String> = declared.iter().map(|(k, _)| k.clone()).collect();
    let extra = match extra_properties(schema) {
        Some(values) => proptest::collection::btree_map(
            "[a-zA-Z_é-]{1,8}".prop_filter("undeclared", move |k| !names.contains(k)),
            instances(spec, &values),
            0..=MAX_ITEMS,
        )
        .boxed(),
        None => Just(Default::default()).boxed(),
    };
    (fields, extra)
        .prop_map(|(fields, extra)| {
            let mut object: Map<String, Value> = fields.into_iter().flatten().collect();
            object.extend(extra);
            Value::Object(object)
        })
        .boxed()
}

fn strings(schema: &Value) -> BoxedStrategy<Value> {
    if schema.get("format").and_then(Value::as_str) == Some("date-time") {
        return date_times().prop_map(Value::String).boxed();
    }
    let max = bound(schema, "maxLength").map_or(12, |m| m.min(12)) as usize;
    let min = bound(schema, "minLength").unwrap_or(0) as usize;
    let free = proptest::collection::vec(any::<char>(), min..=max.max(min))
        .prop_map(|c| Value::String(c.into_iter().collect()));
    let known: Vec<Value> = schema
        .get("x-enum")
        .or_else(|| schema.get("enum"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if known.is_empty() {
        free.boxed()
    } else if schema.get("x-enum").is_some() {
        // Open: known values and others.
        prop_oneof![3 => proptest::sample::select(known), 1 => free].boxed()
    } else {
        proptest::sample::select(known).boxed()
    }
}

/// RFC 3339 timestamps between 1970 and 2199 with any offset and 0 to 9
/// fraction digits.
fn date_times() -> impl Strategy<Value = String> {
    (
        0i64..7_258_118_400,
        0u32..1_000_000_000,
        -(23 * 60 + 59)..=(23 * 60 + 59),
        prop_oneof![
            Just(SecondsFormat::Secs),
            Just(SecondsFormat::Millis),
            Just(SecondsFormat::Micros),
            Just(SecondsFormat::Nanos),
            Just(SecondsFormat::AutoSi),
        ],
        any::<bool>(),
    )
        .prop_map(|(secs, nanos, offset_minutes, format, z)| {
            let utc = DateTime::from_timestamp(secs, nanos).expect("in range");
            if z {
                utc.to_rfc3339_opts(format, true)
            } else {
                let offset = FixedOffset::east_opt(offset_minutes * 60).expect("in range");
                utc.with_timezone(&offset).to_rfc3339_opts(format, false)
            }
        })
}

/// Any JSON value, small.
pub fn any_json() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "\\PC{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(2, 12, MAX_ITEMS as u32, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..=MAX_ITEMS).prop_map(Value::Array),
            proptest::collection::btree_map("\\PC{0,6}", inner, 0..=MAX_ITEMS)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
    .boxed()
}

/// Why `document` does not survive a decode and encode with the generated
/// type of `schema_name` (under [`normalise`]), or `None` when it does.
pub fn loss(spec: &Value, schema_name: &str, document: &Value) -> Option<String> {
    let schema = serde_json::json!({ "$ref": format!("#/components/schemas/{schema_name}") });
    loss_as(spec, &schema, round_trip_of(schema_name), document)
}

/// Like [`loss`], for any schema of the spec and the round trip of its
/// generated type.
pub fn loss_as(
    spec: &Value,
    schema: &Value,
    round_trip: RoundTrip,
    document: &Value,
) -> Option<String> {
    let encoded = match round_trip(document) {
        Ok(encoded) => encoded,
        Err(e) => return Some(e),
    };
    let before = normalise(spec, schema, document);
    let after = normalise(spec, schema, &encoded);
    (before != after).then(|| {
        format!(
            "changed by decode and encode:\n  sent:    {before}\n  encoded: {after}\n  {}",
            first_difference(&before, &after, "$")
        )
    })
}

/// The path and values of the first difference between two documents.
pub fn first_difference(a: &Value, b: &Value, at: &str) -> String {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, v) in x {
                match y.get(k) {
                    Some(w) if v == w => {}
                    Some(w) => return first_difference(v, w, &format!("{at}.{k}")),
                    None => return format!("{at}.{k} is missing (was {v})"),
                }
            }
            match y.keys().find(|k| !x.contains_key(*k)) {
                Some(k) => format!("{at}.{k} appeared ({})", y[k]),
                None => format!("{at}: key order"),
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find(|(_, (v, w))| v != w)
            .map(|(i, (v, w))| first_difference(v, w, &format!("{at}[{i}]")))
            .unwrap_or_else(|| format!("{at}: same")),
        _ => format!("{at}: {a} became {b}"),
    }
}

/// The generated type of each operation's JSON success answer, by
/// operationId (the operations that answer with no JSON body or with bytes
/// have none). Error answers decode as `types::Error`.
pub fn answers() -> Vec<(&'static str, RoundTrip)> {
    macro_rules! answers {
        ($($op:ident => $ty:ty),* $(,)?) => {
            vec![$((stringify!($op), round_trip::<$ty> as RoundTrip)),*]
        };
    }
    answers![
        login => types::LoginResponse,
        get_identity => types::GetIdentityResponse,
        get_project => types::ProjectWithWorkspaces,
        list_connectors => Vec<types::ConnectorView>,
        get_connector => types::ConnectorView,
        delete_connector => types::DeleteConnectorResponse,
        start_connector_oauth => types::StartConnectorOauthResponse,
        create_connector => types::ConnectorView,
        list_connector_items => types::ListConnectorItemsResponse,
        list_context_connectors => Vec<types::ContextConnectorView>,
        update_context_connector => types::ContextConnectorView,
        list_contexts => Vec<types::ContextResponse>,
        create_context => types::ContextResponse,
        get_context => types::ContextResponse,
        update_context => types::ContextResponse,
        fork_context => types::ForkContextResponse,
        get_context_manifest => types::Manifest,
        get_context_task_stats => types::ContextStats,
        get_curation_ledger => types::CurationState,
        curate_context => types::WorkflowTriggerResponse,
        optimize_context => types::WorkflowTriggerResponse,
        explore_context => types::WorkflowTriggerResponse,
        profile_context => types::WorkflowTriggerResponse,
        import_context_sources => types::WorkflowTriggerResponse,
        upload_context_source => types::WorkflowTriggerResponse,
        list_source_files => types::DirListing,
        get_source_stats => types::SourceStats,
        get_source_manifest => types::GetSourceManifestResponse,
        list_source_files_by_path => types::DirListing,
        delete_source_file => types::DeleteSourceFileResponse,
        list_knowledge => types::DirListing,
        get_knowledge_stats => types::FileStats,
        list_knowledge_by_path => types::DirListing,
        query => types::Query,
        get_query => types::Query,
        cancel_query => types::Query,
        get_query_trace => types::Trace,
        list_models => types::ModelCatalog,
        list_sessions => types::ListSessionsResponse,
        get_session => types::GetSessionResponse,
        delete_session => types::DeleteSessionResponse,
        get_project_task_stats => types::GetProjectTaskStatsResponse,
        list_manifest_templates => types::ManifestTemplateCatalog,
        list_tasks => types::ListTasksResponse,
        get_task => types::TaskResponse,
        get_task_stats => types::TaskStats,
        get_task_file_metadata => types::TaskFileMetadata,
        list_task_files_by_path => types::TaskFileListing,
        list_task_files => types::TaskFileListing,
        delete_task_file => types::DeleteTaskFileResponse,
    ]
}

/// Why a JSON answer of operation `op` with `status` (its schema in the
/// spec: `schema`) does not survive the SDK's generated type, or `None`.
pub fn answer_loss(
    spec: &Value,
    op: &str,
    status: u16,
    schema: &Value,
    body: &Value,
) -> Option<String> {
    let round_trip = if (200..300).contains(&status) {
        match answers().into_iter().find(|(o, _)| *o == op) {
            Some((_, f)) => f,
            None => return Some(format!("{op}: no generated type registered for its answer")),
        }
    } else {
        round_trip::<types::Error> as RoundTrip
    };
    loss_as(spec, schema, round_trip, body).map(|why| format!("{op} {status}: {why}"))
}
