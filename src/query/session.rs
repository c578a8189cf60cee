//! [`Session`]: a multi-turn conversation over pinned scope and configuration.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::client::WaitPolicy;
use crate::error::{Error, Result};
use crate::{Client, types};

/// The most contexts a session may span.
pub const MAX_SCOPE: usize = 10;

/// Configures a new session; get one from [`Client::session`].
///
/// Scope and configuration are sent with the first turn and pinned by the
/// server for the session's life.
#[must_use]
#[derive(Clone)]
pub struct SessionBuilder {
    client: Client,
    scope: Vec<String>,
    config: PinnedConfig,
    when_busy: WhenBusy,
}

/// What a new turn does while the session still runs an earlier one (a turn
/// dropped or detached before its end, or one started by another process).
///
/// Either way the SDK never lets the server's 409 through: it checks the
/// earlier turn with `GET /queries/{id}` first.
///
/// ```
/// use std::time::Duration;
/// use nexus_knowql::{WaitPolicy, WhenBusy};
/// let wait = WhenBusy::Wait(WaitPolicy::default().interval(Duration::from_millis(500), Duration::from_secs(5)));
/// # let _ = wait;
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum WhenBusy {
    /// Fail at once with [`Error::SessionBusy`], which names the running
    /// turn (the default).
    #[default]
    Fail,
    /// Poll the running turn at the [`WaitPolicy`]'s intervals until it
    /// ends, then start the new one. The wait counts against the new turn's
    /// [`turn_timeout`](crate::ClientBuilder::turn_timeout); when that
    /// passes first, fail with [`Error::SessionBusy`].
    Wait(WaitPolicy),
}

/// Session configuration sent with the first turn only.
#[derive(Debug, Clone, Default)]
pub(crate) struct PinnedConfig {
    pub(crate) system_prompt: Option<String>,
    pub(crate) guardrails: Option<String>,
    pub(crate) model: Option<String>,
    pub(crate) models: Vec<String>,
    pub(crate) tools: Vec<String>,
}

impl fmt::Debug for SessionBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionBuilder")
            .field("scope", &self.scope)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Starts configuring a session over `scope`: 1 to 10 context slugs or ids.
    ///
    /// ```no_run
    /// # async fn run(client: nexus_knowql::Client) -> nexus_knowql::Result<()> {
    /// let session = client.session(["handbook"]).model("fast").build()?;
    /// let first = session.ask("Who approves travel?").send().await?;
    /// let second = session.ask("And above 5000 EUR?").send().await?;
    /// println!("{}\n{}", first.answer_text(), second.answer_text());
    /// # Ok(()) }
    /// ```
    pub fn session<I, S>(&self, scope: I) -> SessionBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        SessionBuilder {
            client: self.clone(),
            scope: scope.into_iter().map(Into::into).collect(),
            config: PinnedConfig::default(),
            when_busy: WhenBusy::Fail,
        }
    }

    /// Continues an existing session by its id: the next
    /// [`Session::ask`] is a follow-up in it. Nothing is sent.
    ///
    /// ```no_run
    /// # async fn run(client: nexus_knowql::Client, session_id: &str) -> nexus_knowql::Result<()> {
    /// let session = client.continue_session(session_id);
    /// let answer = session.ask("And above 5000 EUR?").send().await?;
    /// # drop(answer); Ok(()) }
    /// ```
    pub fn continue_session(&self, session_id: impl Into<String>) -> Session {
        Session::with_start(
            self.clone(),
            Start {
                session_id: Some(session_id.into()),
                ..Start::default()
            },
        )
    }

    /// Continues the session of an earlier turn, known by that turn's id
    /// (`previous_query_id`). Nothing is sent; later turns use the session
    /// id the first one reports.
    pub fn continue_after(&self, previous_query_id: impl Into<String>) -> Session {
        Session::with_start(
            self.clone(),
            Start {
                previous_query_id: Some(previous_query_id.into()),
                ..Start::default()
            },
        )
    }
}

impl SessionBuilder {
    /// A system prompt for every turn of the session.
    pub fn system_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.config.system_prompt = Some(prompt.into());
        self
    }

    /// Guardrails text for every turn of the session.
    pub fn guardrails(mut self, guardrails: impl Into<String>) -> Self {
        self.config.guardrails = Some(guardrails.into());
        self
    }

    /// The model to answer with (see [`Client::models`]).
    pub fn model(mut self, model: impl Into<String>) -> Self {
        self.config.model = Some(model.into());
        self
    }

    /// Several models, for comparison turns.
    pub fn models<I, S>(mut self, models: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.config.models = models.into_iter().map(Into::into).collect();
        self
    }

    /// The tools turns may use.
    pub fn tools<I, S>(mut self, tools: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.config.tools = tools.into_iter().map(Into::into).collect();
        self
    }

    /// What a turn does while an earlier turn of the session still runs
    /// (default [`WhenBusy::Fail`]).
    pub fn when_busy(mut self, when_busy: WhenBusy) -> Self {
        self.when_busy = when_busy;
        self
    }

    /// Checks the scope and returns the session. Nothing is sent yet: the
    /// first turn creates the session on the server.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] when the scope is empty, has more than 10
    /// entries or an empty one.
    pub fn build(self) -> Result<Session> {
        if self.scope.is_empty() || self.scope.len() > MAX_SCOPE {
            return Err(Error::InvalidRequest(format!(
                "a session scope needs 1 to {MAX_SCOPE} contexts, got {}",
                self.scope.len()
            )));
        }
        if self.scope.iter().any(|s| s.trim().is_empty()) {
            return Err(Error::InvalidRequest(
                "a session scope entry is empty".into(),
            ));
        }
        let session = Session::with_start(
            self.client,
            Start {
                scope: self.scope,
                config: self.config,
                ..Start::default()
            },
        );
        Ok(session.with_when_busy(self.when_busy))
    }
}

