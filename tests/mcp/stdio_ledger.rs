//! stdio through the call ledger: every request takes a ticket (the
//! process is the one caller, with at most `MAX_IN_FLIGHT` requests in
//! flight), `notifications/cancelled` cancels a call's Nexus turn, and the
//! input's end cancels the turns still running and ends the server once
//! their cancels are answered.

use std::time::Duration;

use crate::peer_support::{TurnsSeen, signalled_turn_nexus};
use crate::support::mcp::nexus_client;
use crate::support::wait::{PATIENCE, signalled, within};
use nexus_knowql::mcp::stdio::{MAX_IN_FLIGHT, serve};
use nexus_knowql::mcp::{NexusMcp, NexusServer};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines};
use tokio::sync::watch;

/// A stdio server of a Nexus whose turns start after `delay`: its input,
/// its output's lines, what the Nexus saw, and the server's run.
struct Stdio {
    input: DuplexStream,
    output: Lines<BufReader<DuplexStream>>,
    seen: watch::Receiver<TurnsSeen>,
    served: tokio::task::JoinHandle<()>,
    _nexus: wiremock::MockServer,
}

impl Stdio {
    async fn start(delay: Duration) -> Self {
        let (nexus, seen) = signalled_turn_nexus(delay).await;
        let server = NexusMcp::new().with_nexus(NexusServer::new(nexus_client(&nexus.uri())));
        let (input, server_input) = tokio::io::duplex(1 << 20);
        let (server_output, output) = tokio::io::duplex(1 << 20);
        let served = tokio::spawn(async move {
            serve(server, server_input, server_output)
                .await
                .expect("served to the end of the input");
        });
        let mut stdio = Stdio {
            input,
            output: BufReader::new(output).lines(),
            seen,
            served,
            _nexus: nexus,
        };
        stdio
            .send(
                &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "stdio-ledger", "version": "0"}}}),
            )
            .await;
        assert_eq!(stdio.answer().await["id"], 0);
        stdio
            .send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        stdio
    }

    async fn send(&mut self, message: &Value) {
        let line = format!("{message}\n");
        self.input.write_all(line.as_bytes()).await.unwrap();
    }

    /// Starts `query_context` as request `id`.
    async fn query_context(&mut self, id: u64) {
        self.send(
            &json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "query_context",
            "arguments": {"context": "docs", "question": "Why?"}}}),
        )
        .await;
    }

    /// The next line of the output, parsed.
    async fn answer(&mut self) -> Value {
        let line = within(PATIENCE, "an answer", self.output.next_line())
            .await
            .unwrap()
            .expect("the output is open");
        serde_json::from_str(&line).unwrap()
    }

    /// Waits until what the Nexus saw satisfies `check`.
    async fn nexus_saw(&mut self, what: &str, check: impl Fn(TurnsSeen) -> bool) {
        let watched = self.seen.clone();
        signalled(&mut self.seen, what, || check(*watched.borrow())).await;
    }
}

#[tokio::test]
async fn the_end_of_the_input_cancels_running_turns_before_the_server_ends() {
    let mut stdio = Stdio::start(Duration::from_millis(1500)).await;
    stdio.query_context(1).await;
    stdio
        .nexus_saw("the turn is started", |s| s.started == 1)
        .await;
    let Stdio {
        input,
        served,
        seen,
        ..
    } = stdio;
    // The client quits: the server's input ends.
    drop(input);
    // Sooner than rmcp's own end of a closed service (5 s): the call is
    // cancelled at once, and the server ends once its turn's cancel is
    // answered.
    within(
        Duration::from_secs(4),
        "the server ends after the input",
        served,
    )
    .await
    .unwrap();
    assert_eq!(
        seen.borrow().cancelled,
        1,
        "the running turn is cancelled before the server ends"
    );
}

#[tokio::test]
async fn a_stdio_call_past_the_ledger_is_refused_and_a_cancelled_call_cancels_its_turn() {
    let mut stdio = Stdio::start(Duration::from_millis(1500)).await;
    let limit = u64::try_from(MAX_IN_FLIGHT).unwrap();
    for id in 1..=limit + 1 {
        stdio.query_context(id).await;
    }
    // Every ticket is taken: the last call is refused at once.
    let refused = stdio.answer().await;
    assert_eq!(refused["id"], limit + 1, "{refused}");
    assert_eq!(refused["error"]["code"], -32000, "{refused}");
    stdio
        .nexus_saw("the admitted turns are started", |s| {
            s.started == MAX_IN_FLIGHT
        })
        .await;
    stdio
        .send(
            &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": 1, "reason": "changed my mind"}}),
        )
        .await;
    stdio
        .nexus_saw("the cancelled call's turn is cancelled", |s| {
            s.cancelled >= 1
        })
        .await;
}
