//! Contexts and their sources: lookup, creation, updates, deletion, and
//! the source rows and index an import or curation records.

use super::*;

impl Inner {
    /// A context by slug or id.
    pub(crate) fn context(&self, key: &str) -> LocalResult<&ContextRecord> {
        self.context_id(key)
            .and_then(|id| self.contexts.get(&id))
            .ok_or_else(|| LocalError::not_found(format!("context {key:?} not found")))
    }

    /// A context by slug or id, to change: its row is written with the
    /// change.
    pub(crate) fn context_mut(&mut self, key: &str) -> LocalResult<&mut ContextRecord> {
        let id = self
            .context_id(key)
            .ok_or_else(|| LocalError::not_found(format!("context {key:?} not found")))?;
        self.dirty.contexts.insert(id.clone());
        self.contexts
            .get_mut(&id)
            .ok_or_else(|| LocalError::not_found(format!("context {key:?} not found")))
    }

    pub(crate) fn context_id(&self, key: &str) -> Option<String> {
        if self.contexts.contains_key(key) {
            return Some(key.to_owned());
        }
        self.contexts
            .values()
            .find(|c| c.slug == key)
            .map(|c| c.id.clone())
    }

    pub(crate) fn create_context(
        &mut self,
        req: types::CreateContextRequest,
    ) -> LocalResult<ContextRecord> {
        let rec = self.prepare_context(req)?;
        self.publish_context(rec.clone());
        Ok(rec)
    }

