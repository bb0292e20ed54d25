//! [`LinkWatch`]: a route netlink socket subscribed to the kernel's link and address
//! notifications (`RTMGRP_LINK`, `RTMGRP_IPV4_IFADDR`, `RTMGRP_IPV6_IFADDR`), used only as a
//! wake-up: its messages are read and thrown away unparsed, and whoever is woken asks the
//! kernel what it wants to know ([`super::ifaddr`]). Nothing read here is trusted or
//! interpreted, so no message, however malformed, can do anything but cause a re-read.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The notification groups: link changes (MTU, flags, carrier, removal) and IPv4/IPv6
/// address changes.
const GROUPS: u32 =
    (libc::RTMGRP_LINK | libc::RTMGRP_IPV4_IFADDR | libc::RTMGRP_IPV6_IFADDR) as u32;

/// Bytes read per message: the content is discarded, so a truncated read is as good as a
/// whole one (`recv` drops the rest of a datagram).
const DISCARD_BUF: usize = 512;

/// A non-blocking route netlink socket on the link and address groups, in the network
/// namespace of the thread that opened it.
#[derive(Debug)]
pub struct LinkWatch {
    fd: OwnedFd,
}

impl LinkWatch {
    /// Opens and binds the socket.
    ///
    /// # Errors
    /// `socket` or `bind` failed (no netlink in this kernel, no descriptors left).
    pub fn open() -> io::Result<Self> {
        // SAFETY: socket(2) takes no pointers; the descriptor is checked before it is owned.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh, valid descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sockaddr_nl is plain old data; all-zero is valid (pid 0: the kernel assigns
        // the port id).
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        addr.nl_groups = GROUPS;
        let len = size_of::<libc::sockaddr_nl>() as libc::socklen_t;
        // SAFETY: `addr` is a valid sockaddr_nl of `len` bytes that outlives the call, which
        // only reads it.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                std::ptr::addr_of!(addr).cast::<libc::sockaddr>(),
                len,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { fd })
    }

    /// Reads and discards up to `max` waiting messages; returns how many there were, and
    /// whether the kernel dropped some because the socket's buffer was full (`ENOBUFS`: the
    /// caller must assume anything changed). Fewer than `max` means the queue is empty.
    ///
    /// # Errors
    /// A read error other than would-block and `ENOBUFS`.
    pub fn drain(&self, max: usize) -> io::Result<(usize, bool)> {
        let mut buf = [0u8; DISCARD_BUF];
        let mut overrun = false;
        for n in 0..max {
            // SAFETY: `buf` is valid for writes of its length for the duration of the call.
            let r = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast::<libc::c_void>(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if r >= 0 {
                continue;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN) => return Ok((n, overrun)),
                Some(libc::EINTR) => {}
                Some(libc::ENOBUFS) => overrun = true,
                _ => return Err(e),
            }
        }
        Ok((max, overrun))
    }
}

impl AsRawFd for LinkWatch {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_and_reads_nothing_when_nothing_changed() {
        let w = LinkWatch::open().unwrap();
        // Whatever other tests change meanwhile, the read is bounded and never blocks.
        let (n, _) = w.drain(4).unwrap();
        assert!(n <= 4);
    }
}
