//! A differential check across modes: the same scripted scenarios run over
//! stdio, HTTP sessions and `--stateless`, and what Nexus saw (how many
//! turns started, how many were cancelled, and how soon) and what the
//! client got agree. The scenarios: a call cancelled by
//! `notifications/cancelled`, a call whose client hangs up (stdio: its
//! input ends; HTTP: its connection closes), a call past the tool's own
//! deadline (a `TIMEOUT` naming its turn), a call past the caller's budget,
//! and, for the two HTTP modes (stdio has no request deadline), a call past
//! its request deadline. The expectations are the script's: a turn started
//! once is cancelled once, within [`CANCEL_WITHIN`] of what ended the call,
//! and the client never gets a result for a call it gave up on.

use std::time::{Duration, Instant};

use crate::peer_support::{TurnsSeen, cancelled, query_context, signalled_turn_nexus};
use crate::support::mcp::{Served, caller_keys, nexus_client, serve};
use crate::support::wait::{PATIENCE, signalled, within};
use nexus_knowql::mcp::http::HttpOptions;
use nexus_knowql::mcp::stdio::{MAX_IN_FLIGHT, serve as serve_stdio};
use nexus_knowql::mcp::{NexusMcp, NexusServer};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines};
use tokio::sync::watch;
use wiremock::MockServer;

const KEY: &str = "pcsk_mode_differential_key_0123456789ab";
/// How long Nexus takes to start a turn (answer `POST /query`): the call
/// is ended while the start is in flight, so its cancel can be sent only
/// once the turn's id is known.
const TURN_START: Duration = Duration::from_millis(2000);
/// How soon after what ended a call Nexus sees its turn cancelled.
const CANCEL_WITHIN: Duration = Duration::from_millis(5000);
/// The tool's own deadline in the deadline scenario: shorter than
/// [`TURN_START`], and more than half of it (a late start is awaited once
/// more for the turn's id, up to the deadline again).
const TOOL_DEADLINE: Duration = Duration::from_millis(1200);
/// The request deadline of the HTTP request-deadline scenario.
const REQUEST_DEADLINE: Duration = Duration::from_millis(500);
/// How long Nexus takes to start a turn in the budget scenario: the
/// budget's calls hold their slots past the last one's arrival however
/// slowly the test runs.
const HELD_TURN_START: Duration = Duration::from_secs(20);
/// The caller's budget over HTTP (stdio's is [`MAX_IN_FLIGHT`]).
const HTTP_BUDGET: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Stdio,
    Sessions,
    Stateless,
}

const MODES: [Mode; 3] = [Mode::Stdio, Mode::Sessions, Mode::Stateless];

impl Mode {
    fn budget(self) -> usize {
        match self {
            Mode::Stdio => MAX_IN_FLIGHT,
            Mode::Sessions | Mode::Stateless => HTTP_BUDGET,
        }
    }
}

/// What the client got for the scenario's call.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Got {
    /// No result: no answer at all, the protocol's "cancelled" (-32800),
    /// or an answer cut before its message.
    NoResult,
    /// Refused at once for the caller's budget (HTTP 429, stdio's busy
    /// error).
    Refused,
    /// A tool error with this code; whether it names the turn (`q_1`) and
    /// whether it advises calling again.
    ToolError {
        code: String,
        names_turn: bool,
        advises_again: bool,
    },
    /// Anything else, kept whole for the failure message.
    Other(String),
}

/// What one scenario came to in one mode.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    got: Got,
    /// The turns Nexus saw started and cancelled.
    seen: TurnsSeen,
    /// Whether the cancel (if any) came within [`CANCEL_WITHIN`] of what
    /// ended the call.
    cancel_in_time: bool,
}

/// The client's view of one JSON-RPC answer to request `id`.
fn got_of(message: &Value) -> Got {
    if let Some(code) = message["error"]["code"].as_i64() {
        return match code {
            -32800 => Got::NoResult,
            -32000 if message["error"]["message"].to_string().contains("flight") => Got::Refused,
            _ => Got::Other(message.to_string()),
        };
    }
    let result = &message["result"];
    if result["isError"] == true {
        let text = result["content"][0]["text"].as_str().unwrap_or_default();
        let error: Value = serde_json::from_str(text).unwrap_or(Value::Null);
        return Got::ToolError {
            code: error["code"].as_str().unwrap_or_default().to_owned(),
            names_turn: text.contains("q_1"),
            advises_again: text.contains("call the tool again"),
        };
    }
    Got::Other(message.to_string())
}

