//! `resources/list`, `resources/templates/list` and `resources/read`.

use chrono::SecondsFormat;
use rmcp::model::{
    JsonObject, ListResourceTemplatesResult, ListResourcesResult, MetaObject,
    PaginatedRequestParams, ReadResourceResult, Resource, ResourceContents, ResourceTemplate,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde::Serialize;
use serde_json::{Value, json};

use super::uri::{self, ResourceUri};
use super::{
    Families, MAX_KNOWLEDGE_READ_BYTES, RESOURCE_PAGE_SIZE, not_found, truncate, upstream_error,
};
use crate::mcp::nexus::reads::KnowledgeEntry;
use crate::mcp::pinecone::NamespaceRow;
use crate::types;

const JSON: &str = "application/json";
/// The most knowledge files one `resources/list` names (the `{path}`
/// completion of the knowledge template finds any other).
pub(super) const MAX_KNOWLEDGE_LISTED: usize = 200;
/// The most knowledge directory listings one `resources/list` makes.
const MAX_KNOWLEDGE_LISTINGS: usize = 16;
/// The most entries read of one knowledge directory.
pub(super) const KNOWLEDGE_DIR_PAGE: i64 = 100;
const MARKDOWN: &str = "text/markdown";

/// A context's state in one word.
pub(super) fn status(c: &types::ContextResponse) -> &'static str {
    if c.is_curating {
        "curating"
    } else if c.is_optimizing {
        "optimizing"
    } else if c.is_importing {
        "importing"
    } else if c.is_queryable() {
        "ready"
    } else {
        "not_curated"
    }
}

fn iso(at: Option<&chrono::DateTime<chrono::Utc>>) -> Option<String> {
    at.map(|t| t.to_rfc3339_opts(SecondsFormat::Secs, true))
}

fn context_resource(c: &types::ContextResponse) -> Resource {
    let curated = iso(c.last_curated_at.as_ref()).unwrap_or_else(|| "never".to_owned());
    let mut text = c
        .description
        .as_deref()
        .filter(|d| !d.trim().is_empty())
        .map(|d| format!("{} ", truncate(d.trim(), 1024)))
        .unwrap_or_default();
    text.push_str(&format!("(status: {}; curated: {curated})", status(c)));
    Resource::new(uri::context_uri(&c.slug), c.slug.clone())
        .with_title(c.name.clone())
        .with_description(text)
        .with_mime_type(JSON)
}

fn field_names(row: &NamespaceRow) -> Vec<&str> {
    row.metadata_fields.keys().map(String::as_str).collect()
}

/// The source a namespace URI names: with several sources only.
pub(super) fn uri_source<'a>(
    pinecone: &crate::mcp::pinecone::PineconeServer,
    row: &'a NamespaceRow,
) -> Option<&'a str> {
    if pinecone.state.config.is_multi_source() {
        row.source.as_deref()
    } else {
        None
    }
}

fn namespace_resource(source: Option<&str>, index: &str, row: &NamespaceRow) -> Resource {
    let mut text = format!(
        "Pinecone namespace with {} records; metadata fields: {}",
        row.record_count,
        match field_names(row).join(", ") {
            f if f.is_empty() => "none known".to_owned(),
            f => f,
        }
    );
    if let Some(d) = row.description.as_deref().filter(|d| !d.trim().is_empty()) {
        text = format!("{}. {text}", truncate(d.trim(), 1024));
    }
    let name = match source {
        Some(source) => format!("{source}/{index}/{}", row.name),
        None => format!("{index}/{}", row.name),
    };
    Resource::new(uri::namespace_uri(source, index, &row.name), name)
        .with_description(text)
        .with_mime_type(JSON)
}

fn knowledge_resource(slug: &str, entry: &KnowledgeEntry) -> Resource {
    Resource::new(
        uri::knowledge_uri(slug, &entry.path),
        format!("{slug}/{}", entry.path),
    )
    .with_description(format!(
        "Knowledge file of the Nexus context `{slug}` ({} bytes)",
        entry.size.max(0)
    ))
    .with_mime_type(mime_of(&entry.path))
}

