//! `recvmsg(2)` / `recvmmsg(2)` for UDP with the packet-info control message decoded, and
//! unconnected `sendmmsg(2)`.
//!
//! socket2's `recvmsg` hands back the control bytes as `MaybeUninit`, so reading them needs
//! `unsafe` either way; doing the whole call here keeps the `CMSG_*` walk next to the buffer it
//! walks.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd};

use socket2::SockAddr;

/// What `recv_pktinfo` or `recv_batch` learned about one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// Bytes written to the buffer (at most its length).
    pub len: usize,
    /// True when the datagram was longer than the buffer and the kernel cut it (`MSG_TRUNC`).
    pub truncated: bool,
    /// The sender's address.
    pub src: SocketAddr,
    /// The datagram's destination IP from `IP_PKTINFO` / `IPV6_PKTINFO`, when the socket asked
    /// for it (`IP_PKTINFO` / `IPV6_RECVPKTINFO` set).
    pub dst_ip: Option<IpAddr>,
    /// With UDP GRO on (`UDP_GRO` set), the kernel may hand over several
    /// datagrams of one flow as one: then this is their length (`UDP_GRO` control message) and
    /// the buffer holds them back to back, the last one possibly shorter.
    pub segment_len: Option<u16>,
}

/// What the control messages of one received datagram said.
#[derive(Debug, Clone, Copy, Default)]
struct Control {
    dst_ip: Option<IpAddr>,
    segment_len: Option<u16>,
}

/// Control buffer: room for one `in6_pktinfo` or `in_pktinfo` message plus slack for any other
/// message the socket might be asked for later. `u64` elements keep it aligned for `cmsghdr`.
type ControlBuf = [u64; 16];

/// Receives one datagram into `buf` with a single `recvmsg(2)` and decodes the packet-info
/// control message.
///
/// Errors are the OS's: `WouldBlock` on an empty non-blocking socket.
pub(crate) fn recv_pktinfo(sock: &impl AsFd, buf: &mut [u8]) -> io::Result<Received> {
    let fd = sock.as_fd().as_raw_fd();
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control: ControlBuf = [0; 16];

    // SAFETY: `try_init` hands the closure a zeroed `sockaddr_storage` and its length, and
    // builds the `SockAddr` from whatever length the closure leaves behind; the kernel writes at
    // most `msg_namelen` bytes into it and reports the real length back.
    let ((len, flags, control), addr) = unsafe {
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
            let control = decode_control(&msg);
            Ok((n as usize, msg.msg_flags, control))
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
        dst_ip: control.dst_ip,
        segment_len: control.segment_len,
    })
}

