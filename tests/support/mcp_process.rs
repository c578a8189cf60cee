//! `nexus-mcp --transport http` as a child process, as an operator runs it:
//! on a free loopback port, perhaps under a lowered open-file limit, its
//! log collected, its open descriptors and resident memory read from
//! `/proc` (Linux). Killed on drop.
#![allow(dead_code, unreachable_pub)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncBufReadExt;

/// The most log lines kept (later ones are counted, not kept).
const KEPT_LOG_LINES: usize = 20_000;

/// A running `nexus-mcp --transport http`.
pub struct McpProcess {
    child: tokio::process::Child,
    /// `http://ADDR`.
    pub base: String,
    /// The MCP endpoint, `http://ADDR/mcp`.
    pub url: String,
    log: Arc<Mutex<Vec<String>>>,
}

/// How to start one [`McpProcess`].
#[derive(Debug, Default, Clone)]
pub struct Launch {
    /// Command-line arguments after `--transport http --bind 127.0.0.1:0`.
    pub args: Vec<String>,
    /// The only environment the process gets (it starts from an empty one).
    pub env: Vec<(String, String)>,
    /// The soft and hard open-file limit (`ulimit -n`) it runs under.
    pub open_files: Option<u32>,
}

impl Launch {
    /// A process with `args`.
    pub fn args(args: &[&str]) -> Launch {
        Launch {
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            ..Launch::default()
        }
    }

    /// Sets the environment variable `name`.
    pub fn env(mut self, name: &str, value: &str) -> Launch {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Runs under an open-file limit of `limit`.
    pub fn open_files(mut self, limit: u32) -> Launch {
        self.open_files = Some(limit);
        self
    }

    /// Starts the process and waits (at most 20 s) until it serves.
    pub async fn start(self) -> McpProcess {
        let exe = env!("CARGO_BIN_EXE_nexus-mcp");
        let mut command = match self.open_files {
            // The shell lowers its own limit and becomes the server.
            Some(limit) => {
                let mut c = tokio::process::Command::new("sh");
                c.arg("-c")
                    .arg(format!("ulimit -n {limit} && exec \"$0\" \"$@\""))
                    .arg(exe);
                c
            }
            None => tokio::process::Command::new(exe),
        };
        let mut child = command
            .args(["--transport", "http", "--bind", "127.0.0.1:0"])
            .args(&self.args)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("nexus-mcp starts");
        let mut lines = tokio::io::BufReader::new(child.stderr.take().expect("piped")).lines();
        let log = Arc::new(Mutex::new(Vec::new()));
        let addr = tokio::time::timeout(Duration::from_secs(20), async {
            while let Ok(Some(line)) = lines.next_line().await {
                let addr = line
                    .split("local_addr=")
                    .nth(1)
                    .and_then(|rest| rest.split_whitespace().next())
                    .map(str::to_owned);
                log.lock().unwrap().push(line);
                if addr.is_some() {
                    return addr;
                }
            }
            None
        })
        .await
        .expect("nexus-mcp serves within 20 s")
        .unwrap_or_else(|| panic!("nexus-mcp exited: {:?}", log.lock().unwrap()));
        let sink = Arc::clone(&log);
        // Keep draining the log so the process never blocks on a full pipe.
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let mut kept = sink.lock().unwrap();
                if kept.len() < KEPT_LOG_LINES {
                    kept.push(line);
                }
            }
        });
        McpProcess {
            child,
            base: format!("http://{addr}"),
            url: format!("http://{addr}/mcp"),
            log,
        }
    }
}

impl McpProcess {
    /// The log lines so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// How many file descriptors the process has open.
    pub fn open_descriptors(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .expect("the process's descriptors")
            .count()
    }

    /// The resident memory of the process, in bytes.
    pub fn resident(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("status");
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("VmRSS");
        kib * 1024
    }

    /// The value of `series` (its name with labels, as rendered) on the
    /// process's `/metrics`; 0 when absent.
    pub async fn metric(&self, series: &str) -> f64 {
        let text = reqwest::get(format!("{}/metrics", self.base))
            .await
            .expect("/metrics answers")
            .text()
            .await
            .expect("/metrics is read");
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    }
}
