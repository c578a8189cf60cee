//! The operations of `nexus api` that take a JSON body: the body the user
//! built (`--body`, `-f`, `-F`) is checked against the operation's request
//! schema and then sent as it is, so fields the spec allows beyond the
//! generated types (`additionalProperties`, fields newer than the types)
//! reach the server. The answer is printed as the server sent it.
//!
//! Every such call goes through the generated client's hook, that is the
//! SDK's transport: credentials, `X-Pinecone-Api-Version`, retries and the
//! error details of every other call.

use std::process::ExitCode;

use nexus_knowql::progenitor_client::{ClientHooks, ClientInfo, OperationInfo, encode_path};
use nexus_knowql::reqwest::{Method, header};
use nexus_knowql::{Client, types};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::calls::{done, head};
use super::{Call, failure};
use crate::common::to_json;

/// What a body operation answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// A JSON document.
    Json,
    /// Nothing (its status only).
    Empty,
    /// A login answer, whose token is never printed.
    Login,
}

/// Checks a body against one operation's request schema.
type Check = fn(&Value) -> Result<(), String>;

/// How a body operation's request is checked and its answer read; `None`
/// for an operation without a JSON body.
fn schema_of(op: &str) -> Option<(Check, Answer)> {
    use types as t;
    let found: (Check, Answer) = match op {
        "login" => (check::<t::LoginBody>, Answer::Login),
        "create_connector" => (check::<t::CreateConnectorBody>, Answer::Json),
        "update_context_connector" => (check::<t::UpdateContextConnectorBody>, Answer::Json),
        "create_context" => (check::<t::CreateContextRequest>, Answer::Json),
        "update_context" => (check::<t::UpdateContextRequest>, Answer::Json),
        "fork_context" => (check::<t::ForkContextBody>, Answer::Json),
        "curate_context" => (check::<t::CurateContextBody>, Answer::Json),
        "delete_curated_sources" => (check::<t::DeleteCuratedSourcesBody>, Answer::Empty),
        "optimize_context" => (check::<t::OptimizeContextBody>, Answer::Json),
        "explore_context" => (check::<t::ExploreContextBody>, Answer::Json),
        "profile_context" => (check::<t::ProfileContextBody>, Answer::Json),
        "import_context_sources" => (check::<t::ImportContextSourcesBody>, Answer::Json),
        "query" => (check::<t::QueryRequest>, Answer::Json),
        "create_query_feedback" => (check::<t::CreateQueryFeedbackBody>, Answer::Empty),
        "cancel_task" => (check::<t::CancelTaskBody>, Answer::Empty),
        _ => return None,
    };
    Some(found)
}

/// Whether `body` satisfies the request schema `T` was generated from: its
/// required fields, their types and constraints. Fields `T` does not name
/// are not looked at (the spec allows them) and are sent unchanged.
fn check<T: DeserializeOwned>(body: &Value) -> Result<(), String> {
    T::deserialize(body).map(drop).map_err(|e| e.to_string())
}

/// Checks a call's body against its operation's request schema.
pub(crate) fn validate(call: &Call) -> Result<(), String> {
    let Some((check, _)) = schema_of(call.op.id) else {
        return Err(format!("{} takes no JSON body", call.op.id));
    };
    let body = call.raw_body();
    check(&body)
        .and_then(|()| nulls_allowed(call.op.id, &body))
        .map_err(|e| format!("invalid body for {}: {e}", call.op.id))
}

/// The spec the generated types come from: it tells a `null` the spec
/// allows (`nullable: true`) from one it does not, which the generated
/// types cannot (both read as `None`).
const SPEC: &str = include_str!("../../openapi/nexus_2026-07.oas.yaml");

/// Refuses a `null` the operation's request schema does not allow, at any
/// depth of the properties it names.
fn nulls_allowed(op: &str, body: &Value) -> Result<(), String> {
    let spec: Value =
        serde_yaml::from_str(SPEC).map_err(|e| format!("the bundled spec does not parse: {e}"))?;
    let Some(schema) = request_schema(&spec, op) else {
        return Ok(());
    };
    check_nulls(&spec, schema, body, "")
}