/// Walks the control messages of a `msghdr` filled by `recvmsg`: the destination address from
/// the first `IP_PKTINFO` or `IPV6_PKTINFO` message and the segment length from `UDP_GRO`.
///
/// # Safety
///
/// `msg.msg_control` must point to `msg.msg_controllen` readable bytes, aligned for `cmsghdr`,
/// as the kernel leaves them after a successful `recvmsg`.
unsafe fn decode_control(msg: &libc::msghdr) -> Control {
    // Each message takes at least CMSG_SPACE(0) bytes, so the walk ends after at most
    // controllen / 16 steps; the explicit bound only guards against a corrupt header.
    const MAX_MESSAGES: usize = size_of::<ControlBuf>() / size_of::<libc::cmsghdr>();
    let mut out = Control::default();
    // SAFETY: the caller guarantees `msg` describes a valid control buffer.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(msg) };
    for _ in 0..MAX_MESSAGES {
        if cmsg.is_null() {
            break;
        }
        // SAFETY: a non-null pointer from CMSG_FIRSTHDR/CMSG_NXTHDR points to a complete,
        // aligned `cmsghdr` inside the control buffer.
        let hdr = unsafe { &*cmsg };
        let data_len = (hdr.cmsg_len as usize).saturating_sub(
            // SAFETY: CMSG_LEN is pure arithmetic on its argument.
            unsafe { libc::CMSG_LEN(0) } as usize,
        );
        match (hdr.cmsg_level, hdr.cmsg_type) {
            (libc::IPPROTO_IP, libc::IP_PKTINFO)
                if out.dst_ip.is_none() && data_len >= size_of::<libc::in_pktinfo>() =>
            {
                // SAFETY: the message carries at least `size_of::<in_pktinfo>()` data bytes
                // starting at CMSG_DATA; `read_unaligned` copes with any alignment.
                let info: libc::in_pktinfo =
                    unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast()) };
                // `ipi_addr` is the destination address from the IP header (`ipi_spec_dst` is
                // the local address routing would pick, which differs for broadcasts).
                out.dst_ip = Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                    info.ipi_addr.s_addr,
                ))));
            }
            (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO)
                if out.dst_ip.is_none() && data_len >= size_of::<libc::in6_pktinfo>() =>
            {
                // SAFETY: as above, for `in6_pktinfo`.
                let info: libc::in6_pktinfo =
                    unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast()) };
                out.dst_ip = Some(IpAddr::V6(Ipv6Addr::from(info.ipi6_addr.s6_addr)));
            }
            (libc::SOL_UDP, libc::UDP_GRO) if data_len >= size_of::<libc::c_int>() => {
                // SAFETY: as above, for the `int` segment size.
                let size: libc::c_int =
                    unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast()) };
                out.segment_len = u16::try_from(size).ok().filter(|&s| s > 0);
            }
            _ => {}
        }
        // SAFETY: `cmsg` is a valid header inside the buffer `msg` describes; CMSG_NXTHDR
        // bounds-checks against `msg_controllen` and returns null at the end.
        cmsg = unsafe { libc::CMSG_NXTHDR(msg, cmsg) };
    }
    out
}

/// Most datagrams one [`recv_batch`] or [`send_batch`] call moves (the `iovec`/`mmsghdr` arrays
/// live on the stack, sized by this).
pub(crate) const BATCH_MAX: usize = 64;

/// Receive buffers for `recv_batch`: `slots` datagram buffers of `slot_len` bytes each, their
/// source-address and control buffers, and what the last call learned about each.
pub struct RecvBatch {
    data: Vec<u8>,
    slot_len: usize,
    names: Vec<libc::sockaddr_storage>,
    controls: Vec<ControlBuf>,
    meta: Vec<Received>,
}

impl std::fmt::Debug for RecvBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBatch")
            .field("slots", &self.names.len())
            .field("slot_len", &self.slot_len)
            .field("received", &self.meta.len())
            .finish()
    }
}

impl RecvBatch {
    /// `slots` buffers (clamped to 1..=`BATCH_MAX`) of `slot_len` bytes each. The buffers are
    /// zero-filled by the allocator, so pages a datagram never reaches stay uncommitted until
    /// written ([`RecvBatch::buffers_mut`]).
    pub fn new(slots: usize, slot_len: usize) -> Self {
        let slots = slots.clamp(1, BATCH_MAX);
        // SAFETY: `sockaddr_storage` is a plain C struct for which all-zero bytes are valid.
        let zero_name: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        Self {
            data: vec![0; slots * slot_len],
            slot_len,
            names: vec![zero_name; slots],
            controls: vec![[0; 16]; slots],
            meta: Vec::with_capacity(slots),
        }
    }

    /// Every slot's bytes, whatever they hold: to commit their memory at start (the pages
    /// the datagrams of a full batch reach), not at the first large batch.
    pub fn buffers_mut(&mut self) -> &mut [u8] {
        &mut self.data
    }

    /// How many datagrams the last `recv_batch` received (truncated ones included).
    pub fn len(&self) -> usize {
        self.meta.len()
    }

    /// How many datagrams one `recv_batch` can receive.
    pub fn capacity(&self) -> usize {
        self.names.len()
    }

