//! JSON Lines as the trace and job files are written: one value per line, blank lines skipped,
//! and every error naming the file and the line.
//!
//! Not validation: each file's reader checks its own values.

use std::io::{BufRead, Write};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A file that cannot be read, or a line of it that is not valid.
#[derive(Debug, thiserror::Error)]
pub enum LinesError {
    /// Reading failed.
    #[error("reading the {what}: {source}")]
    Io {
        /// Which file ("trace", "jobs").
        what: &'static str,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A line is not a value of the file's kind, or not a valid one.
    #[error("{what} line {line}: {message}")]
    Invalid {
        /// Which file ("trace", "jobs").
        what: &'static str,
        /// 1-based line number.
        line: usize,
        /// What is wrong, naming the field and the value.
        message: String,
    },
}

impl LinesError {
    /// Line `line` of the `what` file is not valid.
    pub fn invalid(what: &'static str, line: usize, message: impl Into<String>) -> LinesError {
        LinesError::Invalid {
            what,
            line,
            message: message.into(),
        }
    }
}

/// The values of `input`, one per non-blank line, with their 1-based line numbers, in order;
/// a line that does not parse is an error naming it.
pub fn read<T: DeserializeOwned>(
    input: impl BufRead,
    what: &'static str,
) -> impl Iterator<Item = Result<(usize, T), LinesError>> {
    input.lines().enumerate().filter_map(move |(index, text)| {
        let line = index + 1;
        let text = match text {
            Ok(text) if text.trim().is_empty() => return None,
            Ok(text) => text,
            Err(source) => return Some(Err(LinesError::Io { what, source })),
        };
        Some(
            serde_json::from_str(&text)
                .map(|value| (line, value))
                .map_err(|e| LinesError::invalid(what, line, e.to_string())),
        )
    })
}

/// Writes `value` as one line.
pub fn write<T: Serialize>(out: &mut impl Write, value: &T) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, value)?;
    out.write_all(b"\n")
}
