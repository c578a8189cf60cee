//! [`Session`]: a multi-turn conversation over pinned scope and configuration.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::turn::TurnBuilder;
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
        }
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
        Ok(Session::with_start(
            self.client,
            Start {
                session_id: None,
                previous_query_id: None,
                scope: self.scope,
                config: self.config,
                last_query_id: None,
            },
        ))
    }
}

/// A KnowQL session: turns share context and pinned configuration.
///
/// Cheap to clone; clones are the same session. A session runs one turn at
/// a time: while a turn is in flight (a [`QueryTurn`](crate::QueryTurn) not
/// yet ended or dropped, a [`QueryHandle`](crate::QueryHandle) not yet seen
/// terminal or dropped, or a `send()` under way), starting another turn
/// fails with [`Error::InvalidRequest`] before anything is sent, instead of
/// a 409 from the server.
///
/// The session learns its id from its first turn.
#[derive(Clone)]
pub struct Session {
    pub(crate) client: Client,
    pub(crate) shared: Arc<Shared>,
}

pub(crate) struct Shared {
    start: Mutex<Start>,
    in_flight: AtomicBool,
}

/// What the next turn sends to join (or start) the session.
#[derive(Debug, Clone, Default)]
pub(crate) struct Start {
    pub(crate) session_id: Option<String>,
    pub(crate) previous_query_id: Option<String>,
    pub(crate) scope: Vec<String>,
    pub(crate) config: PinnedConfig,
    pub(crate) last_query_id: Option<String>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let start = self.shared.lock();
        f.debug_struct("Session")
            .field("id", &start.session_id)
            .field("scope", &start.scope)
            .field("last_query_id", &start.last_query_id)
            .field("in_flight", &self.shared.in_flight.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Session {
    fn with_start(client: Client, start: Start) -> Session {
        Session {
            client,
            shared: Arc::new(Shared {
                start: Mutex::new(start),
                in_flight: AtomicBool::new(false),
            }),
        }
    }

    /// An existing session, continued by its id. Nothing is sent.
    pub fn resume(client: &Client, session_id: impl Into<String>) -> Session {
        Session::with_start(
            client.clone(),
            Start {
                session_id: Some(session_id.into()),
                ..Start::default()
            },
        )
    }

    /// The session of an earlier turn, continued from that turn's id
    /// (`previous_query_id`). Nothing is sent; later turns use the session
    /// id the first one reports.
    pub fn continue_from(client: &Client, previous_query_id: impl Into<String>) -> Session {
        Session::with_start(
            client.clone(),
            Start {
                previous_query_id: Some(previous_query_id.into()),
                ..Start::default()
            },
        )
    }

    /// The session's id, once a turn has reported it.
    pub fn id(&self) -> Option<String> {
        self.shared.lock().session_id.clone()
    }

    /// The id of the last turn started in this session, if known.
    pub fn last_query_id(&self) -> Option<String> {
        self.shared.lock().last_query_id.clone()
    }

    /// Whether a turn of this session is in flight.
    pub fn is_busy(&self) -> bool {
        self.shared.in_flight.load(Ordering::Acquire)
    }

    /// Starts a turn: set per-turn controls on the builder, then run it with
    /// `send()`, `stream()` or `background()`.
    pub fn ask(&self, text: impl Into<String>) -> TurnBuilder {
        TurnBuilder::new(self.clone(), text.into())
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

/// The right to run one turn of a session; released when dropped.
pub(crate) struct TurnSlot {
    shared: Arc<Shared>,
    released: AtomicBool,
}

impl fmt::Debug for TurnSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TurnSlot")
            .field("released", &self.released.load(Ordering::Relaxed))
            .finish()
    }
}

impl TurnSlot {
    /// Takes the session's slot.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] when another turn holds it.
    pub(crate) fn acquire(shared: &Arc<Shared>) -> Result<TurnSlot> {
        if shared
            .in_flight
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            let id = shared.lock().session_id.clone();
            return Err(Error::InvalidRequest(format!(
                "session {} already has a turn in flight; finish, drop or cancel it first",
                id.as_deref().unwrap_or("(new)")
            )));
        }
        Ok(TurnSlot {
            shared: Arc::clone(shared),
            released: AtomicBool::new(false),
        })
    }

    /// Records what a turn reported about the session.
    pub(crate) fn learn(&self, session_id: Option<&str>, query_id: Option<&str>) {
        let mut start = self.shared.lock();
        if let Some(s) = session_id.filter(|s| !s.is_empty())
            && start.session_id.as_deref() != Some(s)
        {
            start.session_id = Some(s.to_owned());
        }
        if let Some(q) = query_id.filter(|q| !q.is_empty())
            && start.last_query_id.as_deref() != Some(q)
        {
            start.last_query_id = Some(q.to_owned());
        }
    }

    /// Lets the session start another turn (idempotent).
    pub(crate) fn release(&self) {
        if !self.released.swap(true, Ordering::AcqRel) {
            self.shared.in_flight.store(false, Ordering::Release);
        }
    }
}

impl Drop for TurnSlot {
    fn drop(&mut self) {
        self.release();
    }
}
