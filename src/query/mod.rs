//! KnowQL turns: sessions, streaming with exactly-once reconnects, background turns.
//!
//! A [`Session`] pins a scope (1 to 10 contexts) and configuration; each
//! [`Session::ask`] gives a [`TurnBuilder`] with the per-turn controls and
//! three ways to run the turn:
//!
//! - [`TurnBuilder::send`]: wait for the whole turn and get the stored
//!   [`Query`](crate::types::Query).
//! - [`TurnBuilder::stream`]: a [`QueryTurn`], a `Stream` of [`QueryEvent`]s
//!   that accumulates the answer and reconnects a broken connection with
//!   `Last-Event-ID` so that every event arrives exactly once, in order.
//! - [`TurnBuilder::background`]: a [`QueryHandle`] to poll, wait for,
//!   attach to or cancel.
//!
//! ```no_run
//! # async fn run() -> nexus_knowql::Result<()> {
//! use nexus_knowql::prelude::*;
//!
//! let client = Client::from_env()?;
//! let session = client.session(["handbook"]).build()?;
//! let mut text = session.ask("Who approves travel?").stream().await?.text_stream();
//! while let Some(delta) = text.next().await {
//!     print!("{}", delta?);
//! }
//! let query = text.into_inner().finish().await?;
//! eprintln!("\n{} citations", query.citations.len());
//! # Ok(()) }
//! ```
//!
//! Layout, from the bottom up (each file imports only from those before
//! it): `checkpoint` (Checkpoint, TextDigest), `checkpoint_record` (what
//! a CheckpointStore keeps), `event` (QueryEvent), `sse` (the SSE
//! parser), `span` (a turn's tracing span),
//! `accumulated` (what a turn delivered, checked against the final answer),
//! `config` (StreamConfig), `fetch` (the events and stored-turn requests),
//! `stream` (the reconnecting connection), `session` (Session and its
//! builder), `slot` (the one-turn-at-a-time slot), `turn` (QueryTurn),
//! `view` (TurnView, the adapters stack over a turn; TextStream and
//! SequencedTurn, which end a stack),
//! `background` (QueryHandle, `QueryTurn::detach`), `builder` (TurnBuilder,
//! `Session::ask`), `checkpoint_store` (CheckpointStore,
//! FileCheckpointStore), `checkpoint_start` (finding the turn a job
//! started), `checkpointed` (CheckpointedTurn).

// Alphabetical (rustfmt); the layering is in the module documentation.
mod accumulated;
mod background;
mod builder;
mod checkpoint;
mod checkpoint_record;
mod checkpoint_start;
mod checkpoint_store;
mod checkpointed;
mod config;
mod delta;
mod event;
mod fetch;
mod identity;
mod session;
mod slot;
mod span;
mod sse;
mod stream;
mod turn;
mod view;

pub use crate::error::CheckpointError;
pub use background::QueryHandle;
pub use builder::{MAX_TURN_SECONDS, TurnBuilder};
pub use checkpoint::{Checkpoint, END_OF_TURN, TextDigest};
pub use checkpoint_record::{
    CheckpointRecord, FailedTurn, MAX_REASON_CHARS, SessionMark, StartIntent,
};
pub use checkpoint_start::{IfNotFound, StartProtocol};
pub use checkpoint_store::{
    CheckpointStore, FileCheckpointStore, KeyLock, MAX_CHECKPOINT_BYTES, MAX_KEY_LEN,
};
pub use checkpointed::CheckpointedTurn;
pub use config::StreamConfig;
pub use event::{QueryEvent, names};
pub(crate) use fetch::path_segment;
pub use session::{MAX_SCOPE, Session, SessionBuilder, WhenBusy};
pub use sse::DEFAULT_MAX_FRAME_BYTES;
pub use turn::QueryTurn;
pub use view::{SequencedEvent, SequencedTurn, TextStream, TurnView};

use crate::error::{Error, Result};

/// Decodes a recorded or received SSE byte stream of a query turn into
/// events, without a connection: for replaying recorded streams, proxies and
/// tests. It applies the same framing rules and frame limit as [`QueryTurn`],
/// but neither reconnects nor drops replayed events.
///
/// ```
/// use nexus_knowql::query::EventDecoder;
/// use nexus_knowql::QueryEvent;
/// let mut decoder = EventDecoder::new();
/// decoder.feed(b"id: 3\nevent: response.output_text.delta\ndata: {\"delta\":\"Hi\"}\n\n");
/// let (id, event) = decoder.next_event().unwrap().unwrap();
/// assert_eq!(id, Some(3));
/// assert_eq!(event, QueryEvent::TextDelta { delta: "Hi".into() });
/// assert!(decoder.next_event().unwrap().is_none());
/// ```
#[derive(Debug)]
pub struct EventDecoder {
    parser: sse::SseParser,
}

impl Default for EventDecoder {
    fn default() -> Self {
        EventDecoder::new()
    }
}

impl EventDecoder {
    /// A decoder with the default frame limit ([`DEFAULT_MAX_FRAME_BYTES`]).
    pub fn new() -> Self {
        EventDecoder::with_max_frame_bytes(DEFAULT_MAX_FRAME_BYTES)
    }

    /// A decoder whose frames may have at most `limit` bytes.
    pub fn with_max_frame_bytes(limit: usize) -> Self {
        EventDecoder {
            parser: sse::SseParser::new(limit),
        }
    }

    /// Appends received bytes (any split, any line ending).
    pub fn feed(&mut self, bytes: &[u8]) {
        self.parser.feed(bytes);
    }

    /// The next complete event with its `id:` (if the frame had one), or
    /// `Ok(None)` when more bytes are needed.
    ///
    /// # Errors
    /// [`Error::Stream`] for a frame over the limit or not UTF-8; the stream
    /// cannot be decoded further.
    pub fn next_event(&mut self) -> Result<Option<(Option<u64>, QueryEvent)>> {
        match self.parser.next_frame() {
            Ok(Some(f)) => Ok(Some((f.id, QueryEvent::decode(f.event, f.data)))),
            Ok(None) => Ok(None),
            Err(e) => Err(Error::Stream {
                query_id: None,
                message: e.to_string(),
            }),
        }
    }
}
