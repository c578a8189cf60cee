//! `prompts/list` and `prompts/get`: `ask_context` (Nexus) and
//! `research_namespace` (Pinecone).

use rmcp::model::{
    GetPromptRequestParams, GetPromptResult, JsonObject, ListPromptsResult, Prompt, PromptArgument,
    PromptMessage, Role,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::Value;

use super::Families;
use super::resources::uri_source;
use super::uri;
use crate::mcp::nexus::MAX_QUESTION_CHARS;
use crate::mcp::pinecone::PineconeServer;

/// The Nexus prompt's name.
pub(super) const ASK_CONTEXT: &str = "ask_context";
/// The Pinecone prompt's name.
pub(super) const RESEARCH_NAMESPACE: &str = "research_namespace";

/// The longest slug, index or namespace argument.
const MAX_NAME_CHARS: usize = 512;

fn argument(name: &str, description: &str) -> PromptArgument {
    PromptArgument::new(name)
        .with_description(description)
        .with_required(true)
}

/// The prompts of the families configured.
pub(crate) fn list(families: Families<'_>) -> ListPromptsResult {
    let mut prompts = Vec::new();
    if families.ask_context().is_some() {
        prompts.push(
            Prompt::new(
                ASK_CONTEXT,
                Some(
                    "Ask a Nexus context a question and answer from its cited knowledge \
                     (query_context, then get_query).",
                ),
                Some(vec![
                    argument("context", "The slug of a queryable context."),
                    argument("question", "The question, in natural language."),
                ]),
            )
            .with_title("Ask a Nexus context"),
        );
    }
    if let Some(pinecone) = families.research_namespace() {
        let mut arguments = vec![
            argument("index", "The Pinecone index holding the namespace."),
            argument("namespace", "The namespace to research."),
            argument("topic", "What to research."),
        ];
        if pinecone.state.config.is_multi_source() {
            arguments.insert(
                0,
                PromptArgument::new("source")
                    .with_description(
                        "The source holding the index (list_sources); may be omitted when \
                         only one source has this index and namespace.",
                    )
                    .with_required(false),
            );
        }
        prompts.push(
            Prompt::new(
                RESEARCH_NAMESPACE,
                Some(
                    "Research a topic in one Pinecone namespace with the retrieval tools, \
                     using its metadata fields to narrow the search.",
                ),
                Some(arguments),
            )
            .with_title("Research a Pinecone namespace"),
        );
    }
    ListPromptsResult::with_all_items(prompts)
}

/// A required, non-blank string argument of at most `max` characters.
fn required<'a>(
    args: Option<&'a JsonObject>,
    name: &str,
    max: usize,
) -> Result<&'a str, ErrorData> {
    let value = args.and_then(|a| a.get(name));
    let Some(value) = value else {
        return Err(ErrorData::invalid_params(
            format!("missing required argument `{name}`"),
            None,
        ));
    };
    let Some(text) = value.as_str().map(str::trim).filter(|t| !t.is_empty()) else {
        return Err(ErrorData::invalid_params(
            format!("argument `{name}` must be a non-empty string"),
            None,
        ));
    };
    if text.chars().count() > max {
        return Err(ErrorData::invalid_params(
            format!("argument `{name}` is longer than {max} characters"),
            None,
        ));
    }
    Ok(text)
}

/// A name argument: no `/`, whitespace or control character.
fn required_name<'a>(args: Option<&'a JsonObject>, name: &str) -> Result<&'a str, ErrorData> {
    let text = required(args, name, MAX_NAME_CHARS)?;
    if text
        .chars()
        .any(|c| c.is_control() || c.is_whitespace() || c == '/')
    {
        return Err(ErrorData::invalid_params(
            format!("argument `{name}` must not hold `/`, spaces or control characters"),
            None,
        ));
    }
    Ok(text)
}

/// One prompt, with its arguments checked.
pub(crate) async fn get(
    families: Families<'_>,
    request: GetPromptRequestParams,
    ctx: &RequestContext<RoleServer>,
) -> Result<GetPromptResult, ErrorData> {
    let args = request.arguments.as_ref();
    match request.name.as_str() {
        ASK_CONTEXT if families.ask_context().is_some() => ask_context(families, args),
        RESEARCH_NAMESPACE => match families.research_namespace() {
            Some(pinecone) => research_namespace(families, pinecone, args, ctx).await,
            None => Err(unknown(&request.name)),
        },
        other => Err(unknown(other)),
    }
}

