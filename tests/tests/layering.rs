//! The layering of `order_core`, checked on its source text: the domain
//! knows no port, store, adapter or HTTP type; the ports do not name the
//! store (the entities they share live in the domain); the use cases import
//! no AWS adapter, no handler, no HTTP error and build no JSON. A grep, not
//! a compiler rule, so it is cheap and says which line broke it.

use std::path::{Path, PathBuf};

fn shared_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/src")
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    files.sort();
    files
}

/// The lines of `source` that name one of `forbidden`, comments left out
/// (a doc link to another layer is documentation, not a dependency).
fn offending_lines(source: &str, forbidden: &[&str]) -> Vec<String> {
    source
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
        .filter_map(|(i, line)| {
            forbidden.iter().find(|f| line.contains(*f)).map(|f| format!("line {}: {f}: {}", i + 1, line.trim()))
        })
        .collect()
}

/// Every offending line of `files`, by file.
fn violations(files: &[PathBuf], forbidden: &[&str]) -> Vec<String> {
    files
        .iter()
        .flat_map(|path| {
            let source = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
            let name = path.file_name().expect("a file name").to_string_lossy().into_owned();
            offending_lines(&source, forbidden).into_iter().map(move |l| format!("{name} {l}"))
        })
        .collect()
}

const NOT_IN_USE_CASES: &[&str] = &[
    "ApiError",
    "json_object",
    "crate::http",
    "crate::handlers",
    "crate::aws",
    "aws_sdk",
    "lambda_http",
    "serde_json::json",
    "json!(",
    "serde_json::Value",
];

const NOT_IN_DOMAIN: &[&str] = &[
    "crate::store",
    "crate::ports",
    "crate::aws",
    "crate::usecases",
    "crate::handlers",
    "crate::http",
    "crate::error",
    "aws_sdk",
    "lambda_",
];

#[test]
fn the_checker_finds_a_forbidden_import_and_skips_comments() {
    let source =
        "//! see [`crate::http`]\nuse crate::error::ApiError;\n    /// a json!(doc) example\nlet v = json!({});\n";
    let found = offending_lines(source, NOT_IN_USE_CASES);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].starts_with("line 2: ApiError"), "{found:?}");
    assert!(found[1].starts_with("line 4: json!("), "{found:?}");
}

#[test]
fn use_cases_import_no_adapter_handler_http_error_or_json() {
    let files = rust_files(&shared_src().join("usecases"));
    assert!(files.len() >= 10, "the use cases were not found: {files:?}");
    let found = violations(&files, NOT_IN_USE_CASES);
    assert!(found.is_empty(), "use cases reach outside their layer:\n{}", found.join("\n"));
}

#[test]
fn the_domain_depends_on_no_other_layer() {
    let files = rust_files(&shared_src().join("domain"));
    assert!(files.len() >= 8, "the domain was not found: {files:?}");
    let found = violations(&files, NOT_IN_DOMAIN);
    assert!(found.is_empty(), "the domain reaches outside itself:\n{}", found.join("\n"));
}

#[test]
fn ports_do_not_name_the_store_or_an_adapter() {
    let found = violations(&[shared_src().join("ports.rs")], &["crate::store", "crate::aws", "aws_sdk"]);
    assert!(found.is_empty(), "ports.rs names the store or an adapter:\n{}", found.join("\n"));
}
