//! Where the property tests keep their shrunk failures.
#![allow(dead_code, unreachable_pub)]

use proptest::test_runner::{Config, FileFailurePersistence};

/// `config`, with shrunk failures kept next to the test's source file as
/// `<module>.proptest-regressions` (committed with it). Proptest's default
/// would look in `tests/proptest-regressions/`, because each test group's
/// directory has a `main.rs`.
pub fn regressions_beside_source(config: Config) -> Config {
    Config {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..config
    }
}