/// The client's view of an HTTP answer (status and body) to request `id`.
fn got_of_http(status: u16, body: &str, id: u64) -> Got {
    if status == 429 {
        return Got::Refused;
    }
    if status == 408 {
        return Got::NoResult;
    }
    let message = body
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .chain(std::iter::once(body))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|m| m["id"] == json!(id));
    match message {
        Some(message) => got_of(&message),
        None if status == 200 => Got::NoResult,
        None => Got::Other(format!("{status}: {body}")),
    }
}

/// A scripted Nexus and what it signals.
struct Nexus {
    server: MockServer,
    seen: watch::Receiver<TurnsSeen>,
}

impl Nexus {
    async fn start() -> Self {
        Self::starting_turns_after(TURN_START).await
    }

    async fn starting_turns_after(delay: Duration) -> Self {
        let (server, seen) = signalled_turn_nexus(delay).await;
        Nexus { server, seen }
    }

    fn now(&self) -> TurnsSeen {
        *self.seen.borrow()
    }

    async fn saw(&mut self, what: &str, check: impl Fn(TurnsSeen) -> bool) {
        let watched = self.seen.clone();
        signalled(&mut self.seen, what, || check(*watched.borrow())).await;
    }

    /// Waits for the turn's cancel; whether it came within
    /// [`CANCEL_WITHIN`] of `since`.
    async fn cancelled_since(&mut self, since: Instant) -> bool {
        self.saw("the turn is cancelled", |s| s.cancelled >= 1)
            .await;
        since.elapsed() <= CANCEL_WITHIN
    }

    /// The tools for `mode`: over HTTP, each call with its caller's key.
    fn tools(&self, mode: Mode, tool_deadline: bool) -> NexusMcp {
        let mut nexus = NexusServer::new(nexus_client(&self.server.uri()));
        if mode != Mode::Stdio {
            nexus = nexus.with_key_policy(caller_keys(false));
        }
        if tool_deadline {
            nexus = nexus.with_call_timeout(TOOL_DEADLINE);
        }
        NexusMcp::new().with_nexus(nexus)
    }
}

/// A stdio client: the server's input, its output's lines, its run.
struct Stdio {
    input: DuplexStream,
    output: Lines<BufReader<DuplexStream>>,
    served: tokio::task::JoinHandle<()>,
}

impl Stdio {
    async fn start(server: NexusMcp) -> Self {
        let (input, server_input) = tokio::io::duplex(1 << 20);
        let (server_output, output) = tokio::io::duplex(1 << 20);
        let served = tokio::spawn(async move {
            let _ = serve_stdio(server, server_input, server_output).await;
        });
        let mut stdio = Stdio {
            input,
            output: BufReader::new(output).lines(),
            served,
        };
        stdio
            .send(
                &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "mode-differential", "version": "0"}}}),
            )
            .await;
        assert_eq!(stdio.next().await["id"], 0);
        stdio
            .send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        stdio
    }

    async fn send(&mut self, message: &Value) {
        let line = format!("{message}\n");
        self.input.write_all(line.as_bytes()).await.unwrap();
    }

    async fn next(&mut self) -> Value {
        let line = within(PATIENCE, "an answer over stdio", self.output.next_line())
            .await
            .unwrap()
            .expect("the output is open");
        serde_json::from_str(&line).unwrap()
    }

    /// The next answer to request `id` (notifications skipped).
    async fn answer_to(&mut self, id: u64) -> Value {
        loop {
            let message = self.next().await;
            if message["id"] == id {
                return message;
            }
        }
    }

    /// The answer to `id`, if one came before the answer to a ping sent
    /// now (the server answers in the order it finishes: a call that was
    /// given up on and answered anyway has been answered by then).
    async fn answer_before_a_ping(&mut self, id: u64) -> Option<Value> {
        self.send(&json!({"jsonrpc": "2.0", "id": 999, "method": "ping"}))
            .await;
        let mut found = None;
        loop {
            let message = self.next().await;
            if message["id"] == 999 {
                return found;
            }
            if message["id"] == id {
                found = Some(message);
            }
        }
    }
}

/// An HTTP client of one mode: the served endpoint and, with sessions,
/// the session's id and protocol version.
struct Http {
    served: Served,
    session: Option<(String, String)>,
}

