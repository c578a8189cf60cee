//! Tasks: registration, progress, cancellation and their end, and the
//! eviction of old ended ones.

use super::*;

impl Inner {
    /// Registers a new running task.
    pub(crate) fn new_task(
        &mut self,
        workflow: &str,
        context_id: Option<&str>,
        session_id: Option<&str>,
        input: types::TaskInput,
        cancel: CancellationToken,
    ) -> types::TaskResponse {
        let now = Utc::now();
        let task = types::TaskResponse {
            agent_id: None,
            archived_at: None,
            context_id: context_id.map(str::to_owned),
            created_at: now,
            created_by: LOCAL_PRINCIPAL.to_owned(),
            error: None,
            id: new_id("tsk"),
            input,
            last_activity_at: Some(now),
            output: None,
            parent_task_id: None,
            progress: Some(types::TaskProgress {
                eta_seconds: None,
                label: "queued".to_owned(),
                pct: 0.0,
                phase: 0,
                phases: 1,
            }),
            project_id: LOCAL_PROJECT.to_owned(),
            running_from: Some(now),
            runtime_seconds: 0,
            schedule: None,
            scheduled_at: None,
            session_id: session_id.map(str::to_owned),
            state: crate::TaskStatus::Running,
            steps: Vec::new(),
            timeout_at: None,
            timeout_seconds: None,
            tokens_completion: 0,
            tokens_prompt: 0,
            workflow: workflow.into(),
        };
        self.tasks.insert(
            task.id.clone(),
            TaskEntry {
                task: task.clone(),
                cancel,
                committed: false,
            },
        );
        self.dirty.tasks.insert(task.id.clone());
        self.dirty.created.insert(task.id.clone());
        self.evict_tasks();
        task
    }

    fn evict_tasks(&mut self) {
        while self.tasks.len() > MAX_TASKS {
            let oldest_done = self
                .tasks
                .iter()
                .find(|(_, t)| t.task.state.is_terminal())
                .map(|(id, _)| id.clone());
            match oldest_done {
                Some(id) => {
                    self.tasks.remove(&id);
                    self.dirty.tasks.insert(id);
                }
                None => break,
            }
        }
    }

    /// Marks a running task as past its point of no return.
    pub(crate) fn commit_task(&mut self, id: &str) {
        if let Some(t) = self.tasks.get_mut(id) {
            t.committed = true;
        }
    }

    /// Cancels a task on request, unless it has ended or committed its
    /// result (then it reports how it ends). Returns the task as it stands.
    pub(crate) fn cancel_task(&mut self, id: &str) -> LocalResult<types::TaskResponse> {
        let entry = self
            .tasks
            .get(id)
            .ok_or_else(|| LocalError::not_found(format!("task {id:?} not found")))?;
        if !entry.committed && !entry.task.state.is_terminal() {
            entry.cancel.cancel();
            self.end_task(
                id,
                crate::status::word::CANCELLED,
                None,
                Some("cancelled on request".to_owned()),
            );
        }
        Ok(self.tasks[id].task.clone())
    }

    /// Updates a task's progress (ignored once the task has ended).
    pub(crate) fn task_progress(&mut self, id: &str, phase: i64, phases: i64, label: &str) {
        if let Some(t) = self.tasks.get_mut(id) {
            if t.task.state.is_terminal() {
                return;
            }
            let now = Utc::now();
            t.task.progress = Some(types::TaskProgress {
                eta_seconds: None,
                label: label.to_owned(),
                pct: if phases > 0 {
                    (phase as f64 / phases as f64 * 100.0).min(100.0)
                } else {
                    0.0
                },
                phase,
                phases,
            });
            t.task.last_activity_at = Some(now);
            t.task.runtime_seconds = (now - t.task.created_at).num_seconds().max(0);
            self.dirty.tasks.insert(id.to_owned());
        }
    }

    /// Ends a task: `completed` with an output, `failed` with an error, or
    /// `cancelled`. A task that already ended keeps its first end.
    pub(crate) fn end_task(
        &mut self,
        id: &str,
        state: &str,
        output: Option<types::TaskOutput>,
        error: Option<String>,
    ) {
        if let Some(t) = self.tasks.get_mut(id) {
            if t.task.state.is_terminal() {
                return;
            }
            let now = Utc::now();
            t.task.state = state.into();
            t.task.output = output;
            t.task.error = error;
            t.task.last_activity_at = Some(now);
            t.task.runtime_seconds = (now - t.task.created_at).num_seconds().max(0);
            if state == crate::status::word::COMPLETED
                && let Some(p) = t.task.progress.as_mut()
            {
                p.pct = 100.0;
                p.phase = p.phases;
                p.label = "done".to_owned();
            }
            self.dirty.tasks.insert(id.to_owned());
        }
    }
}
