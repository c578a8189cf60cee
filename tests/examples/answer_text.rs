//! How the examples write an answer (`examples/common/answer_text.rs`): on
//! a terminal wrapped at its width without breaking a word, Markdown shown
//! as styles; anywhere else exactly the text. The expectations come from
//! the input text, never from the writer.

#[path = "../../examples/common/answer_text.rs"]
#[allow(dead_code)]
mod writer;

use proptest::prelude::*;
use writer::{AnswerText, Mode};

/// What the writer makes of `deltas`.
fn written(mode: Mode, deltas: &[&str]) -> String {
    let mut out = Vec::new();
    let mut text = AnswerText::new(&mut out, mode);
    for d in deltas {
        text.push(d).expect("a Vec takes every write");
    }
    text.finish().expect("a Vec takes every write");
    drop(text);
    String::from_utf8(out).expect("the writer writes UTF-8")
}

fn terminal(width: usize) -> Mode {
    Mode::Terminal {
        width,
        colour: false,
    }
}

const ANSWER: &str = "Streams can drop when a connection breaks. To resume a stream, \
reconnect to `GET /queries/{id}/events` and send the `Last-Event-ID` header with the last \
sequence number you received. Never send the **POST /query** again to resume: that would \
start a *second* turn. [1]";

/// The words of a text with its Markdown markers removed.
fn words(text: &str) -> Vec<String> {
    text.replace(['`', '*'], "")
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

#[test]
fn plain_output_is_exactly_the_text() {
    assert_eq!(written(Mode::Plain, &[ANSWER]), format!("{ANSWER}\n"));
    assert_eq!(written(Mode::Plain, &["a\n"]), "a\n");
    let mid_word: Vec<&str> = vec![&ANSWER[..17], &ANSWER[17..90], &ANSWER[90..]];
    assert_eq!(written(Mode::Plain, &mid_word), format!("{ANSWER}\n"));
}

#[test]
fn a_terminal_gets_whole_words_within_its_width() {
    for width in [20, 40, 80, 120] {
        let out = written(terminal(width), &[ANSWER]);
        for line in out.lines() {
            assert!(
                line.chars().count() <= width,
                "{width} columns: {line:?} is longer"
            );
        }
        // Every word arrives whole and in order: a word cut at the edge
        // would be two words here.
        assert_eq!(words(&out), words(ANSWER), "{width} columns: {out}");
        assert!(!out.contains('`') && !out.contains('*'), "{out}");
    }
}

#[test]
fn markdown_becomes_styles_on_a_coloured_terminal() {
    let text = "# Resume\nUse **`Last-Event-ID`** and *never* POST again.\n- one item\n- \
                another item that runs long enough to wrap\n```\nlet  x = 1;\n```\nDone.";
    let out = written(
        Mode::Terminal {
            width: 30,
            colour: true,
        },
        &[text],
    );
    assert!(out.starts_with("\x1b[0m\x1b[1mResume"), "{out:?}");
    assert!(out.contains("\x1b[1m\x1b[36mLast-Event-ID"), "{out:?}");
    assert!(out.contains("\x1b[3mnever"), "{out:?}");
    assert!(out.contains("• one item"), "{out:?}");
    // A wrapped list item goes on under its text, not under the bullet.
    assert!(out.contains("\n  "), "{out:?}");
    // Code keeps its spacing and is not wrapped.
    assert!(out.contains("let  x = 1;"), "{out:?}");
    let plain = written(terminal(30), &[text]);
    assert!(
        !plain.contains('\x1b'),
        "NO_COLOR: no escape codes: {plain:?}"
    );
}

proptest! {
    /// Deltas split anywhere (inside words, markers and characters' runs)
    /// write what the whole text writes.
    #[test]
    fn the_split_of_the_deltas_changes_nothing(
        cuts in proptest::collection::btree_set(0..ANSWER.len(), 0..12),
        width in 20usize..130,
    ) {
        let mut deltas = Vec::new();
        let mut from = 0;
        for cut in cuts.into_iter().filter(|c| ANSWER.is_char_boundary(*c)) {
            deltas.push(&ANSWER[from..cut]);
            from = cut;
        }
        deltas.push(&ANSWER[from..]);
        prop_assert_eq!(written(terminal(width), &deltas), written(terminal(width), &[ANSWER]));
        prop_assert_eq!(written(Mode::Plain, &deltas), format!("{ANSWER}\n"));
    }
}

/// `ask` in a terminal of 80 and of 120 columns: no answer line passes the
/// edge and the answer's words arrive whole and in order (the reference is
/// the same answer written to a pipe, where the text passes unchanged).
#[cfg(unix)]
#[test]
fn ask_wraps_whole_words_at_the_terminal_width() {
    use crate::support::examples::{Pty, example, run};

    const QUESTION: &str = "How do I resume a stream after the connection drops?";
    let piped = run(example("ask", &["--no-stream", QUESTION]));
    assert!(piped.status.success(), "{piped:?}");
    let reference = String::from_utf8_lossy(&piped.stdout).into_owned();
    assert!(reference.len() > 100, "a long enough answer: {reference:?}");

    for width in [80, 120] {
        // The example's own command and environment, run by a shell that
        // first sets the terminal's width.
        let cmd = example("ask", &[]);
        let program = cmd.get_program().to_owned();
        let mut shell = std::process::Command::new("sh");
        shell
            .arg("-c")
            .arg(format!("stty cols {width} rows 50; exec \"$0\" \"$1\""))
            .arg(program)
            .arg(QUESTION);
        for (key, value) in cmd.get_envs() {
            match value {
                Some(v) => shell.env(key, v),
                None => shell.env_remove(key),
            };
        }
        let mut ask = Pty::spawn(shell);
        let shown = ask.expect("\n[1] ");
        let answer: Vec<&str> = shown
            .lines()
            .map(|l| l.trim_end_matches('\r'))
            // Steps (`·`) and diagnostics (`ask:`) are stderr's, not the answer.
            .filter(|l| !l.starts_with('·') && !l.starts_with("ask:") && !l.trim().is_empty())
            .collect();
        for line in &answer {
            assert!(
                line.chars().count() <= width,
                "{width} columns: {line:?} passes the edge"
            );
        }
        let shown_words = words(&answer.join("\n"));
        let expected = words(&reference);
        assert!(
            shown_words
                .windows(expected.len())
                .any(|w| w == expected.as_slice()),
            "{width} columns: the answer's words, whole and in order\n{shown_words:?}\n{expected:?}"
        );
        assert_eq!(ask.exit_code(), Some(0));
    }
}
