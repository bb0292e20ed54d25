//! What `ipoib-cm up` checks before any set-up step, so that the two mistakes of a first start
//! are named as such instead of surfacing as `EPERM` or `ENOENT` from the first step that
//! trips on them: the process lacks `CAP_NET_ADMIN`, or the host has no TUN device.

use std::path::Path;

use crate::sys::caps;
use crate::sys::peercred::effective_uid;

/// The device node every TUN interface is created through.
pub const TUN_DEVICE: &str = "/dev/net/tun";

/// Why `up` cannot start on this host; one line each.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PreflightError {
    /// The process lacks `CAP_NET_ADMIN`, which creating and configuring a TUN interface needs.
    #[error(
        "needs root or CAP_NET_ADMIN to create interface {ifname} (uid {uid} does not have \
         CAP_NET_ADMIN; run it with sudo, or as the systemd unit, which grants it)"
    )]
    NotPrivileged {
        /// The interface `up` would create.
        ifname: String,
        /// The process's effective uid.
        uid: u32,
    },
    /// There is no TUN device node.
    #[error(
        "no TUN device: {TUN_DEVICE} does not exist (load the module: modprobe tun; in a \
         container, pass the device in)"
    )]
    NoTunDevice,
}

impl PreflightError {
    /// The exit status: the daemon could not start.
    pub const EXIT_CODE: u8 = 2;
}

/// Ok when the process holds `CAP_NET_ADMIN` (or that cannot be told: no `/proc`, and the
/// set-up steps then report what fails) and the TUN device exists.
///
/// # Errors
/// The first [`PreflightError`] that applies.
pub fn check(ifname: &str) -> Result<(), PreflightError> {
    if let Ok(false) = caps::has_net_admin() {
        return Err(PreflightError::NotPrivileged {
            ifname: ifname.to_owned(),
            uid: effective_uid(),
        });
    }
    if !Path::new(TUN_DEVICE).exists() {
        return Err(PreflightError::NoTunDevice);
    }
    Ok(())
}
