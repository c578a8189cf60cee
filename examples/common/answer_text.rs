//! An answer's text as a terminal shows it. On a terminal, words wrap at
//! its width (a word is never broken, unless it is longer than a line) and
//! Markdown is rendered: headings and `**strong**` in bold, `*emphasis*` in
//! italics, `` `code` `` and fenced code blocks in cyan, `-` and `*` list
//! items as bullets with a hanging indent. Anywhere else (a pipe, a file,
//! `NO_COLOR`) the text passes through exactly as the server sent it.
//!
//! The text arrives in deltas that may split a word or a marker anywhere:
//! a word is written when the whitespace after it arrives, so what is
//! written never has to be taken back.

use std::io::{self, IsTerminal, Write};

const BOLD: &str = "\x1b[1m";
const ITALIC: &str = "\x1b[3m";
const CYAN: &str = "\x1b[36m";
const RESET: &str = "\x1b[0m";

/// How an answer is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Exactly the text, for pipes and files.
    Plain,
    /// Wrapped at `width` columns, Markdown rendered, with colour when
    /// `colour` (`NO_COLOR` unset).
    Terminal { width: usize, colour: bool },
}

impl Mode {
    /// The mode for stdout: a terminal's width when stdout is one.
    pub(crate) fn for_stdout() -> Mode {
        if !io::stdout().is_terminal() {
            return Mode::Plain;
        }
        let width = console::Term::stdout()
            .size_checked()
            .map(|(_, cols)| usize::from(cols))
            .filter(|cols| *cols > 0)
            .unwrap_or(80);
        let colour = std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
        Mode::Terminal {
            width: width.max(20),
            colour,
        }
    }
}

/// Writes an answer delta by delta (see the module docs).
#[derive(Debug)]
pub(crate) struct AnswerText<W: Write> {
    out: W,
    mode: Mode,
    /// The word being received (raw, markers included).
    word: String,
    /// The visible column of the cursor.
    column: usize,
    /// Where wrapped lines of the current line start (list items indent).
    indent: usize,
    /// No word written on this line yet.
    line_start: bool,
    /// A space is owed before the next word on this line.
    space: bool,
    strong: bool,
    emphasis: bool,
    code: bool,
    /// Inside a fenced code block: lines pass unwrapped.
    fenced: bool,
    /// A heading line: bold until its end.
    heading: bool,
    /// The last character written ended a line.
    at_line_end: bool,
}

impl<W: Write> AnswerText<W> {
    /// A writer in `mode`.
    pub(crate) fn new(out: W, mode: Mode) -> Self {
        AnswerText {
            out,
            mode,
            word: String::new(),
            column: 0,
            indent: 0,
            line_start: true,
            space: false,
            strong: false,
            emphasis: false,
            code: false,
            fenced: false,
            heading: false,
            at_line_end: true,
        }
    }

    /// Writes what `delta` completes and flushes.
    pub(crate) fn push(&mut self, delta: &str) -> io::Result<()> {
        let Mode::Terminal { .. } = self.mode else {
            if let Some(last) = delta.chars().last() {
                self.at_line_end = last == '\n';
            }
            self.out.write_all(delta.as_bytes())?;
            return self.out.flush();
        };
        for c in delta.chars() {
            match c {
                '\n' => {
                    self.end_word()?;
                    self.end_line()?;
                }
                c if c.is_whitespace() && !self.fenced => {
                    self.end_word()?;
                    if !self.line_start {
                        self.space = true;
                    }
                }
                c => self.word.push(c),
            }
        }
        self.out.flush()
    }

    /// Writes the last word and ends the line when the text did not.
    pub(crate) fn finish(&mut self) -> io::Result<()> {
        if let Mode::Terminal { .. } = self.mode {
            self.end_word()?;
            if !self.line_start || self.fenced {
                self.end_line()?;
            }
        } else if !self.at_line_end {
            self.out.write_all(b"\n")?;
        }
        self.out.flush()
    }