/// The knowledge files of the curated contexts, directories breadth first,
/// within [`MAX_KNOWLEDGE_LISTED`] files and [`MAX_KNOWLEDGE_LISTINGS`]
/// upstream listings; a context whose listing fails contributes nothing.
async fn knowledge_files(
    families: Families<'_>,
    nexus: &crate::mcp::nexus::NexusServer,
    ctx: &RequestContext<RoleServer>,
    contexts: &[types::ContextResponse],
) -> Vec<Resource> {
    let mut out = Vec::new();
    let mut listings = 0;
    let curated = contexts
        .iter()
        .filter(|c| c.last_curated_at.is_some() || c.is_queryable());
    for context in curated {
        let mut dirs = std::collections::VecDeque::from([String::new()]);
        while let Some(dir) = dirs.pop_front() {
            if listings >= MAX_KNOWLEDGE_LISTINGS || out.len() >= MAX_KNOWLEDGE_LISTED {
                return out;
            }
            listings += 1;
            let entries = match nexus
                .caller_knowledge_dir(ctx, &context.slug, &dir, KNOWLEDGE_DIR_PAGE)
                .await
            {
                Ok(entries) => entries,
                Err(e) => {
                    families.count_failure("nexus", &e);
                    break;
                }
            };
            for entry in entries {
                if entry.dir {
                    dirs.push_back(entry.path);
                } else if out.len() < MAX_KNOWLEDGE_LISTED {
                    out.push(knowledge_resource(&context.slug, &entry));
                }
            }
        }
    }
    out
}

/// Every resource the caller sees, in a stable order: contexts, their
/// knowledge files, then namespaces. A family whose upstream fails contributes nothing; the
/// page's `_meta` names it.
pub(crate) async fn list(
    families: Families<'_>,
    request: Option<PaginatedRequestParams>,
    ctx: &RequestContext<RoleServer>,
) -> Result<ListResourcesResult, ErrorData> {
    let start = match request.and_then(|r| r.cursor) {
        None => 0,
        Some(cursor) => cursor
            .parse::<usize>()
            .map_err(|_| ErrorData::invalid_params("invalid cursor", None))?,
    };
    let mut all = Vec::new();
    let mut failed = Vec::new();
    if let Some(nexus) = families.contexts() {
        match nexus.caller_contexts(ctx).await {
            Ok(contexts) => {
                all.extend(contexts.iter().map(context_resource));
                all.extend(knowledge_files(families, nexus, ctx, &contexts).await);
            }
            Err(e) => {
                families.count_failure("nexus", &e);
                tracing::warn!(code = ?e.code, "resources/list: contexts unavailable");
                failed.push(json!({"family": "nexus", "code": e.to_json()["code"]}));
            }
        }
    }
    if let Some(pinecone) = families.namespaces() {
        match pinecone.caller_namespaces(&ctx.extensions).await {
            Ok(rows) => all.extend(
                rows.iter()
                    .map(|(i, r)| namespace_resource(uri_source(pinecone, r), i, r)),
            ),
            Err(e) => {
                families.count_failure("pinecone", &e);
                tracing::warn!(code = ?e.code, "resources/list: namespaces unavailable");
                failed.push(json!({"family": "pinecone", "code": e.to_json()["code"]}));
            }
        }
    }
    let total = all.len();
    if start > total {
        return Err(ErrorData::invalid_params("invalid cursor", None));
    }
    let end = start.saturating_add(RESOURCE_PAGE_SIZE).min(total);
    let page: Vec<Resource> = all.drain(start..end).collect();
    let mut result = ListResourcesResult::with_all_items(page);
    if end < total {
        result.next_cursor = Some(end.to_string());
    }
    if !failed.is_empty() {
        let mut meta = JsonObject::new();
        meta.insert("nexus-knowql/unavailable".into(), Value::Array(failed));
        result.meta = Some(MetaObject(meta));
    }
    Ok(result)
}

