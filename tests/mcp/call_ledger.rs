//! The call ledger: a call holds its slot until the upstream work it
//! started has ended, and a call whose caller is gone (hang-up, request
//! deadline) cancels its Nexus turn in every mode, sessions included; a
//! turn's start past the call deadline names its turn and cancels it (one
//! past twice the deadline is cancelled once Nexus answers it); a
//! session's end (its `DELETE`, its idle expiry) cancels the turns of the
//! calls running in it, which keep their slots until the cancels are
//! answered.

use std::time::Duration;

use crate::peer_support::{
    TurnsSeen, post, query_context, seen_within, signalled_turn_nexus, turn_nexus,
};
use crate::support::mcp::{
    HttpMcp, Served, call, caller_keys, connect, nexus_client, serve, tool_error,
};
use crate::support::wait::{PATIENCE, signalled, until};
use nexus_knowql::mcp::http::HttpOptions;
use nexus_knowql::mcp::{NexusMcp, NexusServer};
use serde_json::json;
use wiremock::MockServer;

const KEY: &str = "pcsk_call_ledger_key_0123456789abcdef";
const CANCEL: (&str, &str) = ("POST", "/queries/q_1/cancel");

async fn served(nexus: &MockServer, options: HttpOptions) -> Served {
    let server = NexusMcp::new().with_nexus(
        NexusServer::new(nexus_client(&nexus.uri())).with_key_policy(caller_keys(false)),
    );
    serve(server, options).await
}

/// A session of `KEY` on `served`, initialized.
async fn session(served: &Served) -> HttpMcp {
    let mut client = HttpMcp::new(served.url.clone()).header("x-pinecone-api-key", KEY);
    client.initialize().await;
    client
}

/// Posts `query_context` in `client`'s session on a connection of its own;
/// the status.
fn spawn_session_call(client: &HttpMcp) -> tokio::task::JoinHandle<u16> {
    let mut own = HttpMcp::new(client.url.clone())
        .header("x-pinecone-api-key", KEY)
        .joining(client);
    tokio::spawn(async move { own.post(&query_context(5)).await.status })
}

#[tokio::test]
async fn a_session_call_whose_client_hangs_up_cancels_its_turn() {
    let nexus = turn_nexus(Duration::from_millis(1500)).await;
    let served = served(&nexus, HttpOptions::default()).await;
    let client = session(&served).await;
    let call = spawn_session_call(&client);
    assert!(seen_within(&nexus, ("POST", "/query"), Duration::from_secs(10)).await);
    // The client gives up: its connection closes.
    call.abort();
    assert!(
        seen_within(&nexus, CANCEL, Duration::from_secs(5)).await,
        "the turn of a session call whose client hung up is cancelled"
    );
}

#[tokio::test]
async fn a_session_call_past_its_deadline_cancels_its_turn() {
    let nexus = turn_nexus(Duration::from_millis(2500)).await;
    let options = HttpOptions::default().request_timeout(Duration::from_secs(1));
    let served = served(&nexus, options).await;
    let client = session(&served).await;
    let status = spawn_session_call(&client).await.unwrap();
    assert!(status == 408 || status == 200, "{status}");
    assert!(
        seen_within(&nexus, CANCEL, Duration::from_secs(5)).await,
        "the turn of a session call past its deadline is cancelled"
    );
}

#[tokio::test]
async fn a_hung_up_call_holds_its_slot_until_its_turn_is_cancelled() {
    let nexus = turn_nexus(Duration::from_millis(1500)).await;
    let options = HttpOptions::default()
        .stateless(true)
        .max_requests_per_caller(1);
    let served = served(&nexus, options).await;
    let url = served.url.clone();
    let call = tokio::spawn(async move { post(&url, KEY, None, &query_context(8)).await });
    assert!(seen_within(&nexus, ("POST", "/query"), Duration::from_secs(10)).await);
    call.abort();
    // The turn's start is still in flight: the caller's one slot is held.
    let ping = json!({"jsonrpc": "2.0", "id": 9, "method": "ping"});
    let (status, body) = post(&served.url, KEY, None, &ping).await;
    assert_eq!(
        status, 429,
        "the slot is held while the turn may run: {body}"
    );
    assert!(seen_within(&nexus, CANCEL, Duration::from_secs(5)).await);
    // Once the cancel is answered the slot is free again (nothing signals
    // the answer's arrival at the server: its answers are looked at).
    until(
        PATIENCE,
        "the slot is freed once the turn's cancel is answered",
        async || post(&served.url, KEY, None, &ping).await.0 == 200,
    )
    .await;
}

