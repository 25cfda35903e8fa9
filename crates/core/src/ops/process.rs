//! Running a child process for an op: killed with us, cancellable, logged.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::OpError;

/// Spawns `cmd` so that it dies if this thread dies: if orchestrate is
/// SIGKILLed, no orphan keeps writing outputs the next run will produce.
pub fn spawn_tied(cmd: &mut Command) -> std::io::Result<Child> {
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Waits for a child, killing it if the run is cancelled.
pub fn wait(child: &mut Child, cancel: &AtomicBool) -> Result<ExitStatus, OpError> {
    loop {
        if let Some(status) = child.try_wait().map_err(|e| OpError::io("waiting for a child process", e))? {
            return Ok(status);
        }
        if cancel.load(Ordering::Relaxed) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(OpError::Cancelled);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// "exit code N" or "a signal", for messages.
pub fn describe(status: ExitStatus) -> String {
    status.code().map_or_else(|| "a signal".to_string(), |c| format!("exit code {c}"))
}
