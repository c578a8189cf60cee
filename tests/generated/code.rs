//! `src/api/generated.rs` is exactly what progenitor makes of the spec.
//!
//! The generated layer is committed so that applications depending on the
//! crate do not build the generator, and so that it can be read and reviewed.
//! This test regenerates it from `openapi/nexus_2026-07.oas.yaml` and fails
//! when the committed file differs. To update the file after changing the
//! spec or the generator settings:
//!
//! ```text
//! NEXUS_REGENERATE=1 cargo test --test generated
//! ```

use std::{env, fs, path::Path, process::Command};

const SPEC: &str = "openapi/nexus_2026-07.oas.yaml";
const GENERATED: &str = "src/api/generated.rs";
/// Must match the `=` pin of `progenitor` in `Cargo.toml`.
const PROGENITOR: &str = "progenitor 0.15.1";
const REGENERATE: &str = "NEXUS_REGENERATE=1 cargo test --test generated";

/// Operations the hand-written layer sends itself: progenitor 0.11 cannot
/// encode a `multipart/form-data` body (see `openapi/README.md`).
const HAND_WRITTEN_OPS: &[&str] = &["upload_context_source"];

/// The header parameter every operation declares; the transport sets the
/// header, so the generated calls do not take it.
const VERSION_HEADER_PARAM: &str = "#/components/parameters/ApiVersionHeader";

/// progenitor's public constructor builds its own `reqwest::Client` (a fixed
/// 15 s timeout, a panic if it cannot); the crate builds the generated client
/// itself, so that constructor is removed and the other one is crate-private.
const CONSTRUCTOR_START: &str = "    /// Create a new client.\n";
const CONSTRUCTOR_END: &str = "    /// Construct a new client with an existing";
const WITH_CLIENT: &str = "    pub fn new_with_client(";

/// The spec's task unions: `anyOf` lists of object schemas that share field
/// names (`status`, `trigger`, ...). progenitor makes each a struct of
/// `#[serde(flatten)] Option<Branch>` fields; an earlier branch that shares
/// keys takes them and fails, and every later one stays `None`, so the data
/// is lost. They are generated as JSON objects instead (kept whole) and
/// `src/api/task_data.rs` decodes them into a branch's type on request.
const JSON_OBJECT_UNIONS: &[&str] = &["TaskInput", "TaskOutput"];

/// An open enum of the spec (an `x-enum` string) generated as one of the
/// crate's typed enums, which keep a value this version does not know as
/// `Other`.
struct TypedString {
    /// The schema progenitor replaces.
    schema: &'static str,
    /// The object and the path of properties (through inline objects)
    /// whose inline schema becomes `schema`, or `None` when the spec
    /// already names it.
    inline: Option<(&'static str, &'static [&'static str])>,
    /// The crate's type.
    rust_type: &'static str,
}

const TYPED_STRINGS: &[TypedString] = &[
    TypedString {
        schema: "QueryStatus",
        inline: Some(("Query", &["status"])),
        rust_type: "crate::QueryStatus",
    },
    TypedString {
        schema: "QueryFeedbackRating",
        inline: Some(("Query", &["feedback", "rating"])),
        rust_type: "crate::Rating",
    },
    TypedString {
        schema: "QueryRequestWorkflow",
        inline: Some(("QueryRequest", &["workflow"])),
        rust_type: "crate::Workflow",
    },
    TypedString {
        schema: "QueryRequestThinkingLevel",
        inline: Some(("QueryRequest", &["thinking_level"])),
        rust_type: "crate::ThinkingLevel",
    },
    TypedString {
        schema: "TaskState",
        inline: None,
        rust_type: "crate::TaskStatus",
    },
    TypedString {
        schema: "Workflow",
        inline: None,
        rust_type: "crate::Workflow",
    },
];

/// progenitor always emits an empty hooks impl; `src/api/mod.rs` provides the
/// crate's own, which routes every call through the crate's transport.
const EMPTY_HOOKS: &str = "impl ClientHooks<crate::transport::Transport> for &Client {}";

#[test]
fn generated_api_matches_spec() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let expected = generate(&root.join(SPEC));
    let path = root.join(GENERATED);
    let committed = fs::read_to_string(&path).unwrap_or_default();
    if committed == expected {
        return;
    }
    if env::var_os("NEXUS_REGENERATE").is_some() {
        fs::write(&path, &expected).unwrap_or_else(|e| panic!("write {GENERATED}: {e}"));
        eprintln!("rewrote {GENERATED} from {SPEC}");
        return;
    }
    let line = committed
        .lines()
        .zip(expected.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| committed.lines().count().min(expected.lines().count()));
    panic!(
        "{GENERATED} differs from what {PROGENITOR} generates from {SPEC} \
         (first difference at line {}).\nUpdate it with:\n\n    {REGENERATE}\n",
        line + 1
    );
}

/// The file as committed: header, then progenitor's output formatted with
/// prettyplease and rustfmt.
fn generate(spec_path: &Path) -> String {
    let text = fs::read_to_string(spec_path).unwrap_or_else(|e| panic!("read {SPEC}: {e}"));
    let mut spec: openapiv3::OpenAPI =
        serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("parse {SPEC}: {e}"));

