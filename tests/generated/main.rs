//! The generated API layer: `src/api/generated.rs` is what the generator
//! makes of the spec, and every operation of the spec is callable.

mod api_coverage;
mod code;
