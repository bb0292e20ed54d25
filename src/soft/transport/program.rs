//! The classic BPF program that steers a reuseport group's datagrams by their destination QP
//! ([`UdpTransport::bind_steered`](super::UdpTransport::bind_steered)), for either
//! [`Framing`] of the underlay.
//!
//! The kernel runs it on every datagram it delivers to the group, the UDP header already pulled
//! (`lookup_reuseport` hands `sizeof(struct udphdr)` to `run_bpf_filter`): offset 0 is the
//! first byte of the UDP payload. The program's return value is the socket's index; an index
//! not below the group's size falls back to the hash, and a load past the datagram's end ends
//! the program with 0 (socket 0). It computes what [`Framing::owner`] does, which the provider
//! checks again on every datagram it receives.

use crate::wire::Framing;

/// The most QPNs [`qpn_steering`] can send to socket 0 (each is one compare instruction,
/// whose jumps count instructions in a byte).
pub(crate) const MAX_TO_FIRST: usize = 16;

/// `BPF_LD | BPF_W | BPF_ABS`: `A` = the big-endian 32-bit word at offset `k`.
const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
/// `BPF_LD | BPF_B | BPF_ABS`: `A` = the byte at offset `k`.
const LD_B_ABS: u16 = (libc::BPF_LD | libc::BPF_B | libc::BPF_ABS) as u16;
/// `BPF_LD | BPF_W | BPF_IND`: `A` = the big-endian 32-bit word at offset `X + k`.
const LD_W_IND: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_IND) as u16;
/// `BPF_LDX | BPF_W | BPF_IMM`: `X = k`.
const LDX_IMM: u16 = (libc::BPF_LDX | libc::BPF_W | libc::BPF_IMM) as u16;
/// `BPF_ALU | BPF_AND | BPF_K`: `A &= k`.
const AND_K: u16 = (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16;
/// `BPF_JMP | BPF_JEQ | BPF_K`: `pc += (A == k) ? jt : jf`.
const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
/// `BPF_RET | BPF_A`: return `A`.
const RET_A: u16 = (libc::BPF_RET | libc::BPF_A) as u16;
/// `BPF_RET | BPF_K`: return `k`.
const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

/// The destination QP's bits of the BTH word at [`Framing::DEST_QP_WORD`].
const QPN_MASK: u32 = 0x00FF_FFFF;

const fn insn(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// A jump to `ret #0` at `first` from the instruction at `at`, if it fits a byte.
fn to_first(first: usize, at: usize) -> Option<u8> {
    u8::try_from(first.checked_sub(at + 1)?).ok()
}

/// A program that picks a group's socket by the destination QP of a datagram framed as
/// `framing` says: socket 0 for each QPN of `to_first` (at most [`MAX_TO_FIRST`] of them; more
/// are `None`) and for a datagram that names no QP, else socket `dest_qpn & mask`.
///
/// ```text
///     ld [4]                           (Bth: the BTH is the payload)
///
///     ldb [0]; and #0xf; jeq #0, +0, first       (Lrh: LVer 0, else no IB packet)
///     ldb [1]; and #3; ldx #8                    (the LNH; the BTH after the LRH ...)
///     jeq #2, load, +0; jeq #3, +0, first        (... for IBA local, or IBA global:)
///     ldx #48                                    (after the LRH and the GRH)
/// load:
///     ld [x + 4]
///
///     and #0xffffff
///     jeq #to_first[i], first          (for each i)
///     and #mask; ret a
/// first:
///     ret #0
/// ```
pub(crate) fn qpn_steering(
    framing: Framing,
    mask: u32,
    to_first_qpns: &[u32],
) -> Option<Vec<libc::sock_filter>> {
    if to_first_qpns.len() > MAX_TO_FIRST {
        return None;
    }
    let word = Framing::DEST_QP_WORD as u32;
    // The load of the destination QP's word, and the framing's checks before it (their jumps
    // to `first` patched once its place is known).
    let head: Vec<(libc::sock_filter, bool)> = match framing {
        Framing::Bth => vec![(insn(LD_W_ABS, 0, 0, word), false)],
        Framing::Lrh => {
            let lrh = crate::wire::lrh::LRH_LEN as u32;
            let grh = crate::wire::ib::IB_GRH_LEN as u32;
            vec![
                (insn(LD_B_ABS, 0, 0, 0), false),
                (insn(AND_K, 0, 0, 0x0F), false),
                (insn(JEQ_K, 0, 0, 0), true),
                (insn(LD_B_ABS, 0, 0, 1), false),
                (insn(AND_K, 0, 0, 0b11), false),
                (insn(LDX_IMM, 0, 0, lrh), false),
                // IBA local: straight to the load, past the next two.
                (insn(JEQ_K, 2, 0, 2), false),
                (insn(JEQ_K, 0, 0, 3), true),
                (insn(LDX_IMM, 0, 0, lrh + grh), false),
                (insn(LD_W_IND, 0, 0, word), false),
            ]
        }
    };
    let m = to_first_qpns.len();
    // After the head: `and`, the compares, `and`, `ret a`; then `ret #0`.
    let first = head.len() + 1 + m + 2;
    let mut prog = Vec::with_capacity(first + 1);
    for (i, (mut ins, jumps_to_first)) in head.into_iter().enumerate() {
        if jumps_to_first {
            ins.jf = to_first(first, i)?;
        }
        prog.push(ins);
    }
    prog.push(insn(AND_K, 0, 0, QPN_MASK));
    for &qpn in to_first_qpns {
        let jt = to_first(first, prog.len())?;
        prog.push(insn(JEQ_K, jt, 0, qpn & QPN_MASK));
    }
    prog.push(insn(AND_K, 0, 0, mask));
    prog.push(insn(RET_A, 0, 0, 0));
    prog.push(insn(RET_K, 0, 0, 0));
    debug_assert_eq!(prog.len(), first + 1);
    Some(prog)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{QpNum, WorkerCount, CONTROL_QPNS};

    /// Runs a program of the instructions [`qpn_steering`] uses on `pkt`, as the kernel does:
    /// a load past the end ends it with 0. `None`: an instruction it does not know, or no
    /// return within the program's length.
    fn run(prog: &[libc::sock_filter], pkt: &[u8]) -> Option<u32> {
        let (mut a, mut x) = (0u32, 0u32);
        let mut pc = 0usize;
        let word = |at: usize| {
            pkt.get(at..at + 4)
                .map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
        };
        for _ in 0..prog.len() {
            let i = prog.get(pc)?;
            pc += 1;
            match i.code {
                LD_W_ABS => match word(i.k as usize) {
                    Some(w) => a = w,
                    None => return Some(0),
                },
                LD_W_IND => match word((x + i.k) as usize) {
                    Some(w) => a = w,
                    None => return Some(0),
                },
                LD_B_ABS => match pkt.get(i.k as usize) {
                    Some(&b) => a = u32::from(b),
                    None => return Some(0),
                },
                LDX_IMM => x = i.k,
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

    /// `bth(qpn)` behind an LRH of `lnh` (and a GRH where it says one follows).
    fn ib(lnh: u8, qpn: u32) -> Vec<u8> {
        let mut d = vec![0x70, 0x30 | lnh, 0, 5, 0, 9, 0, 7];
        if lnh == 3 {
            d.extend_from_slice(&[0x60; 40]);
        }
        d.extend_from_slice(&bth(qpn));
        d
    }

    #[test]
    fn the_program_picks_the_low_bits_and_sends_the_listed_qpns_first() {
        for count in [1u32, 2, 4, 8, 64] {
            let prog = qpn_steering(Framing::Bth, count - 1, &[1, 0xFF_FFFF]).unwrap();
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
        let none = qpn_steering(Framing::Bth, 3, &[]).unwrap();
        assert_eq!(run(&none, &bth(1)), Some(1));
        assert!(qpn_steering(Framing::Bth, 3, &[7; MAX_TO_FIRST]).is_some());
        assert!(qpn_steering(Framing::Bth, 3, &[7; MAX_TO_FIRST + 1]).is_none());
        let full = qpn_steering(Framing::Bth, 3, &[7; MAX_TO_FIRST]).unwrap();
        assert_eq!(run(&full, &bth(7)), Some(0));
        assert_eq!(run(&full, &bth(6)), Some(2));
        let full = qpn_steering(Framing::Lrh, 3, &[7; MAX_TO_FIRST]).unwrap();
        assert_eq!(run(&full, &ib(2, 7)), Some(0));
        assert_eq!(run(&full, &ib(3, 6)), Some(2));
    }

    /// On the InfiniBand link the program finds the BTH after the LRH, or after the LRH and
    /// the GRH, and sends what is no IB packet with a BTH (a beacon, a raw LNH, a datagram
    /// too short) to socket 0: exactly what [`Framing::owner`] computes.
    #[test]
    fn the_program_reads_past_the_lrh_as_the_framing_does() {
        let control = CONTROL_QPNS.map(QpNum::get);
        for count in [2u32, 4, 64] {
            let workers = WorkerCount::new(count).unwrap();
            let prog = qpn_steering(Framing::Lrh, count - 1, &control).unwrap();
            let mut cases: Vec<Vec<u8>> = Vec::new();
            for qpn in (0..300).chain([0xFF_FFFE, 0xFF_FFFF, 0x12_3457]) {
                cases.push(ib(2, qpn));
                cases.push(ib(3, qpn));
            }
            let mut beacon = ib(2, 5);
            beacon[..4].copy_from_slice(b"IBsl");
            cases.push(beacon);
            cases.push(ib(0, 5));
            cases.push(ib(1, 5));
            cases.push(ib(2, 5)[..15].to_vec());
            cases.push(ib(3, 5)[..40].to_vec());
            cases.push(Vec::new());
            for d in &cases {
                let want = u32::from(Framing::Lrh.owner(workers, d));
                assert_eq!(run(&prog, d), Some(want), "{count}: {d:02x?}");
            }
            assert_eq!(run(&prog, &ib(2, 5)), Some(5 & (count - 1)));
            assert_eq!(run(&prog, &ib(3, 6)), Some(6 & (count - 1)));
        }
    }

    /// The kernel's checker takes both programs on a socket of a group.
    #[test]
    fn the_kernel_takes_both_programs() {
        use socket2::{Domain, Protocol, SockAddr, Socket, Type};
        let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
        s.set_reuse_port(true).unwrap();
        s.bind(&SockAddr::from(std::net::SocketAddr::from((
            [127, 0, 0, 1],
            0,
        ))))
        .unwrap();
        for framing in [Framing::Bth, Framing::Lrh] {
            let prog = qpn_steering(framing, 1, &[1, 0xFF_FFFF]).unwrap();
            crate::sys::reuseport::attach_reuseport_cbpf(&s, &prog).unwrap();
        }
    }
}