    for (_, item) in spec.paths.paths.iter_mut() {
        if let openapiv3::ReferenceOr::Item(item) = item {
            item.parameters.retain(|p| !is_version_header(p));
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
                if let Some(op) = slot {
                    op.parameters.retain(|p| !is_version_header(p));
                }
            }
        }
    }

    let components = spec.components.as_mut().expect("the spec has components");
    for typed in TYPED_STRINGS {
        if let Some((object, path)) = typed.inline {
            name_inline_property(components, typed.schema, object, path);
        }
    }
    let schemas = &mut components.schemas;
    for name in JSON_OBJECT_UNIONS {
        let schema = schemas
            .get_mut(*name)
            .unwrap_or_else(|| panic!("{SPEC} has no schema {name}"));
        *schema = openapiv3::ReferenceOr::Item(json_object(schema));
    }

    // Operations take positional arguments; the types come from a second
    // run in builder style, which gives every struct a builder.
    let mut client = syn_file(&spec, progenitor::InterfaceStyle::Positional);
    let with_builders = syn_file(&spec, progenitor::InterfaceStyle::Builder);
    let mut types = types_module(&with_builders).clone();
    mark_non_exhaustive(&mut types);
    let slot = client
        .items
        .iter_mut()
        .find(|item| matches!(item, syn::Item::Mod(m) if m.ident == TYPES_MODULE))
        .expect("generated code layout changed: no `types` module");
    *slot = syn::Item::Mod(types);
    let code = prettyplease::unparse(&client);
    assert!(
        code.contains(EMPTY_HOOKS),
        "generated code layout changed: hooks impl not found"
    );
    let code = code.replace(EMPTY_HOOKS, "");

    format!("{}{}", header(), crate_private_constructor(&rustfmt(&code)))
}

/// The module progenitor puts the schema types in.
const TYPES_MODULE: &str = "types";

/// progenitor's output for `spec` with operations in `interface` style.
fn syn_file(spec: &openapiv3::OpenAPI, interface: progenitor::InterfaceStyle) -> syn::File {
    let mut settings = progenitor::GenerationSettings::default();
    settings
        .with_interface(interface)
        .with_tag(progenitor::TagStyle::Merged)
        .with_derive("PartialEq")
        .with_inner_type(
            "crate::transport::Transport"
                .parse::<proc_macro2::TokenStream>()
                .expect("inner type path is valid tokens"),
        );
    for typed in TYPED_STRINGS {
        settings.with_replacement(
            typed.schema,
            typed.rust_type,
            [progenitor::TypeImpl::Display].into_iter(),
        );
    }
    let mut generator = progenitor::Generator::new(&settings);
    let tokens = generator
        .generate_tokens(spec)
        .unwrap_or_else(|e| panic!("generate client from {SPEC}: {e}"));
    syn::parse2(tokens).unwrap_or_else(|e| panic!("parse generated code: {e}"))
}

