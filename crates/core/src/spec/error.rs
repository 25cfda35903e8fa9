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

pub use crate::suggest::{did_you_mean, nearest};