#[tokio::test]
async fn a_turn_start_past_the_call_deadline_names_its_turn_and_cancels_it() {
    // Nexus answers the turn's start after the call deadline.
    let nexus = turn_nexus(Duration::from_millis(600)).await;
    let server = NexusMcp::new().with_nexus(
        NexusServer::new(nexus_client(&nexus.uri())).with_call_timeout(Duration::from_millis(400)),
    );
    let client = connect(server).await;
    let result = call(
        &client,
        "query_context",
        json!({"context": "docs", "question": "Why?"}),
    )
    .await;
    let error = tool_error(&result);
    assert_eq!(error["code"], "TIMEOUT", "{error}");
    assert_eq!(error["recoverable"], false, "{error}");
    let text = error.to_string();
    assert!(text.contains("q_1"), "the TIMEOUT names the turn: {error}");
    assert!(
        !text.contains("call the tool again"),
        "a TIMEOUT that may have started a turn never advises another: {error}"
    );
    assert!(
        seen_within(&nexus, CANCEL, Duration::from_secs(5)).await,
        "the late turn is cancelled"
    );
}

#[tokio::test]
async fn a_turn_start_past_twice_the_call_deadline_is_cancelled_once_it_answers() {
    // Nexus answers the turn's start long after twice the call deadline.
    let nexus = turn_nexus(Duration::from_secs(3)).await;
    let server = NexusMcp::new().with_nexus(
        NexusServer::new(nexus_client(&nexus.uri()))
            .with_key_policy(caller_keys(false))
            .with_call_timeout(Duration::from_millis(400)),
    );
    let options = HttpOptions::default()
        .stateless(true)
        .max_requests_per_caller(1);
    let served = serve(server, options).await;
    let (status, body) = post(&served.url, KEY, None, &query_context(3)).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("TIMEOUT"), "{body}");
    assert!(
        body.contains("cancelled as soon as Nexus names it"),
        "the TIMEOUT says what becomes of a late turn: {body}"
    );
    assert!(
        !body.contains("call the tool again"),
        "a TIMEOUT that may have started a turn never advises another: {body}"
    );
    // The start is still in flight: the caller's one slot stays held.
    let ping = json!({"jsonrpc": "2.0", "id": 9, "method": "ping"});
    let (status, body) = post(&served.url, KEY, None, &ping).await;
    assert_eq!(status, 429, "the slot is held while the start runs: {body}");
    assert!(
        seen_within(&nexus, CANCEL, Duration::from_secs(10)).await,
        "the turn that started after the TIMEOUT is cancelled"
    );
    until(
        PATIENCE,
        "the slot is freed once the late turn's cancel is answered",
        async || post(&served.url, KEY, None, &ping).await.0 == 200,
    )
    .await;
}

/// Ends `client`'s session with `DELETE`; the status.
async fn delete_session(client: &HttpMcp) -> u16 {
    let mut delete = client
        .http
        .delete(&client.url)
        .header("x-pinecone-api-key", KEY)
        .header("mcp-session-id", client.session.as_deref().unwrap());
    if let Some(protocol) = &client.protocol {
        delete = delete.header("mcp-protocol-version", protocol);
    }
    delete.send().await.unwrap().status().as_u16()
}

/// Waits for `seen` to hold in what the scripted Nexus signalled.
async fn nexus_saw(
    signal: &mut tokio::sync::watch::Receiver<TurnsSeen>,
    what: &str,
    seen: impl Fn(TurnsSeen) -> bool,
) {
    let watched = signal.clone();
    signalled(signal, what, || seen(*watched.borrow())).await;
}

#[tokio::test]
async fn a_deleted_session_cancels_the_turn_of_its_running_call() {
    let (nexus, mut seen) = signalled_turn_nexus(Duration::from_millis(1500)).await;
    // One slot, the call's: the `DELETE` that ends the session is served
    // all the same.
    let options = HttpOptions::default().max_requests_per_caller(1);
    let served = served(&nexus, options).await;
    let client = session(&served).await;
    let call = spawn_session_call(&client);
    nexus_saw(&mut seen, "the turn is started", |s| s.started == 1).await;
    assert_eq!(delete_session(&client).await, 204);
    // The turn's start is still in flight: the cancelled call holds its
    // slot until its turn's cancel is answered, so a new session's
    // `initialize` finds the caller's budget full.
    let mut again = HttpMcp::new(served.url.clone()).header("x-pinecone-api-key", KEY);
    let (_, refused) = again
        .request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "again", "version": "0"}}),
        )
        .await;
    assert_eq!(refused.status, 429, "the slot is held: {refused:?}");
    nexus_saw(&mut seen, "the deleted session's turn is cancelled", |s| {
        s.cancelled == 1
    })
    .await;
    let _ = call.await;
}

#[tokio::test]
async fn an_expired_session_cancels_the_turn_of_its_running_call() {
    // The turn's start takes longer than the session may stay idle.
    let (nexus, mut seen) = signalled_turn_nexus(Duration::from_secs(5)).await;
    let options = HttpOptions::default().session_idle_timeout(Duration::from_millis(1500));
    let served = served(&nexus, options).await;
    let client = session(&served).await;
    let _call = spawn_session_call(&client);
    nexus_saw(&mut seen, "the turn is started", |s| s.started == 1).await;
    nexus_saw(&mut seen, "the expired session's turn is cancelled", |s| {
        s.cancelled == 1
    })
    .await;
}
