//! Typed turns: the `shape` of a turn derived from a Rust type, and the
//! turn's `output_json` checked against it and decoded into that type, with
//! an error that names the path of the field that did not fit.
//!
//! [`ShapeOf::shape_of`] sends the schema schemars derives for `T`, in the
//! JSON Schema subset a shape is sent in (see [`shape_for`] for what it
//! keeps and drops), and gives a [`TypedTurnBuilder`] that runs the turn as
//! usual: [`send`](TypedTurnBuilder::send),
//! [`stream`](TypedTurnBuilder::stream) (the text still streams; the value
//! comes at the end) or [`background`](TypedTurnBuilder::background).
//!
//! ```no_run
//! use nexus_knowql::typed::ShapeOf;
//!
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! struct Approval {
//!     /// Who approves.
//!     approver: String,
//!     /// The amount above which approval is needed.
//!     threshold_eur: Option<u32>,
//! }
//!
//! # async fn run(client: nexus_knowql::Client) -> nexus_knowql::Result<()> {
//! let session = client.session(["handbook"]).build()?;
//! let answer = session.ask("Who approves travel?").shape_of::<Approval>().send().await?;
//! println!("{} (above {:?} EUR)", answer.value.approver, answer.value.threshold_eur);
//! # Ok(()) }
//! ```

mod subset;

use std::fmt;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::query::{QueryEvent, QueryHandle, QueryTurn, TurnBuilder, TurnView};
use crate::types;

const OPERATION: &str = "typed_turn";

/// The `shape` sent for `T`: schemars' schema for it in the subset a shape
/// is sent in.
///
/// The subset is `type` (`object`, `string`, `number`, `integer`,
/// `boolean`, `array`), `properties`, `required`, `items`, `enum` (of
/// strings) and `description`. `$ref`s are inlined; an `Option` becomes its
/// inner type, left out of `required`; documented enum variants
/// (`oneOf` of constants) become one `enum`; every other keyword (`$schema`,
/// `title`, `format`, `minimum`, `maximum`, `default`, `examples`,
/// `additionalProperties`, ...) is dropped, and the decode into `T` checks
/// what they said.
///
/// # Errors
/// [`Error::InvalidRequest`] naming the field when `T` does not fit the
/// subset: its root is not a struct, an enum carries data, a map has no
/// fixed properties, a type refers to itself.
///
/// ```
/// #[derive(schemars::JsonSchema)]
/// struct Verdict { approved: bool, reason: Option<String> }
/// let shape = nexus_knowql::typed::shape_for::<Verdict>().unwrap();
/// assert_eq!(
///     serde_json::Value::Object(shape),
///     serde_json::json!({
///         "type": "object",
///         "properties": {
///             "approved": { "type": "boolean" },
///             "reason": { "type": "string" }
///         },
///         "required": ["approved"]
///     })
/// );
/// ```
pub fn shape_for<T: JsonSchema>() -> Result<Map<String, Value>> {
    let schema = schemars::schema_for!(T);
    subset::to_subset(schema.as_value()).map_err(|e| {
        Error::InvalidRequest(format!(
            "{} cannot be a shape: {e}",
            std::any::type_name::<T>()
        ))
    })
}

/// Checks a turn's `output_json` against `shape` and decodes it into `T`.
///
/// # Errors
/// [`Error::Decode`] naming the path of the first field that does not fit
/// (`details.mode: ...`), or saying that the turn has no `output_json`.
///
/// ```
/// #[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
/// struct Inner { level: u8 }
/// #[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
/// struct Outer { inner: Inner }
/// let shape = nexus_knowql::typed::shape_for::<Outer>().unwrap();
/// let bad = serde_json::json!({ "inner": { "level": "high" } });
/// let err = nexus_knowql::typed::decode::<Outer>(&shape, bad.as_object()).unwrap_err();
/// assert!(err.to_string().contains("inner.level"), "{err}");
/// ```
pub fn decode<T: DeserializeOwned>(
    shape: &Map<String, Value>,
    output_json: Option<&Map<String, Value>>,
) -> Result<T> {
    let Some(map) = output_json else {
        return Err(Error::decode(OPERATION, "the turn has no output_json", b""));
    };
    let value = Value::Object(map.clone());
    let body = || serde_json::to_vec(map).unwrap_or_default();
    if let Err(e) = subset::check(shape, &value, "") {
        return Err(Error::decode(
            OPERATION,
            format!("output_json does not fit the shape: {e}"),
            &body(),
        ));
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        Error::decode(
            OPERATION,
            format!("output_json at `{path}`: {}", e.into_inner()),
            &body(),
        )
    })
}

