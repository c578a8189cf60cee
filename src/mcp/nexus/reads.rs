//! Reads made for the server's resources, prompts and completions: the
//! caller's contexts, one context with its source count, and the first
//! bytes of a knowledge file, one directory of a context's knowledge. Each runs with the key the caller's tool calls
//! would run with, under the call deadline.

use futures::{StreamExt, TryStreamExt};
use rmcp::RoleServer;
use rmcp::service::RequestContext;

use super::NexusServer;
use super::errors::Subject;
use crate::mcp::tool_error::ToolError;
use crate::types;

/// The first bytes of a knowledge file, and whether there were more.
#[derive(Debug)]
pub(crate) struct KnowledgeHead {
    /// At most the cap asked for.
    pub(crate) bytes: Vec<u8>,
    /// Whether the file is longer than `bytes`.
    pub(crate) truncated: bool,
}

/// One entry of a knowledge directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KnowledgeEntry {
    /// The path relative to the knowledge root.
    pub(crate) path: String,
    /// Whether it is a directory.
    pub(crate) dir: bool,
    /// Its size in bytes, as the API reports it.
    pub(crate) size: i64,
}

impl NexusServer {
    /// The first `limit` entries of the knowledge directory `dir` of context
    /// `slug` (`""`: the root).
    pub(crate) async fn caller_knowledge_dir(
        &self,
        ctx: &RequestContext<RoleServer>,
        slug: &str,
        dir: &str,
        limit: i64,
    ) -> Result<Vec<KnowledgeEntry>, ToolError> {
        let mut call = self.client_for(ctx)?;
        let page = {
            let mut pages = call
                .client
                .knowledge(slug)
                .list()
                .path(dir)
                .page_size(u64::try_from(limit).unwrap_or(0))
                .pages();
            self.nexus(Subject::Context(slug), pages.try_next()).await?
        };
        self.caller_http.accepted(&mut call);
        let dir = dir.trim_matches('/');
        Ok(page
            .map(|page| page.items)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| !e.name.is_empty() && !e.name.contains('/'))
            .map(|e| KnowledgeEntry {
                path: if dir.is_empty() {
                    e.name
                } else {
                    format!("{dir}/{}", e.name)
                },
                dir: e.kind == "dir",
                size: e.size,
            })
            .collect())
    }

    /// Every context the caller's key sees.
    pub(crate) async fn caller_contexts(
        &self,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Vec<types::ContextResponse>, ToolError> {
        let mut call = self.client_for(ctx)?;
        let contexts = self
            .nexus(Subject::None, call.client.contexts().list())
            .await?;
        self.caller_http.accepted(&mut call);
        Ok(contexts)
    }

    /// One context the caller's key sees, with how many entries its
    /// sources' root holds (`None` when that listing fails).
    pub(crate) async fn caller_context(
        &self,
        ctx: &RequestContext<RoleServer>,
        slug: &str,
    ) -> Result<(types::ContextResponse, Option<i64>), ToolError> {
        let mut call = self.client_for(ctx)?;
        let context = self
            .nexus(Subject::Context(slug), call.client.contexts().get(slug))
            .await?;
        self.caller_http.accepted(&mut call);
        let mut pages = call.client.sources(slug).list().page_size(1).pages();
        let sources = self
            .nexus(Subject::Context(slug), pages.try_next())
            .await
            .ok()
            .flatten()
            .and_then(|page| page.total)
            .and_then(|total| i64::try_from(total).ok());
        Ok((context, sources))
    }

    /// The first `cap` bytes of the knowledge file at `path` of context
    /// `slug`: the rest of the body is never read.
    pub(crate) async fn caller_knowledge(
        &self,
        ctx: &RequestContext<RoleServer>,
        slug: &str,
        path: &str,
        cap: usize,
    ) -> Result<KnowledgeHead, ToolError> {
        let mut call = self.client_for(ctx)?;
        let client = call.client.clone();
        let read = async {
            let stream = client
                .call(
                    "read_knowledge_file",
                    client.api().read_knowledge_file(slug, path),
                )
                .await?;
            let mut body = stream.into_inner();
            let mut bytes = Vec::new();
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| {
                    crate::transport::for_servers::map_reqwest("read_knowledge_file", e, None)
                })?;
                let room = cap.saturating_sub(bytes.len());
                if chunk.len() > room {
                    bytes.extend_from_slice(&chunk[..room]);
                    return Ok(KnowledgeHead {
                        bytes,
                        truncated: true,
                    });
                }
                bytes.extend_from_slice(&chunk);
            }
            Ok(KnowledgeHead {
                bytes,
                truncated: false,
            })
        };
        let head = self.nexus(Subject::Context(slug), read).await?;
        self.caller_http.accepted(&mut call);
        Ok(head)
    }
}