/// The JSON request body schema of the operation `op`.
fn request_schema<'a>(spec: &'a Value, op: &str) -> Option<&'a Value> {
    spec.get("paths")?
        .as_object()?
        .values()
        .filter_map(Value::as_object)
        .flat_map(|item| item.values())
        .find(|o| o.get("operationId").and_then(Value::as_str) == Some(op))?
        .pointer("/requestBody/content/application~1json/schema")
}

/// `schema` with its `$ref`s followed (a bounded number of them).
fn resolve<'a>(spec: &'a Value, mut schema: &'a Value) -> &'a Value {
    for _ in 0..16 {
        let Some(pointer) = schema
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix('#'))
        else {
            break;
        };
        match spec.pointer(pointer) {
            Some(target) => schema = target,
            None => break,
        }
    }
    schema
}

fn check_nulls(spec: &Value, schema: &Value, body: &Value, at: &str) -> Result<(), String> {
    let schema = resolve(spec, schema);
    let (Some(fields), Some(properties)) = (
        body.as_object(),
        schema.get("properties").and_then(Value::as_object),
    ) else {
        return Ok(());
    };
    for (name, value) in fields {
        let Some(property) = properties.get(name) else {
            continue;
        };
        let path = if at.is_empty() {
            name.clone()
        } else {
            format!("{at}.{name}")
        };
        let property = resolve(spec, property);
        if !value.is_null() {
            check_nulls(spec, property, value, &path)?;
        } else if property.get("nullable").and_then(Value::as_bool) != Some(true) {
            return Err(format!(
                "`{path}` cannot be null: the spec does not allow null there"
            ));
        }
    }
    Ok(())
}

/// Sends a body operation with the body as given, after [`validate`].
pub(crate) async fn send(client: &Client, call: &Call) -> Result<ExitCode, String> {
    let op = call.op.id;
    let Some((_, kind)) = schema_of(op) else {
        return Err(format!("{op} takes no JSON body"));
    };
    validate(call)?;
    let api = client.api();
    let mut url = format!("{}{}", api.baseurl(), call.op.path);
    for (name, value) in &call.params {
        url = url.replace(&format!("{{{name}}}"), &encode_path(value));
    }
    let method = Method::from_bytes(call.op.method.as_bytes()).map_err(|e| format!("{op}: {e}"))?;
    let request = api
        .client()
        .request(method, url)
        .header(header::ACCEPT, "application/json")
        .header(
            "api-version",
            <nexus_knowql::api::Client as ClientInfo<_>>::api_version(),
        )
        .json(&call.raw_body())
        .build()
        .map_err(|e| failure(op, nexus_knowql::api::Error::<types::Error>::from(e)))?;
    let info = OperationInfo { operation_id: op };
    let response = (&api)
        .exec(request, &info)
        .await
        .map_err(|e| failure(op, nexus_knowql::api::Error::<types::Error>::from(e)))?;
    if !response.status().is_success() {
        let error = nexus_knowql::api::Error::<types::Error>::UnexpectedResponse(response);
        return Err(failure(op, error));
    }
    if kind == Answer::Empty {
        let status = response.status();
        let answer = nexus_knowql::api::ResponseValue::new((), status, response.headers().clone());
        return done::<types::Error>(call, Ok(answer));
    }
    let answer = nexus_knowql::api::ResponseValue::<Value>::from_response::<types::Error>(response)
        .await
        .map_err(|e| failure(op, e))?;
    head(call, &answer);
    let mut value = answer.into_inner();
    if kind == Answer::Login
        && let Some(token) = value.get_mut("token")
    {
        *token = Value::String("(hidden)".to_owned());
    }
    println!("{}", to_json(&value));
    Ok(ExitCode::SUCCESS)
}