/// The URI templates of the families configured.
pub(crate) fn templates(families: Families<'_>) -> ListResourceTemplatesResult {
    let mut out = Vec::new();
    if families.contexts().is_some() {
        out.push(
            ResourceTemplate::new(uri::CONTEXT_TEMPLATE, "context")
                .with_title("Nexus context")
                .with_description(
                    "A Nexus context: description, status, last curation, source count \
                     (JSON, then the same as Markdown).",
                )
                .with_mime_type(JSON),
        );
        out.push(
            ResourceTemplate::new(uri::KNOWLEDGE_TEMPLATE, "knowledge_file")
                .with_title("Nexus knowledge file")
                .with_description(format!(
                    "A curated knowledge file of a context (path relative to the knowledge \
                     root; resources/list names up to {MAX_KNOWLEDGE_LISTED}, and completing \
                     `path` lists a directory). At most {MAX_KNOWLEDGE_READ_BYTES} bytes are \
                     returned; a longer file is cut and says so."
                )),
        );
    }
    if let Some(pinecone) = families.namespaces() {
        let template = if pinecone.state.config.is_multi_source() {
            uri::SOURCE_NAMESPACE_TEMPLATE
        } else {
            uri::NAMESPACE_TEMPLATE
        };
        out.push(
            ResourceTemplate::new(template, "namespace")
                .with_title("Pinecone namespace")
                .with_description(
                    "A namespace of a Pinecone index (of a source, with several): record \
                     count and metadata fields.",
                )
                .with_mime_type(JSON),
        );
    }
    ListResourceTemplatesResult::with_all_items(out)
}

/// A failed read: counted, and answered as a protocol error.
fn failed(
    families: Families<'_>,
    family: &'static str,
    e: &crate::mcp::ToolError,
    raw: &str,
) -> ErrorData {
    families.count_failure(family, e);
    upstream_error(e, Some(raw))
}

/// Reads one resource; a URI this server does not serve, or that names
/// nothing the caller sees, is -32002.
pub(crate) async fn read(
    families: Families<'_>,
    raw: &str,
    ctx: &RequestContext<RoleServer>,
) -> Result<ReadResourceResult, ErrorData> {
    let Some(parsed) = uri::parse(raw) else {
        return Err(not_found(raw));
    };
    match parsed {
        ResourceUri::Context { slug } => {
            let Some(nexus) = families.contexts() else {
                return Err(not_found(raw));
            };
            let (context, sources) = nexus
                .caller_context(ctx, &slug)
                .await
                .map_err(|e| failed(families, "nexus", &e, raw))?;
            context_contents(raw, &context, sources)
        }
        ResourceUri::Knowledge { slug, path } => {
            let Some(nexus) = families.contexts() else {
                return Err(not_found(raw));
            };
            let head = nexus
                .caller_knowledge(ctx, &slug, &path, MAX_KNOWLEDGE_READ_BYTES)
                .await
                .map_err(|e| failed(families, "nexus", &e, raw))?;
            Ok(knowledge_contents(raw, &path, head))
        }
        ResourceUri::Namespace {
            source,
            index,
            namespace,
        } => {
            let Some(pinecone) = families.namespaces() else {
                return Err(not_found(raw));
            };
            let rows = pinecone
                .caller_namespaces(&ctx.extensions)
                .await
                .map_err(|e| failed(families, "pinecone", &e, raw))?;
            let (_, row) = rows
                .iter()
                .find(|(i, r)| {
                    *i == index
                        && r.name == namespace
                        && (source.is_none() || uri_source(pinecone, r) == source.as_deref())
                })
                .ok_or_else(|| not_found(raw))?;
            let body = NamespaceBody {
                index: &index,
                namespace: &row.name,
                source: row.source.as_deref(),
                record_count: row.record_count,
                metadata_fields: &row.metadata_fields,
                schema_source: row.schema_source,
                description: row.description.as_deref(),
            };
            Ok(ReadResourceResult::new(vec![
                ResourceContents::text(json_text(&body, raw)?, raw).with_mime_type(JSON),
            ]))
        }
    }
}

