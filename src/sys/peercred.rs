//! Credentials of the process at the other end of a Unix stream socket (`SO_PEERCRED`), and
//! this process's effective uid, for the control socket's access check.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

use libc::socklen_t;

/// What the kernel recorded about a Unix socket peer when it connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerCred {
    /// Process id of the peer at `connect(2)` time.
    pub pid: i32,
    /// Effective user id of the peer.
    pub uid: u32,
    /// Effective group id of the peer.
    pub gid: u32,
}

/// Reads `SO_PEERCRED` of a connected Unix stream socket.
///
/// # Errors
/// The `getsockopt(2)` error (`ENOTSOCK`, `ENOPROTOOPT` on a non-Unix socket, ...).
pub(crate) fn peer_cred(sock: &impl AsFd) -> io::Result<PeerCred> {
    let fd = sock.as_fd().as_raw_fd();
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = size_of::<libc::ucred>() as socklen_t;
    // SAFETY: `fd` is borrowed from a live `AsFd` for the duration of the call; `optval` points
    // to a `ucred` on this stack frame and `optlen` to its exact size, both outliving the call.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize != size_of::<libc::ucred>() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "SO_PEERCRED returned a short ucred",
        ));
    }
    Ok(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// This process's effective user id (`geteuid(2)`).
pub(crate) fn effective_uid() -> u32 {
    // SAFETY: `geteuid` takes no arguments, touches no memory of ours and cannot fail.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn peer_of_a_socketpair_is_this_process() {
        let (a, b) = UnixStream::pair().unwrap();
        let cred = peer_cred(&a).unwrap();
        assert_eq!(cred.uid, effective_uid());
        assert_eq!(cred.pid, std::process::id() as i32);
        assert_eq!(peer_cred(&b).unwrap(), cred);
    }
}
