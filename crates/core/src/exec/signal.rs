//! Interrupts: SIGINT and SIGTERM set a flag instead of killing the process,
//! so a coordinator can cancel its Slurm jobs (and a run record its end) first.

use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(sig: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
    // A second Ctrl-C kills the coordinator at once (its jobs keep running).
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
    }
}

/// Makes SIGINT and SIGTERM set the interrupt flag instead of killing the
/// process, so the coordinator can cancel its jobs first.
pub fn install_interrupt_handler() {
    let handler: extern "C" fn(libc::c_int) = on_signal;
    unsafe {
        libc::signal(libc::SIGINT, handler as libc::sighandler_t);
        libc::signal(libc::SIGTERM, handler as libc::sighandler_t);
    }
}

/// Whether the coordinator was interrupted (Ctrl-C or SIGTERM).
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}