/// `ask_context`: how to ask a Nexus context the question.
fn ask_context(
    families: Families<'_>,
    args: Option<&JsonObject>,
) -> Result<GetPromptResult, ErrorData> {
    let context = required_name(args, "context")?;
    let question = required(args, "question", MAX_QUESTION_CHARS)?;
    // The context's resource is named only when resources are served.
    let resource = families
        .contexts()
        .map(|_| format!(" (resource {})", uri::context_uri(context)))
        .unwrap_or_default();
    let text = format!(
        "Answer the question below from the Nexus context `{context}`{resource}.\n\n\
         1. Call query_context with context=\"{context}\" and the question.\n\
         2. Call get_query with the returned query_id (wait_seconds up to 60) until \
         status is completed, failed or cancelled.\n\
         3. Answer from the completed result only, citing its sources; if the turn \
         failed, say why.\n\nQuestion: {question}",
    );
    Ok(
        GetPromptResult::new(vec![PromptMessage::new_text(Role::User, text)])
            .with_description(format!("Ask the Nexus context `{context}`")),
    )
}

/// `research_namespace`: how to research the topic in a Pinecone
/// namespace, with what the caller's key sees of it.
async fn research_namespace(
    families: Families<'_>,
    pinecone: &PineconeServer,
    args: Option<&JsonObject>,
    ctx: &RequestContext<RoleServer>,
) -> Result<GetPromptResult, ErrorData> {
    let multi = pinecone.state.config.is_multi_source();
    let asked_source = match args.and_then(|a| a.get("source")) {
        Some(_) if multi => Some(required_name(args, "source")?),
        _ => None,
    };
    let index = required_name(args, "index")?;
    let namespace = required_name(args, "namespace")?;
    let topic = required(args, "topic", MAX_QUESTION_CHARS)?;
    // What the caller's key sees of the namespace, when it answers
    // and namespaces are served.
    let listed = families.namespaces().is_some();
    let rows = match listed {
        true => pinecone.caller_namespaces(&ctx.extensions).await,
        false => Ok(Vec::new()),
    };
    if let Err(e) = &rows {
        families.count_failure("pinecone", e);
    }
    let known = rows.ok().and_then(|rows| {
        rows.into_iter()
            .find(|(i, r)| {
                i == index
                    && r.name == namespace
                    && asked_source.is_none_or(|s| uri_source(pinecone, r) == Some(s))
            })
            .map(|(_, r)| r)
    });
    // With several sources the tools need the source: the one asked
    // for, else the one that holds this namespace.
    let source = asked_source.map(str::to_owned).or_else(|| {
        known
            .as_ref()
            .and_then(|r| uri_source(pinecone, r))
            .map(str::to_owned)
    });
    let target = match &source {
        Some(source) => format!("namespace=\"{namespace}\", source=\"{source}\""),
        None => format!("namespace=\"{namespace}\""),
    };
    let resource = match listed {
        true => format!(
            " (resource {})",
            uri::namespace_uri(source.as_deref(), index, namespace)
        ),
        false => String::new(),
    };
    let mut text = format!(
        "Research \"{topic}\" in the Pinecone namespace `{namespace}` of index \
         `{index}`{of}{resource}.\n\n",
        of = source
            .as_deref()
            .map(|s| format!(" of source `{s}`"))
            .unwrap_or_default(),
    );
    if let Some(row) = &known {
        let fields: Vec<String> = row
            .metadata_fields
            .iter()
            .map(|(k, v)| format!("{k} ({})", v.as_str().unwrap_or("unknown")))
            .collect();
        text.push_str(&format!(
            "It holds {} records. Metadata fields: {}.\n\n",
            row.record_count,
            if fields.is_empty() {
                "none known".to_owned()
            } else {
                fields.join(", ")
            }
        ));
    }
    text.push_str(&format!(
        "1. Call suggest_query_params with {target} and the topic as user_query to pick \
         fields and a filter.\n\
         2. Run query (or keyword_search for exact terms) with {target}; narrow with \
         metadata filters and vary the wording.\n\
         3. Summarise what the records say about the topic, citing each record you use, \
         and say what the namespace does not cover."
    ));
    Ok(
        GetPromptResult::new(vec![PromptMessage::new_text(Role::User, text)])
            .with_description(format!("Research a topic in `{index}/{namespace}`")),
    )
}

fn unknown(name: &str) -> ErrorData {
    ErrorData::invalid_params(
        format!("unknown prompt `{}`", super::truncate(name, 128)),
        Some(Value::from(super::truncate(name, 128))),
    )
}
