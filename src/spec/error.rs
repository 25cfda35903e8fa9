use std::fmt;

use super::locate::Pos;

/// Where a spec error was found: a file (with line and column when known), or a
/// command-line override.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub source: String,
    pub pos: Option<Pos>,
}

impl Location {
    pub fn file(source: impl Into<String>, pos: Option<Pos>) -> Self {
        Location { source: source.into(), pos }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.pos {
            Some(p) => write!(f, "{}:{}:{}", self.source, p.line, p.col),
            None => write!(f, "{}", self.source),
        }
    }
}

/// What kind of mistake a spec error reports; tests and tools match on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecErrorKind {
    Io,
    Syntax,
    UnknownKey,
    WrongType,
    MissingField,
    Constraint,
    UnknownOp,
    MissingReference,
    Cycle,
    DuplicateId,
    Profile,
    Override,
    Extends,
    DataIsolation,
}

/// One clear error about a spec: where, and what was expected.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{at}: {message}")]
pub struct SpecError {
    pub kind: SpecErrorKind,
    pub at: Location,
    pub message: String,
}

impl SpecError {
    pub fn new(kind: SpecErrorKind, at: Location, message: impl Into<String>) -> Self {
        SpecError { kind, at, message: message.into() }
    }
}

/// The closest of `candidates` to `word`, if it is close enough to be a likely typo.
pub fn nearest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(word, c), c))
        .filter(|(score, _)| *score >= 0.75)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

/// ", did you mean 'x'?" or nothing.
pub fn did_you_mean<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    match nearest(word, candidates) {
        Some(c) => format!(" (did you mean '{c}'?)"),
        None => String::new(),
    }
}
