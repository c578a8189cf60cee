//! The embedded local Nexus (feature `local`) end to end: its operations
//! through the SDK, conformance with the spec, queries, durability, limits
//! and safety, and the `nexus-local` binary.

#[path = "../support/mod.rs"]
mod support;

mod archive_bounds;
mod checkpoint_store;
#[cfg(feature = "failpoints")]
mod concurrent_model;
mod conformance;
mod conformance_ops;
mod connections;
mod connectors;
mod cross_site;
mod delete_during_work;
mod durability;
#[cfg(feature = "failpoints")]
mod failpoints;
mod follow_ups;
#[cfg(feature = "failpoints")]
mod frozen_clock;
mod limits;
#[cfg(target_os = "linux")]
mod memory_repros;
mod missing_data;
mod one_request;
mod ops;
mod ownership;
#[cfg(unix)]
mod private;
mod query;
#[cfg(feature = "failpoints")]
mod races;
mod rate_limits;
mod refused_uploads;
mod restart_fidelity;
mod safety;
mod scratch_starts;
mod sdk;
mod server;
mod session_reads;
#[cfg(feature = "failpoints")]
mod stops;
mod turns_outlive_clients;
#[cfg(feature = "schema")]
mod typed_turns;
mod verify_leftovers;
#[cfg(feature = "web")]
mod web_relay;
mod write_faults;
