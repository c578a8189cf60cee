//! Running the `chat` and `nexus` examples from tests: their binaries (built
//! on first use, so a targeted `cargo test --test examples` never runs a
//! stale one), commands with a clean environment, and pseudo-terminal
//! sessions.

#![allow(dead_code)] // each test file uses a different part

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

#[cfg(unix)]
use rexpect::session::{Options, PtySession};

/// How long one expectation in a pseudo-terminal waits: generous, because a
/// loaded two-core machine can be slow to start a binary or curate.
#[cfg(unix)]
pub(crate) const PTY_TIMEOUT: Duration = Duration::from_secs(90);

/// A multi-threaded runtime for the servers a test starts beside an example.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The corpus shipped with the examples (`examples/corpus`).
pub(crate) fn corpus() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/corpus"))
}

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
        cmd.current_dir(env!("CARGO_MANIFEST_DIR")).args([
            "build",
            "--example",
            "chat",
            "--example",
            "nexus",
            "--example",
            "ask",
            "--example",
            "worker",
            "--example",
            "first_question",
            "--example",
            "background_turn",
        ]);
        if cfg!(feature = "schema") {
            cmd.args(["--example", "typed", "--example", "typed_worker"]);
        }
        if cfg!(feature = "web") {
            cmd.args(["--example", "web"]);
        }
        // Cargo gives the test process the package's variables. Some build
        // scripts rerun when they change (ring watches CARGO_MANIFEST_DIR),
        // so passing them on would rebuild half the tree, twice.
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            if key.starts_with("CARGO_PKG_")
                || matches!(
                    key.as_ref(),
                    "CARGO_MANIFEST_DIR"
                        | "CARGO_MANIFEST_PATH"
                        | "CARGO_CRATE_NAME"
                        | "CARGO_BIN_NAME"
                        | "CARGO_PRIMARY_PACKAGE"
                        | "CARGO_TARGET_TMPDIR"
                        | "CARGO_RUSTC_CURRENT_DIR"
                        | "OUT_DIR"
                )
            {
                cmd.env_remove(key.as_ref());
            }
        }
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
pub(crate) fn example_bin(name: &str) -> PathBuf {
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
pub(crate) fn example(name: &str, args: &[&str]) -> Command {
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
pub(crate) fn run(mut cmd: Command) -> Output {
    cmd.stdin(std::process::Stdio::null())
        .output()
        .expect("the example runs")
}

/// Runs `nexus` with `--base-url URL` and the arguments; panics unless it
/// succeeds. Returns stdout.
pub(crate) fn nexus_ok(base_url: &str, args: &[&str]) -> String {
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

/// A program running in a pseudo-terminal (stdin, stdout and stderr are the
/// terminal). Expectations are UTF-8 text; escape codes are stripped from
/// what the program prints. Unix only (`rexpect`).
#[cfg(unix)]
pub(crate) struct Pty {
    session: PtySession,
}

/// The pseudo-terminal reader hands out each byte as one `char`: text in
/// that form, so that non-ASCII expectations match.
#[cfg(unix)]
fn as_bytes_text(text: &str) -> String {
    text.bytes().map(char::from).collect()
}

/// The reverse of [`as_bytes_text`].
#[cfg(unix)]
fn from_bytes_text(text: &str) -> String {
    let bytes: Vec<u8> = text.chars().map(|c| c as u32 as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(unix)]
impl Pty {
    /// Starts a command in a new pseudo-terminal.
    pub(crate) fn spawn(cmd: Command) -> Pty {
        let session = rexpect::session::spawn_with_options(
            cmd,
            Options::new()
                .timeout_ms(Some(PTY_TIMEOUT.as_millis() as u64))
                .strip_ansi_escape_codes(true),
        )
        .expect("the example starts in a pseudo-terminal");
        Pty { session }
    }

    /// Waits for `needle`; returns what came before it.
    pub(crate) fn expect(&mut self, needle: &str) -> String {
        match self.session.exp_string(&as_bytes_text(needle)) {
            Ok(before) => from_bytes_text(&before),
            Err(e) => panic!(
                "waiting for {needle:?}: {}",
                from_bytes_text(&e.to_string())
            ),
        }
    }

    /// Waits for a match of `regex`; returns what came before it and the match.
    pub(crate) fn expect_regex(&mut self, regex: &str) -> (String, String) {
        match self.session.exp_regex(&as_bytes_text(regex)) {
            Ok((before, matched)) => (from_bytes_text(&before), from_bytes_text(&matched)),
            Err(e) => {
                let status = self.session.process().status();
                panic!(
                    "waiting for /{regex}/: {} (the program: {status:?})",
                    from_bytes_text(&e.to_string())
                )
            }
        }
    }

    /// Types a line and Enter.
    pub(crate) fn send_line(&mut self, line: &str) {
        self.session
            .send_line(line)
            .expect("the terminal takes input");
    }

    /// Presses Ctrl and a key (`'c'`, `'d'`).
    pub(crate) fn send_control(&mut self, key: char) {
        self.session
            .send_control(key)
            .expect("the terminal takes input");
    }

    /// Waits for the program to exit; returns its exit code (`None` when a
    /// signal ended it).
    pub(crate) fn exit_code(mut self) -> Option<i32> {
        use rexpect::process::WaitStatus;
        // Reading to the end keeps the program from blocking on a full terminal.
        let _ = self.session.exp_eof();
        match self.session.process().wait() {
            Ok(WaitStatus::Exited(_, code)) => Some(code),
            _ => None,
        }
    }
}

/// The lines of a byte buffer that hold something.
pub(crate) fn non_empty_lines(bytes: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(bytes)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}