impl Http {
    async fn start(server: NexusMcp, mode: Mode, options: HttpOptions) -> Self {
        let options = options
            .stateless(mode == Mode::Stateless)
            .max_requests_per_caller(HTTP_BUDGET);
        let served = serve(server, options).await;
        let mut http = Http {
            served,
            session: None,
        };
        if mode == Mode::Sessions {
            let mut client = crate::support::mcp::HttpMcp::new(http.served.url.clone())
                .header("x-pinecone-api-key", KEY);
            let result = client.initialize().await;
            let protocol = result["protocolVersion"].as_str().unwrap().to_owned();
            http.session = Some((client.session.unwrap(), protocol));
        }
        http
    }

    /// Posts `message` on a connection of its own; the status and body
    /// (a body cut short counts as what arrived of it).
    fn post(&self, message: &Value) -> tokio::task::JoinHandle<(u16, String)> {
        let mut request = reqwest::Client::new()
            .post(&self.served.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("x-pinecone-api-key", KEY)
            .body(message.to_string());
        match &self.session {
            Some((id, protocol)) => {
                request = request
                    .header("mcp-session-id", id)
                    .header("mcp-protocol-version", protocol);
            }
            None => request = request.header("mcp-protocol-version", "2025-06-18"),
        }
        tokio::spawn(async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.text().await.unwrap_or_default())
        })
    }

    async fn got(&self, id: u64, call: tokio::task::JoinHandle<(u16, String)>) -> Got {
        let (status, body) = within(PATIENCE, "the HTTP answer", call).await.unwrap();
        got_of_http(status, &body, id)
    }
}

/// A call cancelled by `notifications/cancelled` once its turn's start is
/// in flight.
async fn cancel(mode: Mode) -> Outcome {
    let mut nexus = Nexus::start().await;
    let server = nexus.tools(mode, false);
    let (got, since) = if mode == Mode::Stdio {
        let mut stdio = Stdio::start(server).await;
        stdio.send(&query_context(1)).await;
        nexus.saw("the turn is started", |s| s.started == 1).await;
        let since = Instant::now();
        stdio.send(&cancelled(1)).await;
        nexus
            .saw("the turn is cancelled", |s| s.cancelled >= 1)
            .await;
        let got = stdio
            .answer_before_a_ping(1)
            .await
            .map_or(Got::NoResult, |m| got_of(&m));
        (got, since)
    } else {
        let http = Http::start(server, mode, HttpOptions::default()).await;
        let call = http.post(&query_context(1));
        nexus.saw("the turn is started", |s| s.started == 1).await;
        let since = Instant::now();
        let (sent, _) = http.post(&cancelled(1)).await.unwrap();
        assert!(sent < 300, "{mode:?}: the cancel is accepted: {sent}");
        (http.got(1, call).await, since)
    };
    Outcome {
        got,
        cancel_in_time: nexus.cancelled_since(since).await,
        seen: nexus.now(),
    }
}

/// A call whose client hangs up once its turn's start is in flight.
async fn hang_up(mode: Mode) -> Outcome {
    let mut nexus = Nexus::start().await;
    let server = nexus.tools(mode, false);
    let since = if mode == Mode::Stdio {
        let mut stdio = Stdio::start(server).await;
        stdio.send(&query_context(1)).await;
        nexus.saw("the turn is started", |s| s.started == 1).await;
        let since = Instant::now();
        let Stdio { input, served, .. } = stdio;
        drop(input);
        within(PATIENCE, "the stdio server ends", served)
            .await
            .unwrap();
        since
    } else {
        let http = Http::start(server, mode, HttpOptions::default()).await;
        let call = http.post(&query_context(1));
        nexus.saw("the turn is started", |s| s.started == 1).await;
        let since = Instant::now();
        call.abort();
        since
    };
    Outcome {
        // The client is gone: it gets nothing.
        got: Got::NoResult,
        cancel_in_time: nexus.cancelled_since(since).await,
        seen: nexus.now(),
    }
}

/// A call past the tool's own deadline, while its turn's start is in
/// flight: a `TIMEOUT` that names the turn, and the turn cancelled.
async fn tool_deadline(mode: Mode) -> Outcome {
    let mut nexus = Nexus::start().await;
    let server = nexus.tools(mode, true);
    let since = Instant::now();
    let got = if mode == Mode::Stdio {
        let mut stdio = Stdio::start(server).await;
        stdio.send(&query_context(1)).await;
        got_of(&stdio.answer_to(1).await)
    } else {
        let http = Http::start(server, mode, HttpOptions::default()).await;
        let call = http.post(&query_context(1));
        http.got(1, call).await
    };
    Outcome {
        got,
        cancel_in_time: nexus.cancelled_since(since).await,
        seen: nexus.now(),
    }
}

