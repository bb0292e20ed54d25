//! `recvmsg(2)` for UDP with the packet-info control message decoded.
//!
//! socket2's `recvmsg` hands back the control bytes as `MaybeUninit`, so reading them needs
//! `unsafe` either way; doing the whole call here keeps the `CMSG_*` walk next to the buffer it
//! walks.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd};

use socket2::SockAddr;

/// What [`recv_pktinfo`] learned about one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// Bytes written to the buffer (at most its length).
    pub len: usize,
    /// True when the datagram was longer than the buffer and the kernel cut it (`MSG_TRUNC`).
    pub truncated: bool,
    /// The sender's address.
    pub src: SocketAddr,
    /// The datagram's destination IP from `IP_PKTINFO` / `IPV6_PKTINFO`, when the socket asked
    /// for it (see [`super::sockopt::set_pktinfo`]).
    pub dst_ip: Option<IpAddr>,
}

/// Control buffer: room for one `in6_pktinfo` or `in_pktinfo` message plus slack for any other
/// message the socket might be asked for later. `u64` elements keep it aligned for `cmsghdr`.
type ControlBuf = [u64; 16];

/// Receives one datagram into `buf` with a single `recvmsg(2)` and decodes the packet-info
/// control message.
///
/// Errors are the OS's: `WouldBlock` on an empty non-blocking socket.
pub fn recv_pktinfo(sock: &impl AsFd, buf: &mut [u8]) -> io::Result<Received> {
    let fd = sock.as_fd().as_raw_fd();
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control: ControlBuf = [0; 16];

    // SAFETY: `try_init` hands the closure a zeroed `sockaddr_storage` and its length, and
    // builds the `SockAddr` from whatever length the closure leaves behind; the kernel writes at
    // most `msg_namelen` bytes into it and reports the real length back.
    let ((len, flags, dst_ip), addr) = unsafe {
        SockAddr::try_init(|storage, storage_len| {
            // SAFETY: `msghdr` is a plain C struct for which all-zero bytes are a valid value
            // (null pointers, zero lengths).
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_name = storage.cast();
            msg.msg_namelen = *storage_len;
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = size_of::<ControlBuf>() as _;
            // SAFETY: every pointer in `msg` refers to a live buffer of the length stored next
            // to it (`storage`, `iov` -> `buf`, `control`), all of which outlive the call.
            let n = libc::recvmsg(fd, &mut msg, 0);
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            *storage_len = msg.msg_namelen;
            // SAFETY: after a successful `recvmsg`, `msg_control`/`msg_controllen` describe
            // the control bytes the kernel wrote into `control`.
            let dst_ip = pktinfo_dst(&msg);
            Ok((n as usize, msg.msg_flags, dst_ip))
        })
    }?;

    let src = addr.as_socket().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "recvmsg returned a non-IP source address",
        )
    })?;
    Ok(Received {
        len: len.min(buf.len()),
        truncated: flags & libc::MSG_TRUNC != 0,
        src,
        dst_ip,
    })
}

/// Walks the control messages of a `msghdr` filled by `recvmsg` and returns the destination
/// address from the first `IP_PKTINFO` or `IPV6_PKTINFO` message.
///
/// # Safety
///
/// `msg.msg_control` must point to `msg.msg_controllen` readable bytes, aligned for `cmsghdr`,
/// as the kernel leaves them after a successful `recvmsg`.
unsafe fn pktinfo_dst(msg: &libc::msghdr) -> Option<IpAddr> {
    // Each message takes at least CMSG_SPACE(0) bytes, so the walk ends after at most
    // controllen / 16 steps; the explicit bound only guards against a corrupt header.
    const MAX_MESSAGES: usize = size_of::<ControlBuf>() / size_of::<libc::cmsghdr>();
    // SAFETY: the caller guarantees `msg` describes a valid control buffer.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(msg) };
    for _ in 0..MAX_MESSAGES {
        if cmsg.is_null() {
            return None;
        }
        // SAFETY: a non-null pointer from CMSG_FIRSTHDR/CMSG_NXTHDR points to a complete,
        // aligned `cmsghdr` inside the control buffer.
        let hdr = unsafe { &*cmsg };
        let data_len = (hdr.cmsg_len as usize).saturating_sub(
            // SAFETY: CMSG_LEN is pure arithmetic on its argument.
            unsafe { libc::CMSG_LEN(0) } as usize,
        );
        match (hdr.cmsg_level, hdr.cmsg_type) {
            (libc::IPPROTO_IP, libc::IP_PKTINFO) if data_len >= size_of::<libc::in_pktinfo>() => {
                // SAFETY: the message carries at least `size_of::<in_pktinfo>()` data bytes
                // starting at CMSG_DATA; `read_unaligned` copes with any alignment.
                let info: libc::in_pktinfo =
                    unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast()) };
                // `ipi_addr` is the destination address from the IP header (`ipi_spec_dst` is
                // the local address routing would pick, which differs for broadcasts).
                return Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                    info.ipi_addr.s_addr,
                ))));
            }
            (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO)
                if data_len >= size_of::<libc::in6_pktinfo>() =>
            {
                // SAFETY: as above, for `in6_pktinfo`.
                let info: libc::in6_pktinfo =
                    unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast()) };
                return Some(IpAddr::V6(Ipv6Addr::from(info.ipi6_addr.s6_addr)));
            }
            _ => {}
        }
        // SAFETY: `cmsg` is a valid header inside the buffer `msg` describes; CMSG_NXTHDR
        // bounds-checks against `msg_controllen` and returns null at the end.
        cmsg = unsafe { libc::CMSG_NXTHDR(msg, cmsg) };
    }
    None
}
