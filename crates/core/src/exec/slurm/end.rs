//! How a job that ended without its node's result is described.

use super::queue::JobEnd;
use crate::spec::SlurmResources;

/// What happened to a job that ended without its node's result, with Slurm's
/// reason and exit code.
pub(super) fn describe_end(end: &JobEnd, res: &SlurmResources, cancelled_by_this_run: bool) -> String {
    let what = match end.state.as_str() {
        "CANCELLED" if cancelled_by_this_run => "was cancelled because the run was interrupted".to_string(),
        "CANCELLED" => "was cancelled (scancel, or by an administrator)".to_string(),
        "TIMEOUT" => {
            format!("hit its time limit{}", res.time.as_ref().map(|t| format!(" (time: {t})")).unwrap_or_default())
        }
        "OUT_OF_MEMORY" => {
            format!("ran out of memory{}", res.mem.as_ref().map(|m| format!(" (mem: {m})")).unwrap_or_default())
        }
        "NODE_FAIL" => "was lost with its compute node (NODE_FAIL)".to_string(),
        "PREEMPTED" => "was preempted".to_string(),
        "COMPLETED" => "completed without reporting a result (did exec-node run?)".to_string(),
        other => format!("ended {other}"),
    };
    let mut detail = Vec::new();
    if !end.reason.is_empty() && end.reason != "None" {
        detail.push(format!("reason {}", end.reason));
    }
    if !end.exit.is_empty() {
        detail.push(format!("exit code {}", end.exit));
    }
    if detail.is_empty() {
        what
    } else {
        format!("{what} ({})", detail.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ends_name_the_limit_and_slurms_reason() {
        let res = SlurmResources { time: Some("4:00:00".into()), mem: Some("8G".into()), ..Default::default() };
        let end = |state: &str, reason: &str, exit: &str| JobEnd {
            state: state.into(),
            reason: reason.into(),
            exit: exit.into(),
        };
        assert_eq!(
            describe_end(&end("TIMEOUT", "TimeLimit", "0:15"), &res, false),
            "hit its time limit (time: 4:00:00) (reason TimeLimit, exit code 0:15)"
        );
        assert_eq!(describe_end(&end("OUT_OF_MEMORY", "None", ""), &res, false), "ran out of memory (mem: 8G)");
        assert_eq!(
            describe_end(&end("CANCELLED", "None", "0:15"), &res, false),
            "was cancelled (scancel, or by an administrator) (exit code 0:15)"
        );
        assert_eq!(
            describe_end(&end("CANCELLED", "None", "0:15"), &res, true),
            "was cancelled because the run was interrupted (exit code 0:15)"
        );
        assert_eq!(describe_end(&end("DEADLINE", "", ""), &SlurmResources::default(), false), "ended DEADLINE");
    }
}
