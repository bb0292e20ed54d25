//! Steering the datagrams of one `SO_REUSEPORT` group of UDP sockets by the RoCEv2 BTH's
//! destination QP: a classic BPF program attached with `SO_ATTACH_REUSEPORT_CBPF`.
//!
//! Sockets bound to one address and port with `SO_REUSEPORT` (by one user) form a group; the
//! kernel numbers them in bind order. Without a program it picks a socket by the hash of the
//! 4-tuple, so all datagrams of one source port land on one socket. With a program attached
//! (to any socket of the group; one per group), the kernel runs it on every datagram it
//! delivers, the UDP header already pulled (`lookup_reuseport` hands
//! `sizeof(struct udphdr)` to `run_bpf_filter`): offset 0 is the first byte of the BTH, and
//! the destination QP is the low 24 bits of the big-endian word at offset 4. The program's
//! return value is the socket's index.
//!
//! Invariants the users of a steered group keep:
//! - An index not below the group's size falls back to the hash (the datagram still reaches
//!   some socket of the group). A datagram too short to hold the word at offset 4 ends the
//!   program with 0: socket 0.
//! - Sockets are numbered in bind order, and closing one moves the last socket into its
//!   slot: the sockets of a group are closed together, never one by one.
//! - The program runs once per buffer: a GSO train goes whole to the socket its first
//!   datagram names, and a buffer GRO merged was steered by hash before the program saw it
//!   (the GRO path selects a socket without the packet).

use std::io;
use std::os::fd::{AsFd, AsRawFd};

/// The most QPNs [`qpn_steering`] can send to socket 0 (each is one compare instruction,
/// whose jumps count instructions in a byte).
pub(crate) const MAX_TO_FIRST: usize = 16;

