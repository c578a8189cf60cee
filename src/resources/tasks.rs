use std::time::Duration;

use futures::StreamExt;

use super::pages::{self, DEFAULT_MAX_ITEMS, DEFAULT_PAGE_SIZE, FetchFn, Fetched, Pages};
use crate::client::{Call, Poller, WaitPolicy};
use crate::error::{Error, Result};
use crate::status::TaskStatus;
use crate::{Client, types};

/// The API's largest `limit` for `GET /tasks`.
const TASKS_MAX_PAGE: u64 = 1000;

/// Task calls. Get one from [`Client::tasks`].
#[derive(Debug, Clone, Copy)]
pub struct Tasks<'c> {
    pub(crate) client: &'c Client,
}

/// A progress callback of [`Tasks::wait`].
type ProgressFn<'f> = Box<dyn FnMut(&types::TaskResponse) + Send + 'f>;

/// How [`Tasks::wait`] polls: a [`WaitPolicy`] (default: one hour) and an
/// optional progress callback.
#[must_use]
pub struct TaskWait<'f> {
    policy: WaitPolicy,
    on_progress: Option<ProgressFn<'f>>,
}

impl std::fmt::Debug for TaskWait<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskWait")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Default for TaskWait<'_> {
    fn default() -> Self {
        TaskWait {
            policy: WaitPolicy::default().timeout(Duration::from_secs(3600)),
            on_progress: None,
        }
    }
}

impl<'f> TaskWait<'f> {
    /// Polls at `policy`'s intervals ([`TaskWait::timeout`] stays).
    pub fn policy(mut self, policy: WaitPolicy) -> Self {
        self.policy = policy.timeout(self.policy.time_limit());
        self
    }

    /// Gives up after this long (default one hour) with [`Error::Timeout`];
    /// `None` waits until the task ends.
    pub fn timeout(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.policy = self.policy.timeout(timeout);
        self
    }

    /// The first polling interval (default 200 ms); it grows up to `max` (default 5 s).
    pub fn interval(mut self, initial: Duration, max: Duration) -> Self {
        self.policy = self.policy.interval(initial, max);
        self
    }

    /// Called with every polled task (its `progress` carries phase and percent).
    pub fn on_progress(mut self, f: impl FnMut(&types::TaskResponse) + Send + 'f) -> Self {
        self.on_progress = Some(Box::new(f));
        self
    }
}

impl<'c> Tasks<'c> {
    /// `GET /tasks/{id}`.
    ///
    /// # Errors
    /// Any [`Error`] of the call (404 for an unknown task).
    pub fn get<'a>(&self, id: &'a str) -> Call<'a, types::TaskResponse>
    where
        'c: 'a,
    {
        let client = self.client;
        Call::new(client.call_meta("get_task", client.api().get_task(id)))
    }

    /// `GET /tasks`: every task (newest first), filtered by the builder's
    /// options. `.await` it for the list, or read [`ListTasks::pages`].
    ///
    /// ```no_run
    /// # async fn run(client: nexus_knowql::Client) -> nexus_knowql::Result<()> {
    /// let running = client.tasks().list().context("docs").state("running").await?;
    /// println!("{} running", running.len());
    /// # Ok(()) }
    /// ```
    pub fn list(&self) -> ListTasks<'c> {
        ListTasks {
            client: self.client,
            context: None,
            state: None,
            workflow: None,
            search: None,
            page_size: DEFAULT_PAGE_SIZE,
            max_items: DEFAULT_MAX_ITEMS,
        }
    }

    /// `DELETE /tasks/{id}`: asks the task to stop.
    ///
    /// # Errors
    /// Any [`Error`] of the call.
    pub fn cancel<'a>(&self, id: &'a str, reason: Option<&str>) -> Call<'a, ()>
    where
        'c: 'a,
    {
        let client = self.client;
        let body = types::CancelTaskBody {
            pinecone_api_key: None,
            pushed: None,
            reason: reason.map(str::to_owned),
            target: None,
            user_token: None,
        };
        Call::new(async move {
            client
                .call_meta("cancel_task", client.api().cancel_task(id, &body))
                .await
        })
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
        let mut poller = Poller::new(&wait.policy);
        loop {
            let task = self.get(id).await?;
            if let Some(f) = wait.on_progress.as_mut() {
                f(&task);
            }
            if task.is_terminal() {
                return Ok(task);
            }
            if !poller.pause().await {
                return Err(poller.timed_out("get_task"));
            }
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
        match &task.state {
            TaskStatus::Completed => Ok(task),
            state => Err(Error::TaskFailed(Box::new(crate::error::TaskFailure {
                task_id: task.id.clone(),
                state: state.to_string(),
                message: task.error.clone().unwrap_or_default(),
            }))),
        }
    }
}

