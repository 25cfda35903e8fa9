//! Interrupts: SIGINT, SIGTERM and SIGHUP set a flag instead of killing the
//! process, so the coordinator can stop starting nodes, stop the running ones,
//! cancel its Slurm jobs and record the run as interrupted before it exits.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
    INTERRUPTED.store(true, Ordering::SeqCst);
    // A second Ctrl-C kills the coordinator at once (its nodes die with it:
    // each is tied to this process).
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
    }
}

/// Makes SIGINT, SIGTERM and SIGHUP set the interrupt flag instead of killing
/// the process, so the coordinator can end the run cleanly.
pub fn install_interrupt_handler() {
    let handler: extern "C" fn(libc::c_int) = on_signal;
    unsafe {
        libc::signal(libc::SIGINT, handler as libc::sighandler_t);
        libc::signal(libc::SIGTERM, handler as libc::sighandler_t);
        libc::signal(libc::SIGHUP, handler as libc::sighandler_t);
    }
}

/// Whether the coordinator was interrupted (Ctrl-C, SIGTERM or SIGHUP).
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// The signal that interrupted the run (`None` if none did): its number and name.
pub fn interrupting_signal() -> Option<(i32, &'static str)> {
    let sig = SIGNAL.load(Ordering::SeqCst);
    interrupted().then_some((
        sig,
        match sig {
            libc::SIGINT => "SIGINT",
            libc::SIGTERM => "SIGTERM",
            libc::SIGHUP => "SIGHUP",
            _ => "a signal",
        },
    ))
}
