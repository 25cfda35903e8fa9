//! The errors of the libtorch library, one `thiserror` type (`anyhow` stays in
//! the worker binary). A failure keeps its cause: the error of tch, the store,
//! the guard or an op, or a message; [`Context`] adds what was being done.

use orchestrate_core::canonical::ArtifactError;
use orchestrate_core::data::rows::RowError;
use orchestrate_core::data::verifier::ProblemError;
use orchestrate_core::guard::events::EventError;
use orchestrate_core::guard::GuardError;
use orchestrate_core::model::chat::ChatError;
use orchestrate_core::model::config::ConfigError;
use orchestrate_core::model::{FolderError, TokenizerError};
use orchestrate_core::ops::{OpError, ParamError};
use orchestrate_core::store::StoreError;
use orchestrate_core::train::state::StateError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Msg(String),
    /// An input that reads but does not fit this node (a state of another
    /// run or model).
    #[error("{0}")]
    Input(String),
    /// What was being done, and why it failed (printed together, so the
    /// cause is not a separate `source` that would print twice).
    #[error("{context}: {cause}")]
    Context { context: String, cause: Box<Error> },
    #[error(transparent)]
    Tch(#[from] tch::TchError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    SafeTensors(#[from] safetensors::SafeTensorError),
    #[error(transparent)]
    Op(#[from] OpError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Guard(#[from] GuardError),
    #[error(transparent)]
    Event(#[from] EventError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    #[error(transparent)]
    Params(#[from] ParamError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Folder(#[from] FolderError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Problem(#[from] ProblemError),
    #[error(transparent)]
    Row(#[from] RowError),
    #[error(transparent)]
    Chat(#[from] ChatError),
}

impl Error {
    /// What kind of failure this is, for the worker's typed result
    /// (the cause's kind, through any context added on the way).
    pub fn kind(&self) -> orchestrate_core::ops::worker::FailureKind {
        use orchestrate_core::ops::worker::FailureKind;
        match self {
            Error::Context { cause, .. } => cause.kind(),
            Error::Params(_) => FailureKind::Params,
            Error::Guard(_) | Error::Event(_) => FailureKind::Guard,
            Error::Tch(_) => FailureKind::Torch,
            Error::Io(_) | Error::Store(_) => FailureKind::Io,
            Error::Op(OpError::Io { .. }) => FailureKind::Io,
            Error::Input(_)
            | Error::Json(_)
            | Error::SafeTensors(_)
            | Error::Tokenizer(_)
            | Error::Artifact(_)
            | Error::Config(_)
            | Error::Folder(_)
            | Error::State(_)
            | Error::Problem(_)
            | Error::Row(_)
            | Error::Chat(_) => FailureKind::Input,
            Error::Msg(_) | Error::Op(_) => FailureKind::Op,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Adds what was being done to a failure (`.context("reading x")?`), or turns a
/// missing value into one.
pub trait Context<T> {
    fn context(self, context: impl std::fmt::Display) -> Result<T>;
    fn with_context<C: std::fmt::Display>(self, context: impl FnOnce() -> C) -> Result<T>;
}

impl<T, E: Into<Error>> Context<T> for std::result::Result<T, E> {
    fn context(self, context: impl std::fmt::Display) -> Result<T> {
        self.map_err(|e| Error::Context { context: context.to_string(), cause: Box::new(e.into()) })
    }
    fn with_context<C: std::fmt::Display>(self, context: impl FnOnce() -> C) -> Result<T> {
        self.map_err(|e| Error::Context { context: context().to_string(), cause: Box::new(e.into()) })
    }
}

impl<T> Context<T> for Option<T> {
    fn context(self, context: impl std::fmt::Display) -> Result<T> {
        self.ok_or_else(|| Error::Msg(context.to_string()))
    }
    fn with_context<C: std::fmt::Display>(self, context: impl FnOnce() -> C) -> Result<T> {
        self.ok_or_else(|| Error::Msg(context().to_string()))
    }
}

/// An [`Error::Msg`] from a format string.
macro_rules! err {
    ($($arg:tt)*) => { $crate::error::Error::Msg(format!($($arg)*)) };
}

/// Returns an [`Error::Msg`] from a format string.
macro_rules! bail {
    ($($arg:tt)*) => { return Err($crate::error::err!($($arg)*)) };
}

/// Returns an [`Error::Msg`] unless the condition holds.
macro_rules! ensure {
    ($cond:expr, $($arg:tt)*) => {
        let holds: bool = $cond;
        if !holds {
            $crate::error::bail!($($arg)*);
        }
    };
}

pub(crate) use {bail, ensure, err};