/// The `types` module of a generated file.
fn types_module(file: &syn::File) -> &syn::ItemMod {
    file.items
        .iter()
        .find_map(|item| match item {
            syn::Item::Mod(m) if m.ident == TYPES_MODULE => Some(m),
            _ => None,
        })
        .expect("generated code layout changed: no `types` module")
}

/// Every struct with named fields and every enum of the module (not of its
/// submodules) becomes `#[non_exhaustive]`: a field or variant a later API
/// revision adds is then not a breaking change. Other crates read them as
/// before, match them with `..` or `_`, and build them with their builders.
fn mark_non_exhaustive(types: &mut syn::ItemMod) {
    let (_, items) = types
        .content
        .as_mut()
        .expect("generated code layout changed: `types` has no body");
    let mut marked = 0;
    for item in items.iter_mut() {
        let attrs = match item {
            syn::Item::Struct(s) if matches!(s.fields, syn::Fields::Named(_)) => &mut s.attrs,
            syn::Item::Enum(e) => &mut e.attrs,
            _ => continue,
        };
        attrs.push(syn::parse_quote!(#[non_exhaustive]));
        marked += 1;
    }
    assert!(
        marked > 100,
        "generated code layout changed: {marked} types marked"
    );
}

/// A JSON object schema standing for the `anyOf` union `schema`: any
/// properties, and a description naming the union's branches.
fn json_object(schema: &openapiv3::ReferenceOr<openapiv3::Schema>) -> openapiv3::Schema {
    let openapiv3::ReferenceOr::Item(openapiv3::Schema {
        schema_kind: openapiv3::SchemaKind::AnyOf { any_of },
        ..
    }) = schema
    else {
        panic!("generated code layout changed: a task union is no longer an anyOf");
    };
    let branches: Vec<String> = any_of
        .iter()
        .map(|b| match b {
            openapiv3::ReferenceOr::Reference { reference } => {
                let name = reference.trim_start_matches("#/components/schemas/");
                format!("[`{name}`]")
            }
            openapiv3::ReferenceOr::Item(item) => item
                .schema_data
                .title
                .clone()
                .unwrap_or_else(|| "an object".to_owned()),
        })
        .collect();
    let mut object = openapiv3::Schema {
        schema_data: Default::default(),
        schema_kind: openapiv3::SchemaKind::Type(openapiv3::Type::Object(openapiv3::ObjectType {
            additional_properties: Some(openapiv3::AdditionalProperties::Any(true)),
            ..Default::default()
        })),
    };
    object.schema_data.description = Some(format!(
        "One of {} (the spec's `anyOf`), kept as the JSON object it is; \
         `decode` reads it as one of them.",
        branches.join(", ")
    ));
    object
}

/// Moves the inline schema at `object.path` (properties, through inline
/// objects) to the named schema `name` and points the property at it, so
/// that a replacement can name its type.
fn name_inline_property(
    components: &mut openapiv3::Components,
    name: &str,
    object: &str,
    path: &[&str],
) {
    let Some(openapiv3::ReferenceOr::Item(schema)) = components.schemas.get_mut(object) else {
        panic!("{SPEC} has no schema {object}");
    };
    let (last, through) = path.split_last().expect("a property path");
    let mut fields = object_fields(schema, object);
    for property in through {
        let Some(openapiv3::ReferenceOr::Item(inner)) = fields.properties.get_mut(*property) else {
            panic!("{SPEC}: {object}.{property} is not an inline object");
        };
        fields = object_fields(inner, property);
    }
    let slot = fields
        .properties
        .get_mut(*last)
        .unwrap_or_else(|| panic!("{SPEC}: {object} has no property {}", path.join(".")));
    let reference = openapiv3::ReferenceOr::Reference {
        reference: format!("#/components/schemas/{name}"),
    };
    let openapiv3::ReferenceOr::Item(inline) = std::mem::replace(slot, reference) else {
        panic!("{SPEC}: {object}.{} is already a reference", path.join("."));
    };
    assert!(
        components
            .schemas
            .insert(name.to_owned(), openapiv3::ReferenceOr::Item(*inline))
            .is_none(),
        "{SPEC} already has a schema {name}"
    );
}

/// The properties of an object schema.
fn object_fields<'s>(
    schema: &'s mut openapiv3::Schema,
    name: &str,
) -> &'s mut openapiv3::ObjectType {
    match &mut schema.schema_kind {
        openapiv3::SchemaKind::Type(openapiv3::Type::Object(fields)) => fields,
        _ => panic!("{SPEC}: {name} is not an object schema"),
    }
}

