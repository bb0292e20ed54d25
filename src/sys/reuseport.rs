//! Steering the datagrams of one `SO_REUSEPORT` group of UDP sockets with a classic BPF
//! program attached with `SO_ATTACH_REUSEPORT_CBPF` (the program itself is the software
//! provider's: `soft::transport::program`).
//!
//! Sockets bound to one address and port with `SO_REUSEPORT` (by one user) form a group; the
//! kernel numbers them in bind order. Without a program it picks a socket by the hash of the
//! 4-tuple, so all datagrams of one source port land on one socket. With a program attached
//! (to any socket of the group; one per group), the kernel runs it on every datagram it
//! delivers, the UDP header already pulled: its return value is the socket's index.
//!
//! Invariants the users of a steered group keep:
//! - An index not below the group's size falls back to the hash (the datagram still reaches
//!   some socket of the group).
//! - Sockets are numbered in bind order, and closing one moves the last socket into its
//!   slot: the sockets of a group are closed together, never one by one.
//! - The program runs once per buffer: a GSO train goes whole to the socket its first
//!   datagram names, and a buffer GRO merged was steered by hash before the program saw it
//!   (the GRO path selects a socket without the packet).

use std::io;
use std::os::fd::{AsFd, AsRawFd};

/// Attaches `prog` to the reuseport group of `sock` (bound with `SO_REUSEPORT`), replacing
/// the group's program.
///
/// # Errors
/// The kernel's: `EINVAL` for a program its checker refuses or an empty one, `EPERM`-like
/// errors where the socket is in no group.
pub(crate) fn attach_reuseport_cbpf(
    sock: &impl AsFd,
    prog: &[libc::sock_filter],
) -> io::Result<()> {
    let len = u16::try_from(prog.len()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "a classic BPF program of more than 65,535 instructions",
        )
    })?;
    let fprog = libc::sock_fprog {
        len,
        // The kernel copies the instructions and never writes through the pointer.
        filter: prog.as_ptr().cast_mut(),
    };
    let fd = sock.as_fd().as_raw_fd();
    // SAFETY: `fd` is borrowed from a live `AsFd`; `optval` points to a `sock_fprog` on this
    // frame whose `filter` points to `len` instructions borrowed from `prog`, all outliving
    // the call; `optlen` is the struct's exact size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            std::ptr::from_ref(&fprog).cast(),
            size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        let e = io::Error::last_os_error();
        Err(io::Error::new(
            e.kind(),
            format!("SO_ATTACH_REUSEPORT_CBPF: {e}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

    const fn insn(code: u16, k: u32) -> libc::sock_filter {
        libc::sock_filter {
            code,
            jt: 0,
            jf: 0,
            k,
        }
    }

    /// The kernel's checker takes a program on a socket of a group, and refuses an
    /// instruction it does not know; a socket in no group takes none.
    #[test]
    fn the_kernel_takes_a_program_on_a_group() {
        use socket2::{Domain, Protocol, SockAddr, Socket, Type};
        let prog = [insn(RET_K, 0)];
        let bind = |s: &Socket| {
            s.bind(&SockAddr::from(std::net::SocketAddr::from((
                [127, 0, 0, 1],
                0,
            ))))
        };
        let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
        s.set_reuse_port(true).unwrap();
        bind(&s).unwrap();
        attach_reuseport_cbpf(&s, &prog).unwrap();
        let bad = [insn(0xFFFF, 0)];
        assert!(attach_reuseport_cbpf(&s, &bad).is_err());
        let alone = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
        bind(&alone).unwrap();
        assert!(attach_reuseport_cbpf(&alone, &prog).is_err());
    }
}
