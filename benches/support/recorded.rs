//! The recorded stream shared by the benchmarks.
#![allow(dead_code, unreachable_pub)]

/// How many `response.output_text.delta` frames the recorded stream has.
pub const DELTAS: usize = 10_000;

/// A delta text of varied length, with some non-ASCII and escaped text.
fn delta(i: usize) -> String {
    match i % 7 {
        0 => format!("token{i} "),
        1 => "the ".to_owned(),
        2 => "approval ".to_owned(),
        3 => "für ".to_owned(),
        4 => "manager\\n".to_owned(),
        5 => "\\\"policy\\\" ".to_owned(),
        _ => format!("section {}.{} ", i % 13, i % 5),
    }
}

/// One delta frame as the API sends it.
pub fn delta_frame(seq: usize, text: &str) -> String {
    format!(
        "id: {seq}\nevent: response.output_text.delta\ndata: {{\"type\":\"response.output_text.delta\",\"query_id\":\"q_0123456789abcdef\",\"delta\":\"{text}\"}}\n\n"
    )
}

/// Just the 10,000 delta frames (for the decode benchmark).
pub fn deltas_only() -> Vec<u8> {
    (1..=DELTAS)
        .map(|i| delta_frame(i, &delta(i)))
        .collect::<String>()
        .into_bytes()
}

/// A whole turn: created, 10,000 deltas, completed, the `query` frame.
pub fn whole_turn() -> Vec<u8> {
    let mut s = String::from(
        "id: 0\nevent: response.created\ndata: {\"type\":\"response.created\",\"query_id\":\"q_0123456789abcdef\",\"session_id\":\"sess_1\"}\n\n",
    );
    // The deltas are JSON string fragments, each escape whole, so joined
    // they are the final answer's JSON text (the SDK checks the streamed
    // text against it).
    let mut answer = String::new();
    for i in 1..=DELTAS {
        let d = delta(i);
        s.push_str(&delta_frame(i, &d));
        answer.push_str(&d);
    }
    s.push_str(&format!(
        "id: {}\nevent: response.completed\ndata: {{\"type\":\"response.completed\",\"query_id\":\"q_0123456789abcdef\"}}\n\n",
        DELTAS + 1
    ));
    s.push_str(&format!("event: query\ndata: {{\"id\":\"q_0123456789abcdef\",\"object\":\"query\",\"session_id\":\"sess_1\",\"created\":1,\"status\":\"completed\",\"input\":[],\"output\":[{{\"role\":\"assistant\",\"content\":[{{\"type\":\"output_text\",\"text\":\"{answer}\"}}]}}],\"citations\":[],\"steps\":[],\"runtime_ms\":1,\"usage\":{{\"input_tokens\":1,\"output_tokens\":1,\"total_tokens\":2}}}}\n\n"));
    s.into_bytes()
}

/// The HTTP/1.1 head of an event-stream answer (close-delimited body).
pub const SSE_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
