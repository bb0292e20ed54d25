//! The classic interface ioctls' plumbing (`struct ifreq` on a datagram socket), shared by the
//! TUN device's configuration and the underlay link's queries: they act on the network
//! namespace of the calling thread, as netlink does, whatever `/sys` shows.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// A control socket for interface ioctls (any datagram socket of the family will do).
pub(crate) fn ctl_socket(family: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: socket(2) takes no pointers; the returned descriptor is checked before it is
    // wrapped, and OwnedFd takes sole ownership of it.
    let fd = unsafe { libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh, valid descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An `ifreq` naming `name`.
pub(crate) fn ifreq(name: &str) -> io::Result<libc::ifreq> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("invalid interface name {name:?}"),
        ));
    }
    // SAFETY: ifreq is plain old data (a name array and a union of integers and sockaddrs);
    // all-zero bytes are a valid value of it.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    Ok(req)
}

/// `ioctl(fd, request, arg)`, with the errno turned into an error naming `what`.
///
/// # Safety
/// `arg` must point to the structure `request` expects, valid for reads and writes.
pub(crate) unsafe fn ioctl<T>(
    fd: RawFd,
    request: libc::Ioctl,
    arg: *mut T,
    what: &str,
) -> io::Result<()> {
    // SAFETY: the caller guarantees `arg` matches `request`.
    if unsafe { libc::ioctl(fd, request, arg) } < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_names() {
        assert!(ifreq("").is_err());
        assert!(ifreq("a-name-that-is-far-too-long").is_err());
        assert!(ifreq("nul\0").is_err());
        assert!(ifreq("ib0").is_ok());
    }
}