    /// True when the last `recv_batch` received nothing.
    pub fn is_empty(&self) -> bool {
        self.meta.is_empty()
    }

    /// The `i`th datagram of the last `recv_batch`: what was learned about it and its bytes
    /// (`len` of them; cut to the slot length when `truncated`).
    pub fn get(&self, i: usize) -> Option<(Received, &[u8])> {
        let meta = *self.meta.get(i)?;
        let start = i * self.slot_len;
        let bytes = self.data.get(start..start + meta.len)?;
        Some((meta, bytes))
    }
}

/// Decodes an IPv4 or IPv6 socket address the kernel wrote into `storage`.
fn storage_to_socket_addr(storage: &libc::sockaddr_storage, len: usize) -> Option<SocketAddr> {
    match i32::from(storage.ss_family) {
        libc::AF_INET if len >= size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a `sockaddr_in`, which is smaller than
            // and less aligned than `sockaddr_storage`.
            let sin = unsafe { &*std::ptr::from_ref(storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))),
                u16::from_be(sin.sin_port),
            ))
        }
        libc::AF_INET6 if len >= size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for `sockaddr_in6`.
            let sin6 = unsafe { &*std::ptr::from_ref(storage).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Receives up to `batch`'s slot count of datagrams with one `recvmmsg(2)` and decodes each
/// one's packet-info control message; returns how many arrived (also `batch.len()`).
///
/// Errors are the OS's: `WouldBlock` when nothing is queued on a non-blocking socket (the batch
/// is then empty). A datagram from a non-IP source address is an `InvalidData` error.
pub(crate) fn recv_batch(sock: &impl AsFd, batch: &mut RecvBatch) -> io::Result<usize> {
    let fd = sock.as_fd().as_raw_fd();
    batch.meta.clear();
    let slots = batch.names.len();
    let slot_len = batch.slot_len;
    // SAFETY: `iovec` and `mmsghdr` are plain C structs for which all-zero bytes are valid.
    let mut iovs: [libc::iovec; BATCH_MAX] = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut hdrs: [libc::mmsghdr; BATCH_MAX] = unsafe { std::mem::zeroed() };
    let base = batch.data.as_mut_ptr();
    for i in 0..slots {
        iovs[i] = libc::iovec {
            // SAFETY: `data` holds `slots * slot_len` bytes, so slot `i` starts inside it.
            iov_base: unsafe { base.add(i * slot_len) }.cast(),
            iov_len: slot_len,
        };
        let msg = &mut hdrs[i].msg_hdr;
        msg.msg_name = std::ptr::from_mut(&mut batch.names[i]).cast();
        msg.msg_namelen = size_of::<libc::sockaddr_storage>() as _;
        msg.msg_iov = &mut iovs[i];
        msg.msg_iovlen = 1;
        msg.msg_control = batch.controls[i].as_mut_ptr().cast();
        msg.msg_controllen = size_of::<ControlBuf>() as _;
    }
    // SAFETY: the first `slots` headers point at live, disjoint buffers of the lengths stored
    // next to them (a slot of `data`, one `sockaddr_storage`, one control buffer), all owned by
    // `batch` or this frame and outliving the call; a null timeout means none.
    let n = unsafe {
        libc::recvmmsg(
            fd,
            hdrs.as_mut_ptr(),
            slots as _,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = (n as usize).min(slots);
    for hdr in &hdrs[..n] {
        let msg = &hdr.msg_hdr;
        let idx = batch.meta.len();
        let src = storage_to_socket_addr(&batch.names[idx], msg.msg_namelen as usize).ok_or_else(
            || {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    "recvmmsg returned a non-IP source address",
                )
            },
        )?;
        // SAFETY: after a successful `recvmmsg`, each returned header's `msg_control` /
        // `msg_controllen` describe the control bytes the kernel wrote into that slot's buffer.
        let control = unsafe { decode_control(msg) };
        batch.meta.push(Received {
            len: (hdr.msg_len as usize).min(slot_len),
            truncated: msg.msg_flags & libc::MSG_TRUNC != 0,
            src,
            dst_ip: control.dst_ip,
            segment_len: control.segment_len,
        });
    }
    Ok(n)
}

/// One datagram for [`send_batch`].
#[derive(Debug, Clone)]
pub(crate) struct Outgoing {
    /// Where it goes.
    pub dst: SockAddr,
    /// The UDP payload: one datagram, or with `segment_len` a GSO train of them.
    pub data: Vec<u8>,
    /// 0 for one datagram. Otherwise `data` is a train of datagrams of this length (the last
    /// one may be shorter) that the kernel cuts apart (UDP GSO: a `UDP_SEGMENT` control
    /// message; at most 64 segments and 65,507 bytes in all, each segment within the path MTU).
    pub segment_len: u16,
}

/// Control buffer of one outgoing message: room for `CMSG_SPACE(sizeof(u16))` (24 bytes).
type SendControlBuf = [u64; 4];

/// Sends `msgs` (at most [`BATCH_MAX`] of them; the rest are ignored) with one unconnected
/// `sendmmsg(2)`; returns how many the kernel took, in order.
///
/// When the kernel stops early, the datagram after the last one sent failed and its error was
/// not reported (`sendmmsg` reports an error only when nothing was sent): call again with the
/// tail, which starts with that datagram, to get it. Errors are the OS's: `WouldBlock` when the
/// first datagram does not fit in the send buffer.
pub(crate) fn send_batch(sock: &impl AsFd, msgs: &[Outgoing]) -> io::Result<usize> {
    let fd = sock.as_fd().as_raw_fd();
    let count = msgs.len().min(BATCH_MAX);
    if count == 0 {
        return Ok(0);
    }
    // SAFETY: `iovec` and `mmsghdr` are plain C structs for which all-zero bytes are valid.
    let mut iovs: [libc::iovec; BATCH_MAX] = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut hdrs: [libc::mmsghdr; BATCH_MAX] = unsafe { std::mem::zeroed() };
    let mut controls: [SendControlBuf; BATCH_MAX] = [[0; 4]; BATCH_MAX];
    for (i, m) in msgs[..count].iter().enumerate() {
        iovs[i] = libc::iovec {
            // The kernel only reads through it (`sendmmsg`); the field is `*mut` in C.
            iov_base: m.data.as_ptr().cast_mut().cast(),
            iov_len: m.data.len(),
        };
        let msg = &mut hdrs[i].msg_hdr;
        msg.msg_name = m.dst.as_ptr().cast_mut().cast();
        msg.msg_namelen = m.dst.len();
        msg.msg_iov = &mut iovs[i];
        msg.msg_iovlen = 1;
        if m.segment_len > 0 && m.data.len() > usize::from(m.segment_len) {
            msg.msg_control = controls[i].as_mut_ptr().cast();
            // SAFETY: CMSG_SPACE is pure arithmetic on its argument.
            msg.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as _;
            // SAFETY: `msg_control` points to `controls[i]` (32 bytes, aligned for `cmsghdr`),
            // at least the CMSG_SPACE just set, so the first header and its two data bytes
            // lie inside it.
            unsafe {
                let cmsg = libc::CMSG_FIRSTHDR(msg);
                (*cmsg).cmsg_level = libc::SOL_UDP;
                (*cmsg).cmsg_type = libc::UDP_SEGMENT;
                (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u16>(), m.segment_len);
            }
        }
    }
    // SAFETY: the first `count` headers point at live buffers of the stated lengths (each
    // message's bytes and destination address, borrowed from `msgs` for the call, and its
    // control buffer in `controls`); the kernel only reads them and writes `msg_len` into
    // `hdrs`.
    let n = unsafe { libc::sendmmsg(fd, hdrs.as_mut_ptr(), count as _, libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((n as usize).min(count))
}