/// `BPF_LD | BPF_W | BPF_ABS`: load the big-endian 32-bit word at offset `k`.
const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
/// `BPF_ALU | BPF_AND | BPF_K`: `A &= k`.
const AND_K: u16 = (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16;
/// `BPF_JMP | BPF_JEQ | BPF_K`: `pc += (A == k) ? jt : jf`.
const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
/// `BPF_RET | BPF_A`: return `A`.
const RET_A: u16 = (libc::BPF_RET | libc::BPF_A) as u16;
/// `BPF_RET | BPF_K`: return `k`.
const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

/// Offset of the BTH word whose low 24 bits are the destination QP (after the UDP header).
const DEST_QP_WORD: u32 = 4;
/// The destination QP's bits of that word.
const QPN_MASK: u32 = 0x00FF_FFFF;

const fn insn(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// A classic BPF program that picks a group's socket by the BTH's destination QP: socket 0
/// for each QPN of `to_first` (at most [`MAX_TO_FIRST`] of them; more are `None`), else
/// socket `dest_qpn & mask`.
///
/// ```text
///     ld [4]; and #0xffffff
///     jeq #to_first[i], first        (for each i)
///     and #mask; ret a
/// first:
///     ret #0
/// ```
pub(crate) fn qpn_steering(mask: u32, to_first: &[u32]) -> Option<Vec<libc::sock_filter>> {
    if to_first.len() > MAX_TO_FIRST {
        return None;
    }
    let m = to_first.len();
    let mut prog = Vec::with_capacity(m + 5);
    prog.push(insn(LD_W_ABS, 0, 0, DEST_QP_WORD));
    prog.push(insn(AND_K, 0, 0, QPN_MASK));
    for (i, &qpn) in to_first.iter().enumerate() {
        // From the instruction after this compare to `ret #0`: the compares after it,
        // `and`, `ret a`. At most 17, so it fits.
        let jt = u8::try_from(m - i + 1).ok()?;
        prog.push(insn(JEQ_K, jt, 0, qpn & QPN_MASK));
    }
    prog.push(insn(AND_K, 0, 0, mask));
    prog.push(insn(RET_A, 0, 0, 0));
    prog.push(insn(RET_K, 0, 0, 0));
    Some(prog)
}

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

    /// Runs a program of the instructions [`qpn_steering`] uses on `pkt`, as the kernel does:
    /// a load past the end ends it with 0. `None`: an instruction it does not know, or no
    /// return within the program's length.
    fn run(prog: &[libc::sock_filter], pkt: &[u8]) -> Option<u32> {
        let mut a = 0u32;
        let mut pc = 0usize;
        for _ in 0..prog.len() {
            let i = prog.get(pc)?;
            pc += 1;
            match i.code {
                LD_W_ABS => {
                    let k = i.k as usize;
                    let Some(w) = pkt.get(k..k + 4) else {
                        return Some(0);
                    };
                    a = u32::from_be_bytes(w.try_into().ok()?);
                }
                AND_K => a &= i.k,
                JEQ_K => pc += usize::from(if a == i.k { i.jt } else { i.jf }),
                RET_A => return Some(a),
                RET_K => return Some(i.k),
                _ => return None,
            }
        }
        None
    }

    /// A BTH (12 bytes, then a payload) with destination QP `qpn`.
    fn bth(qpn: u32) -> Vec<u8> {
        let mut b = vec![
            0x04, 0, 0xff, 0xff, 0xAA, 0, 0, 0, 0x80, 0, 0, 1, 9, 9, 9, 9,
        ];
        b[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        b
    }

    #[test]
    fn the_program_picks_the_low_bits_and_sends_the_listed_qpns_first() {
        for count in [1u32, 2, 4, 8, 64] {
            let prog = qpn_steering(count - 1, &[1, 0xFF_FFFF]).unwrap();
            assert_eq!(prog.len(), 7);
            for qpn in (0..4096).chain([0xFF_FFFE, 0x12_3457]) {
                let want = if qpn == 1 { 0 } else { qpn & (count - 1) };
                assert_eq!(run(&prog, &bth(qpn)), Some(want), "{count} {qpn:#x}");
            }
            assert_eq!(run(&prog, &bth(0xFF_FFFF)), Some(0));
            // The byte before the QP (BTH byte 4, reserved) does not matter.
            let mut b = bth(0x13);
            b[4] = 0xFF;
            assert_eq!(run(&prog, &b), Some(0x13 & (count - 1)));
            // Too short for the word: the kernel's failed load returns 0.
            assert_eq!(run(&prog, &b[..7]), Some(0));
        }
        let none = qpn_steering(3, &[]).unwrap();
        assert_eq!(run(&none, &bth(1)), Some(1));
        assert!(qpn_steering(3, &[7; MAX_TO_FIRST]).is_some());
        assert!(qpn_steering(3, &[7; MAX_TO_FIRST + 1]).is_none());
        let full = qpn_steering(3, &[7; MAX_TO_FIRST]).unwrap();
        assert_eq!(run(&full, &bth(7)), Some(0));
        assert_eq!(run(&full, &bth(6)), Some(2));
    }

    /// The kernel's checker takes the program on a socket of a group, and refuses an
    /// instruction it does not know; a socket in no group takes none.
    #[test]
    fn the_kernel_takes_the_program() {
        use socket2::{Domain, Protocol, SockAddr, Socket, Type};
        let prog = qpn_steering(1, &[1, 0xFF_FFFF]).unwrap();
        let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
        s.set_reuse_port(true).unwrap();
        s.bind(&SockAddr::from(std::net::SocketAddr::from((
            [127, 0, 0, 1],
            0,
        ))))
        .unwrap();
        attach_reuseport_cbpf(&s, &prog).unwrap();
        let bad = [insn(0xFFFF, 0, 0, 0)];
        assert!(attach_reuseport_cbpf(&s, &bad).is_err());
        let alone = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
        alone
            .bind(&SockAddr::from(std::net::SocketAddr::from((
                [127, 0, 0, 1],
                0,
            ))))
            .unwrap();
        assert!(attach_reuseport_cbpf(&alone, &prog).is_err());
    }
}
