//! The examples (feature `local`) run as a person or a script would run
//! them: through pipes, and through a pseudo-terminal (`rexpect`, Unix only:
//! those tests are `#[cfg(unix)]`).

#[path = "../support/mod.rs"]
mod support;

mod answer_text;
mod ask;
mod ask_integrity;
mod base_url;
mod chat;
mod crash_and_cancel;
mod hostile_servers;
mod kill_anywhere;
mod nexus;
mod nexus_api;
mod scripting;
mod tasks_json;
mod turn_binding;
mod unknown_context;
