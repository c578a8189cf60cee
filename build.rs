//! Generates the low-level API layer (`nexus_knowql::api`) from the project's
//! OpenAPI file with progenitor.
//!
//! The spec file is the wire contract and stays complete. Two adjustments are
//! made in memory, only for the generator (see `openapi/README.md`):
//! - `upload_context_source` is left out: progenitor 0.11 cannot encode a
//!   `multipart/form-data` body, so the hand-written layer sends it.
//! - response media types other than JSON are left to progenitor's raw
//!   byte-stream handling (it prefers `application/json` when both exist).

use std::{env, fs, path::PathBuf};

const SPEC: &str = "openapi/nexus_2026-07.oas.yaml";
const HAND_WRITTEN_OPS: &[&str] = &["upload_context_source"];

fn main() {
    println!("cargo:rerun-if-changed={SPEC}");
    println!("cargo:rerun-if-changed=build.rs");

    let text = fs::read_to_string(SPEC).unwrap_or_else(|e| panic!("read {SPEC}: {e}"));
    let mut spec: openapiv3::OpenAPI =
        serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("parse {SPEC}: {e}"));

    for (_, item) in spec.paths.paths.iter_mut() {
        if let openapiv3::ReferenceOr::Item(item) = item {
            for slot in [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
            ] {
                let hand_written = slot
                    .as_ref()
                    .and_then(|op| op.operation_id.as_deref())
                    .is_some_and(|id| HAND_WRITTEN_OPS.contains(&id));
                if hand_written {
                    *slot = None;
                }
            }
        }
    }

    let mut settings = progenitor::GenerationSettings::default();
    settings
        .with_interface(progenitor::InterfaceStyle::Positional)
        .with_tag(progenitor::TagStyle::Merged)
        .with_derive("PartialEq")
        .with_inner_type(
            "crate::client::Transport"
                .parse::<proc_macro2::TokenStream>()
                .expect("inner type path is valid tokens"),
        );
    let mut generator = progenitor::Generator::new(&settings);
    let tokens = generator
        .generate_tokens(&spec)
        .unwrap_or_else(|e| panic!("generate client from {SPEC}: {e}"));
    let ast: syn::File =
        syn::parse2(tokens).unwrap_or_else(|e| panic!("parse generated code: {e}"));
    let code = prettyplease::unparse(&ast);
    // progenitor always emits an empty hooks impl; `src/api.rs` provides the
    // crate's own, which routes every call through `client::Transport`.
    let empty_hooks = "impl ClientHooks<crate::client::Transport> for &Client {}";
    assert!(
        code.contains(empty_hooks),
        "generated code layout changed: hooks impl not found"
    );
    let code = code.replace(empty_hooks, "");

    let out =
        PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("nexus_api.rs");
    fs::write(&out, code).unwrap_or_else(|e| panic!("write {}: {e}", out.display()));
}
