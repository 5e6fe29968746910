//! The user this process runs as: the owner the durable history's files must have
//! (`durable::files`), the one its hand-over socket's directory must have and the only one
//! whose processes it hands connections to (`handover`). Below both, so neither names the other.
#![allow(unsafe_code)]

/// This process's effective user id.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}
