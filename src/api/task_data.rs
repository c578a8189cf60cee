//! Typed access to the task unions [`TaskInput`] and [`TaskOutput`].
//!
//! The spec describes a task's `input` and `output` as an `anyOf` of object
//! schemas that share field names (`status`, `trigger`, ...), so a document
//! does not say which branch it is, and a branch with fewer fields matches a
//! document of another. The generated layer keeps each as the JSON object
//! the server sent (nothing is dropped, whatever the workflow or a newer
//! server adds); these methods read it as the branch the caller means,
//! usually chosen by the task's `workflow`.
//!
//! ```
//! use nexus_knowql::types::{CurateInput, TaskInput};
//!
//! let input: TaskInput = serde_json::from_value(serde_json::json!({
//!     "trigger": "api", "force": true, "scope": "all", "legs": ["chunks"]
//! }))?;
//! let curate: CurateInput = input.decode()?;
//! assert!(curate.force);
//! assert_eq!(TaskInput::from(curate), input);
//! # Ok::<(), serde_json::Error>(())
//! ```

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::types::{self, TaskInput, TaskOutput, TaskResponse};

/// The JSON object a branch of a task union encodes as.
fn object_of<T: Serialize>(branch: &T) -> Map<String, Value> {
    match serde_json::to_value(branch) {
        Ok(Value::Object(map)) => map,
        // Every branch is a struct, or an enum of structs, with string keys.
        other => unreachable!("a task union branch encodes as a JSON object, not {other:?}"),
    }
}

macro_rules! json_object_union {
    ($union:ident, $what:literal: $($branch:ident),+ $(,)?) => {
        impl $union {
            #[doc = concat!("Reads the ", $what, " as `T`, normally one of the union's branches (see")]
            /// the type's docs): an error names the field that does not fit.
            ///
            /// A branch whose fields are all optional reads any object; pick
            /// the branch by the task's `workflow`.
            ///
            /// # Errors
            /// The object is not a `T`.
            pub fn decode<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
                serde_json::from_value(Value::Object(self.0.clone()))
            }
        }

        impl Default for $union {
            /// An empty object.
            fn default() -> Self {
                Self(Map::new())
            }
        }

        $(
            impl From<types::$branch> for $union {
                fn from(branch: types::$branch) -> Self {
                    Self(object_of(&branch))
                }
            }
        )+
    };
}

json_object_union!(
    TaskInput, "input":
    SearchInput, CurateInput, ImportInput, PackInput, RestoreInput, ExploreInput, ProfileInput,
    OptimizeInput, GroomInput,
);

json_object_union!(
    TaskOutput, "output":
    SearchTurnCompletedOutput, SearchCcTurnCompletedOutput, SearchTurnFailedOutput,
    PackTaskOutput, RestoreTaskOutput, OptimizeResultOutput, OptimizeNoopOutput,
    GroomMetricsOutput, CurateRunOutput, CurateManifestTuneOutput, CurateNoopOutput,
    ExploreOutput, ProfileEstimateOutput, ProfileEmptyOutput, ImportOutput, StatusErrorOutput,
    StateFailedOutput,
);

impl TaskResponse {
    /// The task's input as `T`, the input type of its workflow
    /// ([`CurateInput`](types::CurateInput) for `curate`, ...).
    ///
    /// # Errors
    /// The input is not a `T`.
    pub fn input_as<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        self.input.decode()
    }

    /// The task's output as `T` (for example
    /// [`CurateRunOutput`](types::CurateRunOutput) for a completed `curate`),
    /// or `None` while it has none.
    ///
    /// ```
    /// # fn show(task: &nexus_knowql::types::TaskResponse) -> Result<(), serde_json::Error> {
    /// use nexus_knowql::types::CurateRunOutput;
    ///
    /// if let Some(run) = task.output_as::<CurateRunOutput>()? {
    ///     println!("{} chunks created", run.delta.chunks_created);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The output is not a `T`.
    pub fn output_as<T: DeserializeOwned>(&self) -> Result<Option<T>, serde_json::Error> {
        self.output.as_ref().map(TaskOutput::decode).transpose()
    }
}