/// One call past the caller's budget while the budget's calls hold their
/// turns' starts in flight: refused at once, and no turn of its own.
async fn budget(mode: Mode) -> Outcome {
    let mut nexus = Nexus::starting_turns_after(HELD_TURN_START).await;
    let server = nexus.tools(mode, false);
    let limit = mode.budget();
    let over = u64::try_from(limit).unwrap() + 1;
    let got = if mode == Mode::Stdio {
        let mut stdio = Stdio::start(server).await;
        for id in 1..over {
            stdio.send(&query_context(id)).await;
        }
        nexus
            .saw("the budget's turns are started", |s| s.started == limit)
            .await;
        stdio.send(&query_context(over)).await;
        got_of(&stdio.answer_to(over).await)
    } else {
        let http = Http::start(server, mode, HttpOptions::default()).await;
        let held: Vec<_> = (1..over).map(|id| http.post(&query_context(id))).collect();
        nexus
            .saw("the budget's turns are started", |s| s.started == limit)
            .await;
        let got = http.got(over, http.post(&query_context(over))).await;
        for call in held {
            call.abort();
        }
        got
    };
    let seen = nexus.now();
    Outcome {
        got,
        cancel_in_time: true,
        seen: TurnsSeen {
            started: seen.started,
            cancelled: 0,
        },
    }
}

/// A call past its HTTP request deadline while its turn's start is in
/// flight.
async fn request_deadline(mode: Mode) -> Outcome {
    let mut nexus = Nexus::start().await;
    let server = nexus.tools(mode, false);
    let options = HttpOptions::default().request_timeout(REQUEST_DEADLINE);
    let http = Http::start(server, mode, options).await;
    let since = Instant::now();
    let call = http.post(&query_context(1));
    let got = http.got(1, call).await;
    Outcome {
        got,
        cancel_in_time: nexus.cancelled_since(since).await,
        seen: nexus.now(),
    }
}

/// Runs `scenario` in each of `modes`: every outcome is `expected(mode)`.
async fn across<F, Fut>(name: &str, modes: &[Mode], scenario: F, expected: impl Fn(Mode) -> Outcome)
where
    F: Fn(Mode) -> Fut,
    Fut: std::future::Future<Output = Outcome>,
{
    let mut outcomes = Vec::new();
    for &mode in modes {
        outcomes.push((mode, scenario(mode).await));
    }
    for (mode, outcome) in &outcomes {
        assert_eq!(
            *outcome,
            expected(*mode),
            "{name}, {mode:?} (all: {outcomes:?})"
        );
    }
}

fn one_turn_cancelled(got: Got) -> impl Fn(Mode) -> Outcome {
    move |_| Outcome {
        got: got.clone(),
        seen: TurnsSeen {
            started: 1,
            cancelled: 1,
        },
        cancel_in_time: true,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_cancels_its_turn_alike_in_every_mode() {
    across("cancel", &MODES, cancel, one_turn_cancelled(Got::NoResult)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hang_up_cancels_the_turn_alike_in_every_mode() {
    across(
        "hang-up",
        &MODES,
        hang_up,
        one_turn_cancelled(Got::NoResult),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_timeout_names_its_turn_and_cancels_it_alike_in_every_mode() {
    let timeout = Got::ToolError {
        code: "TIMEOUT".to_owned(),
        names_turn: true,
        advises_again: false,
    };
    across(
        "tool deadline",
        &MODES,
        tool_deadline,
        one_turn_cancelled(timeout),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_over_the_budget_is_refused_alike_in_every_mode() {
    across("budget", &MODES, budget, |mode| Outcome {
        got: Got::Refused,
        seen: TurnsSeen {
            started: mode.budget(),
            cancelled: 0,
        },
        cancel_in_time: true,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_its_request_deadline_cancels_its_turn_alike_over_http() {
    across(
        "request deadline",
        &[Mode::Sessions, Mode::Stateless],
        request_deadline,
        one_turn_cancelled(Got::NoResult),
    )
    .await;
}