    /// Refuses a slug a context is being built aside with (a fork still
    /// copying): 503 `busy` with `Retry-After`, as its outcome is not
    /// known yet; it is published whole, or the slug is free again.
    fn check_not_reserved(&self, slug: &str) -> LocalResult<()> {
        if !self.reserved_slugs.contains(slug) {
            return Ok(());
        }
        Err(LocalError {
            code: Some("busy"),
            retry_after: Some(1),
            ..LocalError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                format!("context {slug:?} is being created; retry shortly"),
            )
        })
    }

    /// Adds a context built aside ([`Inner::prepare_context`]), with its
    /// sources, in one change.
    pub(crate) fn publish_context(&mut self, rec: ContextRecord) {
        let id = rec.id.clone();
        self.reserved_slugs.remove(&rec.slug);
        self.contexts.insert(id.clone(), rec);
        self.dirty.contexts.insert(id.clone());
        self.dirty.created.insert(id.clone());
        self.dirty.sources.insert(id, None);
    }

    /// Checks a new context and builds its record, without adding it.
    pub(crate) fn prepare_context(
        &self,
        req: types::CreateContextRequest,
    ) -> LocalResult<ContextRecord> {
        if let Some(m) = &req.manifest {
            crate::local::manifest_bounds::check(m)?;
        }
        if !valid_slug(&req.slug) {
            return Err(LocalError::bad_request(format!(
                "invalid slug {:?}: use 1-64 lower-case letters, digits, '-' or '_'",
                req.slug
            )));
        }
        if req.name.trim().is_empty() {
            return Err(LocalError::bad_request("name must not be empty"));
        }
        let kind = req.kind.map(|k| k.0).unwrap_or_else(|| "search".to_owned());
        if !matches!(kind.as_str(), "search" | "work") {
            return Err(LocalError::bad_request(format!(
                "unknown context kind {kind:?}: use search or work"
            )));
        }
        self.check_not_reserved(&req.slug)?;
        if self.context_id(&req.slug).is_some() {
            return Err(LocalError::conflict(format!(
                "context {:?} already exists",
                req.slug
            )));
        }
        if self.contexts.len() >= MAX_CONTEXTS {
            return Err(LocalError::conflict(format!(
                "the local server holds at most {MAX_CONTEXTS} contexts"
            )));
        }
        let now = Utc::now();
        let rec = ContextRecord {
            id: new_id("ctx"),
            slug: req.slug,
            name: req.name,
            kind,
            description: req.description,
            guide: req.guide,
            manifest: req.manifest,
            created_at: now,
            updated_at: now,
            last_curated_at: None,
            last_source_import_at: None,
            curate_task_id: None,
            import_task_id: None,
            curating: false,
            importing: false,
            sources_held: 0,
            sample_queries: Vec::new(),
            index_generation: 0,
            sources: BTreeMap::new(),
            ledger: None,
        };
        Ok(rec)
    }

    /// Applies an update to a context (slug, name, description, guide,
    /// manifest); returns it as updated.
    pub(crate) fn update_context(
        &mut self,
        key: &str,
        req: types::UpdateContextRequest,
    ) -> LocalResult<&ContextRecord> {
        if let Some(m) = &req.manifest {
            crate::local::manifest_bounds::check(m)?;
        }
        let id = self.context(key)?.id.clone();
        if let Some(new_slug) = &req.slug {
            if !valid_slug(new_slug) {
                return Err(LocalError::bad_request(format!(
                    "invalid slug {new_slug:?}"
                )));
            }
            self.check_not_reserved(new_slug)?;
            if self.context_id(new_slug).is_some_and(|other| other != id) {
                return Err(LocalError::conflict(format!(
                    "context {new_slug:?} already exists"
                )));
            }
        }
        if req.name.as_deref().is_some_and(|n| n.trim().is_empty()) {
            return Err(LocalError::bad_request("name must not be empty"));
        }
        let ctx = self.context_mut(&id)?;
        if let Some(v) = req.slug {
            ctx.slug = v;
        }
        if let Some(v) = req.name {
            ctx.name = v;
        }
        if let Some(v) = req.description {
            ctx.description = Some(v);
        }
        if let Some(v) = req.guide {
            ctx.guide = Some(v);
        }
        if let Some(v) = req.manifest {
            ctx.manifest = Some(v);
        }
        ctx.updated_at = Utc::now();
        self.dirty.contexts.insert(id.clone());
        self.context(&id)
    }

    /// A token for a job about to work on a context's files, held until
    /// the job has ended: a deletion of the context waits for it. Take it
    /// in the same lock as the check that the context exists.
    pub(crate) fn context_job(&mut self, context_id: &str) -> TaskTrackerToken {
        self.context_jobs
            .entry(context_id.to_owned())
            .or_default()
            .token()
    }

    /// Removes a context; returns it, the tokens of its running tasks and
    /// the tracker of its jobs (closed: wait on it before removing its
    /// files).
    pub(crate) fn delete_context(
        &mut self,
        key: &str,
    ) -> LocalResult<(ContextRecord, Vec<CancellationToken>, TaskTracker)> {
        let id = self
            .context_id(key)
            .ok_or_else(|| LocalError::not_found(format!("context {key:?} not found")))?;
        let rec = self
            .contexts
            .remove(&id)
            .ok_or_else(|| LocalError::not_found(format!("context {key:?} not found")))?;
        self.indexes.remove(&id);
        self.dirty.contexts.insert(id.clone());
        self.dirty.sources.remove(&id);
        let tokens = self
            .tasks
            .values()
            .filter(|t| t.task.context_id.as_deref() == Some(id.as_str()))
            .filter(|t| !t.task.state.is_terminal())
            .map(|t| t.cancel.clone())
            .collect();
        let jobs = self.context_jobs.remove(&id).unwrap_or_default();
        jobs.close();
        Ok((rec, tokens, jobs))
    }

    /// Replaces the source list of a context (its files are already in place).
    pub(crate) fn replace_sources(
        &mut self,
        context_id: &str,
        sources: BTreeMap<String, SourceMeta>,
        now: DateTime<Utc>,
    ) -> LocalResult<()> {
        let ctx = self.context_mut(context_id)?;
        ctx.sources = sources;
        ctx.last_source_import_at = Some(now);
        ctx.updated_at = now;
        let id = ctx.id.clone();
        self.dirty.contexts.insert(id.clone());
        self.dirty.sources.insert(id, None);
        Ok(())
    }

    /// Records files moved into a context's source tree; returns whether it
    /// is a work context.
    pub(crate) fn add_sources(
        &mut self,
        context_id: &str,
        files: &[(String, u64)],
        now: DateTime<Utc>,
    ) -> LocalResult<bool> {
        let ctx = self.context_mut(context_id)?;
        for (path, size) in files {
            ctx.sources.insert(
                path.clone(),
                SourceMeta {
                    size: *size,
                    mtime: now,
                },
            );
        }
        ctx.last_source_import_at = Some(now);
        ctx.updated_at = now;
        let is_work = ctx.kind == "work";
        let id = ctx.id.clone();
        self.dirty.contexts.insert(id.clone());
        self.mark_sources(&id, files.iter().map(|(p, _)| p.clone()));
        Ok(is_work)
    }

    /// Swaps in a curated index and marks the context queryable.
    pub(crate) fn apply_index(
        &mut self,
        context_id: &str,
        index: Arc<ContextIndex>,
        generation: u64,
        samples: Vec<String>,
        now: DateTime<Utc>,
    ) -> LocalResult<()> {
        let ctx = self.context_mut(context_id)?;
        ctx.last_curated_at = Some(now);
        ctx.updated_at = now;
        ctx.index_generation = generation;
        ctx.sample_queries = samples;
        self.dirty.contexts.insert(context_id.to_owned());
        self.indexes.insert(context_id.to_owned(), index);
        Ok(())
    }

    /// Marks every source row of a context as changed (rows of sources
    /// removed go).
    pub(crate) fn mark_all_sources(&mut self, context_id: &str) {
        self.dirty.sources.insert(context_id.to_owned(), None);
    }

    /// Marks source rows of a context as changed.
    pub(crate) fn mark_sources(&mut self, context_id: &str, paths: impl Iterator<Item = String>) {
        if let Some(set) = self
            .dirty
            .sources
            .entry(context_id.to_owned())
            .or_insert_with(|| Some(BTreeSet::new()))
        {
            set.extend(paths);
        }
    }
}