/// A listing of tasks. Get one from [`Tasks::list`]; each option is a filter
/// of `GET /tasks`.
#[derive(Debug, Clone)]
#[must_use = "a listing does nothing until awaited or read with pages()"]
pub struct ListTasks<'c> {
    client: &'c Client,
    context: Option<String>,
    state: Option<TaskStatus>,
    workflow: Option<crate::Workflow>,
    search: Option<String>,
    page_size: u64,
    max_items: usize,
}

impl<'c> ListTasks<'c> {
    /// Only the tasks of this context (slug or id).
    pub fn context(mut self, context: impl Into<String>) -> Self {
        self.context = Some(context.into());
        self
    }

    /// Only tasks in this state: a [`TaskStatus`] (or its name as `&str`;
    /// a word this version does not know is sent as it is).
    pub fn state(mut self, state: impl Into<TaskStatus>) -> Self {
        self.state = Some(state.into());
        self
    }

    /// Only tasks of this workflow ([`Workflow`](crate::Workflow), or its
    /// name as `&str`: `import`, `curate`, ...).
    pub fn workflow(mut self, workflow: impl Into<crate::Workflow>) -> Self {
        self.workflow = Some(workflow.into());
        self
    }

    /// The API's free-text filter (`q`).
    pub fn search(mut self, text: impl Into<String>) -> Self {
        self.search = Some(text.into());
        self
    }

    super::pages::paging_bounds!("Tasks", "tasks");

    /// The listing as a stream of pages, fetched as they are read.
    ///
    /// # Errors
    /// Each item is a page or the error that ended the listing: any
    /// [`Error`] of the calls, [`Error::Paging`] for pages that do not add
    /// up, [`Error::InvalidRequest`] for a page size out of range.
    pub fn pages(self) -> Pages<'c, types::TaskResponse> {
        let op = "list_tasks";
        let limit = match pages::page_size(op, self.page_size, TASKS_MAX_PAGE).and_then(|n| {
            std::num::NonZeroU64::new(n)
                .ok_or_else(|| Error::InvalidRequest(format!("{op}: page size must be at least 1")))
        }) {
            Ok(n) => n,
            Err(e) => return futures::stream::once(async { Err(e) }).boxed(),
        };
        let ListTasks {
            client,
            context,
            state,
            workflow,
            search,
            max_items,
            ..
        } = self;
        // The cursor is the 1-based page number; the matching offset is sent
        // too, so a server honouring either gets the same page.
        let fetch: FetchFn<'c, types::TaskResponse> = Box::new(move |page: u64| {
            let (context, state, workflow, search) = (
                context.clone(),
                state.clone(),
                workflow.clone(),
                search.clone(),
            );
            Box::pin(async move {
                let offset = page.saturating_sub(1).saturating_mul(limit.get());
                let answer = client
                    .call(
                        op,
                        client.api().list_tasks(
                            context.as_deref(),
                            Some(limit),
                            Some(i64::try_from(offset).unwrap_or(i64::MAX)),
                            Some(i64::try_from(page).unwrap_or(i64::MAX)),
                            search.as_deref(),
                            state.as_ref(),
                            workflow.as_ref(),
                        ),
                    )
                    .await?;
                tasks_page(op, page, offset, answer)
            })
        });
        pages::paginate(op, 1, max_items, |t| t.id.clone(), fetch)
    }
}

/// Checks a task page against the page asked for and finds the next one.
fn tasks_page(
    op: &'static str,
    asked: u64,
    asked_offset: u64,
    answer: types::ListTasksResponse,
) -> Result<Fetched<types::TaskResponse>> {
    let page = pages::position(op, "page", answer.page)?;
    let offset = pages::position(op, "offset", answer.offset)?;
    if page != asked && offset != asked_offset {
        return Err(pages::paging(
            op,
            format!("asked for page {asked}, the server answered page {page} (offset {offset})"),
        ));
    }
    let pages_total = pages::position(op, "pages", answer.pages)?;
    let total = pages::position(op, "total", answer.total)?;
    let next = (asked < pages_total).then(|| asked.saturating_add(1));
    Ok(Fetched {
        items: answer.items,
        offset,
        total: Some(total),
        next,
    })
}

super::pages::items_and_await!(
    ListTasks,
    types::TaskResponse,
    /// The tasks one by one, each page fetched when the one before is read;
    /// the errors of [`ListTasks::pages`] end it.
    ///
    /// ```no_run
    /// # async fn run(client: nexus_knowql::Client) -> nexus_knowql::Result<()> {
    /// use futures::TryStreamExt;
    /// let mut running = client.tasks().list().state("running").items();
    /// while let Some(task) = running.try_next().await? {
    ///     println!("{} {:?}", task.id, task.state);
    /// }
    /// # Ok(()) }
    /// ```
);
