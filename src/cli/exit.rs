//! How a command ends, as its exit status says it: one type per outcome
//! and one for errors, each variant with its code (as ripgrep and
//! cargo-nextest map theirs), tested per variant.
//!
//! | status | meaning |
//! |---|---|
//! | 0 | done, and what was checked holds |
//! | 1 | done, and something does not hold: a node or gate failed, a check differs, a transfer failed, a pack is tampered; or a remote failed |
//! | 2 | the command could not run: the command line, a spec, a file or a value is not what was expected |
//! | 128 + N | stopped by signal N (130 for Ctrl-C) |

use std::process::ExitCode;

/// How a command that ran ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Status {
    /// Everything asked for was done, and what it checked holds.
    Ok,
    /// The command ran, and what it checked does not hold.
    Failed,
    /// Stopped by this signal (the run recorded itself as interrupted).
    Interrupted(i32),
    /// A process whose own status is passed through (the worker of `generate`).
    Exited(ExitCode),
}

impl Status {
    pub fn code(self) -> ExitCode {
        match self {
            Status::Ok => ExitCode::SUCCESS,
            Status::Failed => ExitCode::from(1),
            Status::Interrupted(sig) => ExitCode::from((128 + sig).clamp(0, 255) as u8),
            Status::Exited(code) => code,
        }
    }
}

/// Why a command could not run, by the exit status it gives.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A remote failed, or served what does not check out: a runtime
    /// failure like a failed node (1), not a usage error.
    #[error("{0:#}")]
    Remote(anyhow::Error),
    /// The command line, a spec, a file or a value given is not what was
    /// expected (2).
    #[error("{0:#}")]
    Input(anyhow::Error),
}

impl CliError {
    /// Sorts an error by what caused it.
    pub fn classify(e: anyhow::Error) -> CliError {
        use orchestrate_core::remote::RemoteError;
        let remote = e.chain().any(|c| {
            matches!(c.downcast_ref::<RemoteError>(), Some(RemoteError::Transfer(_) | RemoteError::Refused(_)))
        });
        if remote {
            CliError::Remote(e)
        } else {
            CliError::Input(e)
        }
    }

    pub fn code(&self) -> ExitCode {
        ExitCode::from(match self {
            CliError::Remote(_) => 1,
            CliError::Input(_) => 2,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_status_has_its_exit_code() {
        assert_eq!(Status::Ok.code(), ExitCode::SUCCESS);
        assert_eq!(Status::Failed.code(), ExitCode::from(1));
        assert_eq!(Status::Interrupted(2).code(), ExitCode::from(130), "Ctrl-C");
        assert_eq!(Status::Interrupted(15).code(), ExitCode::from(143), "SIGTERM");
        assert_eq!(Status::Interrupted(300).code(), ExitCode::from(255), "clamped, never wrapped to 44");
        assert_eq!(Status::Exited(ExitCode::from(7)).code(), ExitCode::from(7));
    }

    #[test]
    fn a_remote_failure_exits_1_and_any_other_error_2() {
        use orchestrate_core::remote::RemoteError;
        let transfer = anyhow::Error::new(RemoteError::Transfer("timed out".into())).context("pulling");
        let e = CliError::classify(transfer);
        assert!(matches!(e, CliError::Remote(_)), "{e:?}");
        assert_eq!(e.code(), ExitCode::from(1));
        assert!(e.to_string().contains("pulling") && e.to_string().contains("timed out"), "{e}");
        let refused = CliError::classify(anyhow::Error::new(RemoteError::Refused("bad hash".into())));
        assert_eq!(refused.code(), ExitCode::from(1));
        let input = CliError::classify(anyhow::anyhow!("spec.yaml:3: unknown key 'nodez'"));
        assert!(matches!(input, CliError::Input(_)));
        assert_eq!(input.code(), ExitCode::from(2));
    }
}