/// A KnowQL session: turns share context and pinned configuration.
///
/// Cheap to clone; clones are the same session. A session runs one turn at
/// a time, and it remembers its turn until it has seen it end:
///
/// - While a turn is held in this process (a [`QueryTurn`](crate::QueryTurn)
///   not yet ended, a [`QueryHandle`](crate::QueryHandle) not yet seen
///   terminal, or a `send()` under way), a new turn first asks the server
///   (`GET /queries/{id}`, or the stored session while the turn has no id):
///   if it has ended, the new turn goes ahead; otherwise it fails with
///   [`Error::SessionBusy`] naming it (or waits, see [`WhenBusy`]).
/// - A turn dropped or detached before its end may still run on the server.
///   The next turn first asks `GET /queries/{id}`: if the earlier turn has
///   ended it goes ahead, otherwise it fails with [`Error::SessionBusy`]
///   (or waits for it).
/// - A 409 from the server because a turn started elsewhere still runs is
///   reported the same way.
///
/// Nothing reaches the server before these checks, so a refused turn is
/// never started.
///
/// The session learns its id from its first turn.
#[derive(Clone)]
pub struct Session {
    pub(crate) client: Client,
    pub(crate) shared: Arc<Shared>,
    pub(crate) when_busy: WhenBusy,
}

pub(crate) struct Shared {
    start: Mutex<Start>,
}

/// The session's current turn, as far as this process knows.
#[derive(Debug, Clone)]
pub(crate) struct Running {
    /// Tells this turn's slot from a later one's.
    pub(crate) generation: u64,
    /// The turn's id, once known.
    pub(crate) query_id: Option<String>,
    /// An object in this process still owns the turn (it was not dropped).
    pub(crate) held: bool,
    /// For a held turn not named yet: the running turn the server's stored
    /// session shows, when it was asked.
    pub(crate) on_server: Option<String>,
}

/// What the next turn sends to join (or start) the session.
#[derive(Debug, Clone, Default)]
pub(crate) struct Start {
    pub(crate) session_id: Option<String>,
    pub(crate) previous_query_id: Option<String>,
    pub(crate) scope: Vec<String>,
    pub(crate) config: PinnedConfig,
    pub(crate) last_query_id: Option<String>,
    /// The turn the session last started, until it is seen to end.
    pub(crate) running: Option<Running>,
    /// The generation the next turn gets.
    pub(crate) next_generation: u64,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let start = self.shared.lock();
        f.debug_struct("Session")
            .field("id", &start.session_id)
            .field("scope", &start.scope)
            .field("last_query_id", &start.last_query_id)
            .field("running", &start.running)
            .field("when_busy", &self.when_busy)
            .finish_non_exhaustive()
    }
}

impl Session {
    fn with_start(client: Client, start: Start) -> Session {
        Session {
            client,
            shared: Arc::new(Shared {
                start: Mutex::new(start),
            }),
            when_busy: WhenBusy::Fail,
        }
    }

    /// The same session with another [`WhenBusy`] policy for the turns
    /// asked through this value (clones made later inherit it).
    #[must_use]
    pub fn with_when_busy(mut self, when_busy: WhenBusy) -> Session {
        self.when_busy = when_busy;
        self
    }

    /// The session's id, once a turn has reported it.
    pub fn id(&self) -> Option<String> {
        self.shared.lock().session_id.clone()
    }

    /// The id of the last turn started in this session, if known.
    pub fn last_query_id(&self) -> Option<String> {
        self.shared.lock().last_query_id.clone()
    }

    /// Whether a turn of this session is held in this process (a live
    /// [`QueryTurn`](crate::QueryTurn) or [`QueryHandle`](crate::QueryHandle),
    /// or a `send()` under way).
    pub fn is_busy(&self) -> bool {
        self.shared.lock().running.as_ref().is_some_and(|r| r.held)
    }

    /// The id of the last turn this session started, while it has not been
    /// seen to end (it may still run on the server after being dropped or
    /// detached). The next turn checks it before starting.
    pub fn unfinished_query_id(&self) -> Option<String> {
        self.shared
            .lock()
            .running
            .as_ref()
            .and_then(|r| r.query_id.clone())
    }

    /// `GET /sessions/{id}`: the stored session with its turns.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] before the session id is known; any error of the call.
    pub async fn get(&self) -> Result<types::GetSessionResponse> {
        let id = self.id().ok_or_else(|| {
            Error::InvalidRequest("the session has no id yet: run a turn first".into())
        })?;
        self.client.sessions().get(&id).await
    }
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Start> {
        // A panic elsewhere cannot leave `Start` half-written (plain field
        // stores), so a poisoned lock is still usable.
        self.start.lock().unwrap_or_else(|p| p.into_inner())
    }
}
