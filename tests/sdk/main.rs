//! The SDK's client against scripted servers: requests, retries, errors,
//! redirects, pagination, uploads and decoding. Default features.

#[path = "../support/mod.rs"]
mod support;

mod call_options;
mod client_http;
mod decode;
mod decode_props;
mod errors;
mod function_length;
mod metadata;
mod module_graph;
mod pagination;
mod redirects;
mod resources;
mod upload_retries;
