//! Whether this process may create the interface: `ipoib-cm up` checks it before any set-up
//! step, so that an unprivileged start names what is missing (root or `CAP_NET_ADMIN`)
//! instead of the first step that fails with `EPERM`.

use crate::sys::caps;
use crate::sys::peercred::effective_uid;

/// The process lacks `CAP_NET_ADMIN`, which creating and configuring a TUN interface needs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "needs root or CAP_NET_ADMIN to create interface {ifname} (uid {uid} does not have \
     CAP_NET_ADMIN; run it with sudo, or as the systemd unit, which grants it)"
)]
pub struct NotPrivileged {
    /// The interface `up` would create.
    pub ifname: String,
    /// The process's effective uid.
    pub uid: u32,
}

impl NotPrivileged {
    /// The exit status: the daemon could not start.
    pub const EXIT_CODE: u8 = 2;
}

/// Ok when the process holds `CAP_NET_ADMIN`, or when that cannot be told (no `/proc`: the
/// set-up steps then report what fails).
///
/// # Errors
/// [`NotPrivileged`] naming `ifname` and the uid.
pub fn check_net_admin(ifname: &str) -> Result<(), NotPrivileged> {
    match caps::has_net_admin() {
        Ok(false) => Err(NotPrivileged {
            ifname: ifname.to_owned(),
            uid: effective_uid(),
        }),
        Ok(true) | Err(_) => Ok(()),
    }
}
