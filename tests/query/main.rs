//! Query turns against scripted servers that really stream, cut and replay:
//! sessions, streaming and resume, integrity under a misbehaving server,
//! turns that outlive their reader, and what errors advise. Default features.

#[path = "../support/mod.rs"]
mod support;

mod adapters;
mod advice;
mod binding;
mod content_resume;
mod edges;
mod hostile_model;
mod identity;
mod integrity;
mod integrity_prop;
mod job_lock;
mod one_bound;
mod resume_prop;
mod sequenced;
mod session;
mod start_protocol;
mod stream;
mod turn_edges;
mod turns_outlive_readers;
