//! Follow-up questions in a session over the shipped corpus
//! (`examples/corpus`): the answer to the second question is about the
//! second question. The rule (`ContextIndex::search`): when a question has
//! terms of its own, a passage must match one of them, and the earlier
//! turns' terms only rank the passages that do; a follow-up without terms
//! of its own is answered from the earlier turns' terms.

use nexus_knowql::local::LocalNexus;

/// A two-turn conversation and a word the second answer's first sentence
/// must hold (the expectation comes from the corpus, read by hand).
struct Conversation {
    first: &'static str,
    second: &'static str,
    opens_with: &'static str,
}

const CONVERSATIONS: &[Conversation] = &[
    Conversation {
        first: "How do I resume a stream after the connection drops?",
        second: "What is a context?",
        opens_with: "context",
    },
    Conversation {
        first: "What is a context?",
        second: "How do I cancel a turn?",
        opens_with: "cancel",
    },
    Conversation {
        first: "How do I start a session?",
        second: "How do I inspect them?",
        opens_with: "/sessions",
    },
    Conversation {
        first: "How do I upload sources?",
        second: "How do I curate them?",
        opens_with: "curat",
    },
    // No term of its own: the earlier turn carries the search.
    Conversation {
        first: "How do I resume a stream?",
        second: "Why?",
        opens_with: "stream",
    },
];

/// The first sentence of an answer, lower case.
fn first_sentence(text: &str) -> String {
    let end = text.find(". ").map_or(text.len(), |at| at + 1);
    text[..end].to_lowercase()
}

#[tokio::test]
async fn a_follow_up_is_answered_about_itself() {
    let corpus = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/corpus");
    let server = LocalNexus::builder()
        .context("docs", corpus)
        .start()
        .await
        .expect("local Nexus");
    let client = server.client().expect("client");
    let mut wrong = Vec::new();
    for c in CONVERSATIONS {
        let session = client.session(["docs"]).build().expect("session");
        session.ask(c.first).send().await.expect("first turn");
        let second = session.ask(c.second).send().await.expect("second turn");
        let opening = first_sentence(&second.answer_text());
        if !opening.contains(c.opens_with) {
            wrong.push(format!(
                "{:?} then {:?}: opens with {opening:?}",
                c.first, c.second
            ));
        }
    }
    server.shutdown().await;
    assert!(
        wrong.is_empty(),
        "follow-ups answered off topic: {wrong:#?}"
    );
}