    fn width_and_colour(&self) -> (usize, bool) {
        match self.mode {
            Mode::Terminal { width, colour } => (width, colour),
            Mode::Plain => (usize::MAX, false),
        }
    }

    fn style(&mut self, code: &str) -> io::Result<()> {
        if self.width_and_colour().1 {
            self.out.write_all(code.as_bytes())?;
        }
        Ok(())
    }

    /// The styles in force, written again (after a reset).
    fn restyle(&mut self) -> io::Result<()> {
        self.style(RESET)?;
        if self.strong || self.heading {
            self.style(BOLD)?;
        }
        if self.emphasis {
            self.style(ITALIC)?;
        }
        if self.code || self.fenced {
            self.style(CYAN)?;
        }
        Ok(())
    }

    /// Ends the line: inline styles and headings end with it.
    fn end_line(&mut self) -> io::Result<()> {
        self.strong = false;
        self.emphasis = false;
        self.code = false;
        self.heading = false;
        self.style(RESET)?;
        self.out.write_all(b"\n")?;
        if self.fenced {
            self.restyle()?;
        }
        self.column = 0;
        self.indent = 0;
        self.line_start = true;
        self.space = false;
        Ok(())
    }

    /// Writes the word received so far, wrapping before it when it would
    /// pass the edge.
    fn end_word(&mut self) -> io::Result<()> {
        if self.word.is_empty() {
            return Ok(());
        }
        let word = std::mem::take(&mut self.word);
        if self.line_start && word.starts_with("```") {
            self.fenced = !self.fenced;
            self.line_start = false;
            return self.restyle();
        }
        if self.fenced {
            self.out.write_all(word.as_bytes())?;
            self.line_start = false;
            return Ok(());
        }
        if self.line_start {
            if word.chars().all(|c| c == '#') && word.len() <= 6 {
                self.heading = true;
                return self.restyle();
            }
            if word == "-" || word == "*" || word == "+" {
                // The space after the marker follows the bullet.
                self.out.write_all("•".as_bytes())?;
                self.column = 1;
                self.indent = 2;
                self.line_start = false;
                return Ok(());
            }
        }
        let visible = visible_width(&word, self.code);
        let (width, _) = self.width_and_colour();
        let space = usize::from(self.space);
        if !self.line_start && self.column + space + visible > width {
            self.style(RESET)?;
            self.out.write_all(b"\n")?;
            let indent = " ".repeat(self.indent);
            self.out.write_all(indent.as_bytes())?;
            self.column = self.indent;
            self.restyle()?;
        } else if self.space {
            self.out.write_all(b" ")?;
            self.column += 1;
        }
        self.space = false;
        self.line_start = false;
        self.write_marked(&word)?;
        self.column += visible;
        Ok(())
    }

    /// A word with its inline markers turned into styles.
    fn write_marked(&mut self, word: &str) -> io::Result<()> {
        let mut chars = word.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '`' => {
                    self.code = !self.code;
                    self.restyle()?;
                }
                '*' if !self.code && chars.peek() == Some(&'*') => {
                    chars.next();
                    self.strong = !self.strong;
                    self.restyle()?;
                }
                '*' if !self.code => {
                    self.emphasis = !self.emphasis;
                    self.restyle()?;
                }
                c => {
                    let mut buf = [0u8; 4];
                    self.out.write_all(c.encode_utf8(&mut buf).as_bytes())?;
                }
            }
        }
        Ok(())
    }
}

/// The columns a word takes once its markers are styles, given whether it
/// starts inside inline code.
fn visible_width(word: &str, mut code: bool) -> usize {
    let mut width = 0;
    for c in word.chars() {
        match c {
            '`' => code = !code,
            '*' if !code => {}
            c => width += console::measure_text_width(c.encode_utf8(&mut [0u8; 4])),
        }
    }
    width
}