/// A turn's typed answer and the stored Query it came from.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Typed<T> {
    /// The `output_json`, decoded.
    pub value: T,
    /// The stored turn (answer text, citations, usage).
    pub query: types::Query,
}

/// Adds [`shape_of`](ShapeOf::shape_of) to [`TurnBuilder`].
pub trait ShapeOf {
    /// Sends the shape of `T` (see [`shape_for`]) and decodes the answer
    /// into `T`. A `T` outside the subset is reported when the turn is run.
    fn shape_of<T: JsonSchema + DeserializeOwned>(self) -> TypedTurnBuilder<T>;
}

impl ShapeOf for TurnBuilder {
    fn shape_of<T: JsonSchema + DeserializeOwned>(self) -> TypedTurnBuilder<T> {
        match shape_for::<T>() {
            Ok(shape) => TypedTurnBuilder {
                builder: self.shape(shape.clone()),
                shape: Ok(shape),
                _t: PhantomData,
            },
            Err(e) => TypedTurnBuilder {
                builder: self,
                shape: Err(e),
                _t: PhantomData,
            },
        }
    }
}

/// A [`TurnBuilder`] whose answer is a `T`: run it with
/// [`send`](Self::send), [`stream`](Self::stream) or
/// [`background`](Self::background).
pub struct TypedTurnBuilder<T> {
    builder: TurnBuilder,
    shape: Result<Map<String, Value>>,
    _t: PhantomData<fn() -> T>,
}

impl<T> fmt::Debug for TypedTurnBuilder<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TypedTurnBuilder")
            .field("type", &std::any::type_name::<T>())
            .field("builder", &self.builder)
            .finish_non_exhaustive()
    }
}

impl<T: DeserializeOwned> TypedTurnBuilder<T> {
    /// The shape that is sent.
    ///
    /// # Errors
    /// When `T` does not fit the subset (see [`shape_for`]).
    pub fn shape(&self) -> Result<&Map<String, Value>> {
        self.shape
            .as_ref()
            .map_err(|e| Error::InvalidRequest(e.to_string()))
    }

    /// Sets the other controls of the turn.
    pub fn map(mut self, f: impl FnOnce(TurnBuilder) -> TurnBuilder) -> Self {
        self.builder = f(self.builder);
        self
    }

    /// Runs the turn to its end ([`TurnBuilder::send`]) and decodes the answer.
    ///
    /// # Errors
    /// Those of [`TurnBuilder::send`] and of [`decode`];
    /// [`Error::InvalidRequest`] when `T` does not fit the subset.
    pub async fn send(self) -> Result<Typed<T>> {
        let shape = self.shape?;
        let query = self.builder.send().await?;
        let value = decode(&shape, query.output_json.as_ref())?;
        Ok(Typed { value, query })
    }

    /// Streams the turn ([`TurnBuilder::stream`]): the events as they come,
    /// then [`TypedTurn::finish`] for the value.
    ///
    /// # Errors
    /// Those of [`TurnBuilder::stream`]; [`Error::InvalidRequest`] when `T`
    /// does not fit the subset.
    pub async fn stream(self) -> Result<TypedTurn<T>> {
        let shape = self.shape?;
        let turn = self.builder.stream().await?;
        Ok(TypedTurn {
            inner: turn,
            shape,
            _t: PhantomData,
        })
    }

    /// Starts the turn in the background ([`TurnBuilder::background`]).
    ///
    /// # Errors
    /// Those of [`TurnBuilder::background`]; [`Error::InvalidRequest`] when
    /// `T` does not fit the subset.
    pub async fn background(self) -> Result<TypedHandle<T>> {
        let shape = self.shape?;
        let handle = self.builder.background().await?;
        Ok(TypedHandle {
            handle,
            shape,
            _t: PhantomData,
        })
    }
}