/// The JSON text of a namespace resource, written from the row in place.
#[derive(Serialize)]
struct NamespaceBody<'a> {
    index: &'a str,
    namespace: &'a str,
    source: Option<&'a str>,
    record_count: u64,
    metadata_fields: &'a serde_json::Map<String, Value>,
    schema_source: crate::mcp::pinecone::SchemaSource,
    description: Option<&'a str>,
}

/// The JSON text of a context resource, written from the context in place.
#[derive(Serialize)]
struct ContextBody<'a> {
    slug: &'a str,
    name: &'a str,
    id: &'a str,
    kind: &'a str,
    description: Option<&'a str>,
    status: &'static str,
    queryable: bool,
    last_curated_at: Option<&'a str>,
    last_optimized_at: Option<String>,
    source_count: Option<i64>,
}

/// `body`'s JSON text, written once from its typed fields.
fn json_text<T: Serialize>(body: &T, uri: &str) -> Result<String, ErrorData> {
    serde_json::to_string(body).map_err(|e| {
        tracing::error!("resources/read: a body did not serialize: {e}");
        ErrorData::internal_error(
            "the resource did not serialize",
            Some(json!({ "uri": truncate(uri, 256) })),
        )
    })
}

fn context_contents(
    uri: &str,
    c: &types::ContextResponse,
    sources: Option<i64>,
) -> Result<ReadResourceResult, ErrorData> {
    let curated = iso(c.last_curated_at.as_ref());
    let body = json_text(
        &ContextBody {
            slug: &c.slug,
            name: &c.name,
            id: &c.id,
            kind: c.kind.as_str(),
            description: c.description.as_deref(),
            status: status(c),
            queryable: c.is_queryable(),
            last_curated_at: curated.as_deref(),
            last_optimized_at: iso(c.last_optimized_at.as_ref()),
            source_count: sources,
        },
        uri,
    )?;
    let mut md = format!("# {}\n\n", c.name);
    if let Some(d) = c.description.as_deref().filter(|d| !d.trim().is_empty()) {
        md.push_str(d.trim());
        md.push_str("\n\n");
    }
    md.push_str(&format!(
        "- slug: `{}`\n- status: {}\n- queryable: {}\n- last curated: {}\n- sources: {}\n",
        c.slug,
        status(c),
        c.is_queryable(),
        curated.as_deref().unwrap_or("never"),
        sources.map_or_else(|| "unknown".to_owned(), |n| n.to_string()),
    ));
    Ok(ReadResourceResult::new(vec![
        ResourceContents::text(body, uri).with_mime_type(JSON),
        ResourceContents::text(md, uri).with_mime_type(MARKDOWN),
    ]))
}

/// The MIME type of a knowledge file, by its extension.
fn mime_of(path: &str) -> &'static str {
    let ext = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    match ext.as_deref() {
        Some("md" | "markdown") => MARKDOWN,
        Some("json") => JSON,
        Some("yaml" | "yml") => "application/yaml",
        Some("csv") => "text/csv",
        Some("html" | "htm") => "text/html",
        _ => "text/plain",
    }
}

fn knowledge_contents(
    uri: &str,
    path: &str,
    head: crate::mcp::nexus::reads::KnowledgeHead,
) -> ReadResourceResult {
    let bytes = &head.bytes;
    let text = match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        // A cut through a character: keep the whole characters before it.
        Err(e) if head.truncated && e.error_len().is_none() => {
            String::from_utf8_lossy(&bytes[..e.valid_up_to()]).into_owned()
        }
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    };
    let mut meta = JsonObject::new();
    meta.insert("truncated".into(), Value::Bool(head.truncated));
    meta.insert("limitBytes".into(), json!(MAX_KNOWLEDGE_READ_BYTES));
    let text = if head.truncated {
        format!(
            "{text}\n\n[truncated: only the first {MAX_KNOWLEDGE_READ_BYTES} bytes of this file are shown]"
        )
    } else {
        text
    };
    ReadResourceResult::new(vec![
        ResourceContents::text(text, uri)
            .with_mime_type(mime_of(path))
            .with_meta(MetaObject(meta)),
    ])
}
