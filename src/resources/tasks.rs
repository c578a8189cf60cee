use std::time::Duration;

use crate::error::{Error, Result};
use crate::{Client, types};

/// Task calls. Get one from [`Client::tasks`].
#[derive(Debug, Clone, Copy)]
pub struct Tasks<'c> {
    pub(crate) client: &'c Client,
}

/// A progress callback of [`Tasks::wait`].
type ProgressFn<'f> = Box<dyn FnMut(&types::TaskResponse) + Send + 'f>;

/// How [`Tasks::wait`] polls.
#[must_use]
pub struct TaskWait<'f> {
    timeout: Duration,
    initial_interval: Duration,
    max_interval: Duration,
    on_progress: Option<ProgressFn<'f>>,
}

impl std::fmt::Debug for TaskWait<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskWait")
            .field("timeout", &self.timeout)
            .field("initial_interval", &self.initial_interval)
            .field("max_interval", &self.max_interval)
            .finish_non_exhaustive()
    }
}

impl Default for TaskWait<'_> {
    fn default() -> Self {
        TaskWait {
            timeout: Duration::from_secs(3600),
            initial_interval: Duration::from_millis(200),
            max_interval: Duration::from_secs(5),
            on_progress: None,
        }
    }
}

impl<'f> TaskWait<'f> {
    /// Gives up after this long (default one hour) with [`Error::Timeout`].
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The first polling interval (default 200 ms); it doubles up to `max_interval`.
    pub fn interval(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_interval = initial;
        self.max_interval = max.max(initial);
        self
    }

    /// Called with every polled task (its `progress` carries phase and percent).
    pub fn on_progress(mut self, f: impl FnMut(&types::TaskResponse) + Send + 'f) -> Self {
        self.on_progress = Some(Box::new(f));
        self
    }
}

/// Whether a task state is final.
pub(crate) fn task_is_terminal(state: &str) -> bool {
    matches!(state, "completed" | "cancelled" | "failed")
}

impl Tasks<'_> {
    /// `GET /tasks/{id}`.
    ///
    /// # Errors
    /// Any [`Error`] of the call (404 for an unknown task).
    pub async fn get(&self, id: &str) -> Result<types::TaskResponse> {
        self.client
            .call("get_task", self.client.api().get_task(id, None))
            .await
    }

    /// `GET /tasks`, optionally for one context.
    ///
    /// # Errors
    /// Any [`Error`] of the call.
    pub async fn list(&self, context: Option<&str>) -> Result<types::ListTasksResponse> {
        self.client
            .call(
                "list_tasks",
                self.client
                    .api()
                    .list_tasks(context, None, None, None, None, None, None, None),
            )
            .await
    }

    /// `DELETE /tasks/{id}`: asks the task to stop.
    ///
    /// # Errors
    /// Any [`Error`] of the call.
    pub async fn cancel(&self, id: &str, reason: Option<&str>) -> Result<()> {
        let body = types::CancelTaskBody {
            pinecone_api_key: None,
            pushed: None,
            reason: reason.map(str::to_owned),
            target: None,
            user_token: None,
        };
        self.client
            .call(
                "cancel_task",
                self.client.api().cancel_task(id, None, &body),
            )
            .await
    }

    /// Polls `GET /tasks/{id}` until the task completes, fails or is cancelled.
    ///
    /// Returns the final task whatever its state; check `state` (or use
    /// [`Tasks::wait_completed`]).
    ///
    /// # Errors
    /// [`Error::Timeout`] when the wait's timeout passes; any error of the polls.
    ///
    /// # Cancel safety
    /// Dropping the future stops polling; the task goes on on the server.
    pub async fn wait(&self, id: &str, mut wait: TaskWait<'_>) -> Result<types::TaskResponse> {
        let started = tokio::time::Instant::now();
        let mut interval = wait.initial_interval;
        loop {
            let task = self.get(id).await?;
            if let Some(f) = wait.on_progress.as_mut() {
                f(&task);
            }
            if task_is_terminal(task.state.as_str()) {
                return Ok(task);
            }
            if started.elapsed().saturating_add(interval) > wait.timeout {
                return Err(Error::Timeout {
                    operation: "get_task",
                    elapsed_ms: crate::query::millis(started.elapsed()),
                });
            }
            tokio::time::sleep(interval).await;
            interval = interval.saturating_mul(2).min(wait.max_interval);
        }
    }

    /// Like [`Tasks::wait`], but a task that failed or was cancelled is an error.
    ///
    /// # Errors
    /// [`Error::TaskFailed`] for a failed or cancelled task, and the errors of
    /// [`Tasks::wait`].
    pub async fn wait_completed(
        &self,
        id: &str,
        wait: TaskWait<'_>,
    ) -> Result<types::TaskResponse> {
        let task = self.wait(id, wait).await?;
        match task.state.as_str() {
            "completed" => Ok(task),
            state => Err(Error::TaskFailed {
                task_id: task.id.clone(),
                state: state.to_owned(),
                message: task.error.clone().unwrap_or_default(),
            }),
        }
    }
}