fn is_version_header(p: &openapiv3::ReferenceOr<openapiv3::Parameter>) -> bool {
    matches!(p, openapiv3::ReferenceOr::Reference { reference } if reference == VERSION_HEADER_PARAM)
}

/// The formatted code without the public constructor, and with the other one
/// crate-private.
fn crate_private_constructor(code: &str) -> String {
    let start = code
        .find(CONSTRUCTOR_START)
        .expect("generated code layout changed: constructor `new` not found");
    let end = code[start..]
        .find(CONSTRUCTOR_END)
        .map(|n| start + n)
        .expect("generated code layout changed: `new_with_client` docs not found");
    let code = format!("{}{}", &code[..start], &code[end..]);
    assert!(
        code.contains(WITH_CLIENT),
        "generated code layout changed: `new_with_client` not found"
    );
    code.replacen(WITH_CLIENT, "    pub(crate) fn new_with_client(", 1)
}

fn header() -> String {
    format!(
        "// @generated by {PROGENITOR} from {SPEC}. Do not edit by hand.\n\
         //\n\
         // Operations left out (the hand-written layer sends them): {ops}.\n\
         // The `X-Pinecone-Api-Version` parameter is left out (the transport sends it).\n\
         // The empty `ClientHooks` impl progenitor emits is removed; `src/api/mod.rs`\n\
         // provides the crate's own. The constructor `new` is removed and\n\
         // `new_with_client` is crate-private. The task unions ({unions}) are JSON objects.\n\
         // The open enums ({typed}) are the crate's typed enums.\n\
         // The types come from a run in builder style (a builder per struct); every\n\
         // struct with named fields and every enum is `#[non_exhaustive]`.\n\
         // Formatted with prettyplease, then rustfmt.\n\
         // Regenerate (tests/generated/code.rs): {REGENERATE}\n\n",
        ops = HAND_WRITTEN_OPS.join(", "),
        unions = JSON_OBJECT_UNIONS.join(", "),
        typed = TYPED_STRINGS
            .iter()
            .map(|typed| typed.schema)
            .collect::<Vec<_>>()
            .join(", "),
    )
}

/// Formats with the toolchain's rustfmt, the same way `cargo fmt` does for
/// this crate (edition 2024, default style), reading and writing stdio.
fn rustfmt(code: &str) -> String {
    use std::io::Write;
    use std::process::Stdio;

    let rustfmt = env::var("RUSTFMT").unwrap_or_else(|_| "rustfmt".to_owned());
    let mut child = Command::new(&rustfmt)
        .args(["--edition", "2024", "--emit", "stdout"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("run `{rustfmt}` (install it with `rustup component add rustfmt`): {e}")
        });
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let input = code.to_owned();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("wait for `{rustfmt}`: {e}"));
    writer
        .join()
        .expect("writer thread")
        .unwrap_or_else(|e| panic!("write to `{rustfmt}`: {e}"));
    assert!(
        out.status.success(),
        "`{rustfmt}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("rustfmt writes UTF-8")
}
