//! Running the `chat` and `nexus` examples from tests: their binaries (built
//! on first use, so a targeted `cargo test --test examples_*` never runs a
//! stale one), commands with a clean environment, and pseudo-terminal
//! sessions.

#![allow(dead_code)] // each test file uses a different part

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use rexpect::session::{Options, PtySession};

/// How long one expectation in a pseudo-terminal waits: generous, because a
/// loaded two-core machine can be slow to start a binary or curate.
pub const PTY_TIMEOUT: Duration = Duration::from_secs(90);

/// The profile directory the tests were built into (`target/debug`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary knows its path");
    // target/<profile>/deps/<test binary>
    exe.parent()
        .and_then(Path::parent)
        .expect("test binaries live in target/<profile>/deps")
        .to_path_buf()
}

/// Builds both examples once per test process. Cargo does nothing when they
/// are fresh (as after `cargo test --all-features`, which builds examples).
fn build_examples() -> &'static Result<(), String> {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["build", "--example", "chat", "--example", "nexus"]);
        // The same features as this test, so the library is not rebuilt.
        if cfg!(feature = "mcp") {
            cmd.arg("--all-features");
        } else {
            cmd.args(["--features", "local"]);
        }
        if profile_dir().file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        match cmd.output() {
            Ok(out) if out.status.success() => Ok(()),
            Ok(out) => Err(format!(
                "`cargo build --example chat --example nexus` failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            )),
            Err(e) => Err(format!("cannot run cargo to build the examples: {e}")),
        }
    })
}

/// The path of an example's binary, built if needed.
pub fn example_bin(name: &str) -> PathBuf {
    if let Err(e) = build_examples() {
        panic!("{e}");
    }
    let bin = profile_dir().join("examples").join(name);
    assert!(
        bin.is_file(),
        "example binary {} is missing after building it",
        bin.display()
    );
    bin
}

/// A command running an example with the given arguments, without any
/// `NEXUS_*`/`PINECONE_*` variable from the caller's environment, and
/// without colour.
pub fn example(name: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(example_bin(name));
    cmd.args(args)
        .env_remove("NEXUS_BASE_URL")
        .env_remove("PINECONE_API_KEY")
        .env_remove("NEXUS_API_VERSION")
        .env_remove("CLICOLOR_FORCE")
        .env("NO_COLOR", "1")
        .env("TERM", "xterm")
        .env("RUST_LOG", "off");
    cmd
}

/// Runs a command to its end (stdin closed).
pub fn run(mut cmd: Command) -> Output {
    cmd.stdin(std::process::Stdio::null())
        .output()
        .expect("the example runs")
}

/// Runs `nexus` with `--base-url URL` and the arguments; panics unless it
/// succeeds. Returns stdout.
pub fn nexus_ok(base_url: &str, args: &[&str]) -> String {
    let mut all = vec!["--base-url", base_url];
    all.extend_from_slice(args);
    let out = run(example("nexus", &all));
    assert!(
        out.status.success(),
        "nexus {args:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("stdout is UTF-8")
}

/// Runs a command in a pseudo-terminal (stdin, stdout and stderr are the
/// terminal), with escape codes stripped from what the test reads.
pub fn spawn_pty(cmd: Command) -> PtySession {
    rexpect::session::spawn_with_options(
        cmd,
        Options::new()
            .timeout_ms(Some(PTY_TIMEOUT.as_millis() as u64))
            .strip_ansi_escape_codes(true),
    )
    .expect("the example starts in a pseudo-terminal")
}

/// Waits for the process of a pseudo-terminal session to exit and returns
/// its exit code (`None` when a signal ended it).
pub fn exit_code(session: &mut PtySession) -> Option<i32> {
    use rexpect::process::WaitStatus;
    // Reading to EOF keeps the child from blocking on a full terminal buffer.
    let _ = session.exp_eof();
    match session.process().wait() {
        Ok(WaitStatus::Exited(_, code)) => Some(code),
        _ => None,
    }
}

/// The lines of a byte buffer that hold something.
pub fn non_empty_lines(bytes: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(bytes)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}