/// A streaming turn whose answer is a `T`: an adapter over any
/// [`TurnView`] (a [`QueryTurn`] by default, or another adapter such as a
/// [`CheckpointedTurn`](crate::CheckpointedTurn)), itself a [`Stream`] of
/// the turn's events; [`TypedTurn::finish`] gives the value.
///
/// A typed, checkpointed job:
///
/// ```no_run
/// use nexus_knowql::prelude::*;
/// use nexus_knowql::query::FileCheckpointStore;
/// use nexus_knowql::typed::shape_for;
///
/// #[derive(serde::Deserialize, schemars::JsonSchema)]
/// struct Summary { points: Vec<String> }
///
/// # async fn run(client: Client) -> Result<()> {
/// let store = FileCheckpointStore::new("/var/lib/app/checkpoints")?;
/// let ask = client.session(["handbook"]).build()?
///     .ask("Summarize the travel policy")
///     .shape(shape_for::<Summary>()?);
/// let job = CheckpointedTurn::start_or_resume(&client, store, "job-7", ask).await?;
/// let mut turn = TypedTurn::<Summary, _>::new(job)?;
/// while let Some(event) = turn.next().await {
///     let _ = event?;
/// }
/// let summary = turn.finish().await?;
/// println!("{} points", summary.value.points.len());
/// # Ok(()) }
/// ```
pub struct TypedTurn<T, V = QueryTurn> {
    inner: V,
    shape: Map<String, Value>,
    _t: PhantomData<fn() -> T>,
}

impl<T, V: TurnView> fmt::Debug for TypedTurn<T, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TypedTurn")
            .field("type", &std::any::type_name::<T>())
            .field("turn", self.inner.turn())
            .finish_non_exhaustive()
    }
}

impl<T: JsonSchema + DeserializeOwned, V: TurnView> TypedTurn<T, V> {
    /// Decodes the answer of the turn `inner` reads into `T`, checked
    /// against the shape of `T` (see [`shape_for`]); the turn must have
    /// been asked with that shape.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] when `T` does not fit the subset.
    pub fn new(inner: V) -> Result<Self> {
        Ok(TypedTurn {
            inner,
            shape: shape_for::<T>()?,
            _t: PhantomData,
        })
    }
}

impl<T: DeserializeOwned, V: TurnView> TypedTurn<T, V> {
    /// The turn, with what it accumulated so far.
    pub fn turn(&self) -> &QueryTurn {
        self.inner.turn()
    }

    /// The view this adapter reads, its answer no longer decoded.
    pub fn into_inner(self) -> V {
        self.inner
    }

    /// Reads the rest of the turn through the views below this one (as
    /// [`QueryTurn::finish`]) and decodes the answer.
    ///
    /// # Errors
    /// Those of [`QueryTurn::finish`] and of [`decode`].
    pub async fn finish(self) -> Result<Typed<T>> {
        let query = self.inner.finish().await?;
        let value = decode(&self.shape, query.output_json.as_ref())?;
        Ok(Typed { value, query })
    }
}

impl<T, V: TurnView> Stream for TypedTurn<T, V> {
    type Item = Result<QueryEvent>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().inner.poll_next_unpin(cx)
    }
}

/// As a view (under another adapter), a typed turn finishes as the turn
/// does, with the final Query; its own [`TypedTurn::finish`] decodes the
/// value, so put it outermost to get the value.
impl<T: DeserializeOwned, V: TurnView> TurnView for TypedTurn<T, V> {
    fn turn(&self) -> &QueryTurn {
        self.inner.turn()
    }

    fn into_turn(self) -> QueryTurn {
        self.inner.into_turn()
    }

    fn finish(self) -> impl std::future::Future<Output = Result<types::Query>> + Send {
        self.inner.finish()
    }
}

/// A background turn whose answer is a `T`.
pub struct TypedHandle<T> {
    handle: QueryHandle,
    shape: Map<String, Value>,
    _t: PhantomData<fn() -> T>,
}

impl<T> fmt::Debug for TypedHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TypedHandle")
            .field("type", &std::any::type_name::<T>())
            .field("handle", &self.handle)
            .finish_non_exhaustive()
    }
}

impl<T: DeserializeOwned> TypedHandle<T> {
    /// The untyped handle (poll, cancel, attach to events).
    pub fn handle(&mut self) -> &mut QueryHandle {
        &mut self.handle
    }

    /// Waits for the turn's end ([`QueryHandle::wait`], polling at `wait`'s
    /// intervals) and decodes the answer.
    ///
    /// # Errors
    /// Those of [`QueryHandle::wait`] and of [`decode`].
    pub async fn wait(&mut self, wait: crate::WaitPolicy) -> Result<Typed<T>> {
        let query = self.handle.wait(wait).await?;
        let value = decode(&self.shape, query.output_json.as_ref())?;
        Ok(Typed { value, query })
    }
}
