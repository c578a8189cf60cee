//! The generated API layer: `src/api/generated.rs` is what the generator
//! makes of the spec, and every operation of the spec is callable.

#[path = "../support/mod.rs"]
mod support;

mod api_coverage;
mod code;
mod fidelity;
