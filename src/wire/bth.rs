//! The Base Transport Header (BTH) and the opcode table. PSN arithmetic is [`Psn`](super::Psn)'s.
//!
//! Layout (12 bytes, big-endian; `rxe_hdr.h` `struct rxe_bth`):
//!
//! ```text
//!  byte 0     1               2..=3   4                5..=7    8          9..=11
//! +--------+----------------+-------+----------------+--------+----------+--------+
//! | OpCode | SE M Pad TVer  | P_Key | FECN BECN rsv6 | DestQP | A  rsv7  |  PSN   |
//! +--------+----------------+-------+----------------+--------+----------+--------+
//!            1  1  2   4                1    1    6     24      1    7      24   bits
//! ```

use core::fmt;

use super::field::emit_head;
use super::{Result, WireError, DEFAULT_PKEY};

/// Mask of the 24-bit Packet Sequence Number (`BTH_PSN_MASK`).
pub const PSN_MASK: u32 = 0x00FF_FFFF;

/// Mask of a 24-bit queue pair number (`BTH_QPN_MASK`).
pub const QPN_MASK: u32 = 0x00FF_FFFF;

/// The transport service, from the top three bits of an opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Transport {
    /// `000`: Reliable Connection.
    Rc,
    /// `001`: Unreliable Connection.
    Uc,
    /// `010`: Reliable Datagram.
    Rd,
    /// `011`: Unreliable Datagram.
    Ud,
    /// `100`: Congestion Notification Packet.
    Cnp,
    /// `101`: Extended Reliable Connection.
    Xrc,
    /// `110` and `111`: manufacturer specific.
    Vendor,
}

/// A BTH opcode: transport in bits 7:5, operation in bits 4:0.
///
/// Any byte is representable; [`is_known`](Self::is_known) says whether it is one of the
/// opcodes described below (values from Linux `include/rdma/ib_pack.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u8);

// Opcode property flags.
const FIRST: u16 = 1 << 0;
const MIDDLE: u16 = 1 << 1;
const LAST: u16 = 1 << 2;
const ONLY: u16 = 1 << 3;
const SEND: u16 = 1 << 4;
const IMM: u16 = 1 << 5;
const AETH: u16 = 1 << 6;
const DETH: u16 = 1 << 7;
const RETH: u16 = 1 << 8;
/// No payload may follow the headers.
const NO_PAYLOAD: u16 = 1 << 9;
/// Carries a header with no representation in `RocePacket` (AtomicETH, AtomicAckETH, IETH,
/// FETH).
const UNSUPPORTED: u16 = 1 << 10;
/// A response from the responder to the requester (read responses and ACKs).
const RESPONSE: u16 = 1 << 11;

/// Static properties of a known opcode.
#[derive(Clone, Copy)]
struct Info {
    name: &'static str,
    /// Bytes of extension headers after the BTH.
    ext_len: u8,
    flags: u16,
}

const fn info(name: &'static str, ext_len: u8, flags: u16) -> Option<Info> {
    Some(Info {
        name,
        ext_len,
        flags,
    })
}

impl Opcode {
    /// RC SEND First.
    pub const RC_SEND_FIRST: Self = Self(0x00);
    /// RC SEND Middle.
    pub const RC_SEND_MIDDLE: Self = Self(0x01);
    /// RC SEND Last.
    pub const RC_SEND_LAST: Self = Self(0x02);
    /// RC SEND Last with Immediate (ImmDt).
    pub const RC_SEND_LAST_WITH_IMMEDIATE: Self = Self(0x03);
    /// RC SEND Only.
    pub const RC_SEND_ONLY: Self = Self(0x04);
    /// RC SEND Only with Immediate (ImmDt).
    pub const RC_SEND_ONLY_WITH_IMMEDIATE: Self = Self(0x05);
    /// RC RDMA WRITE First (RETH).
    pub const RC_RDMA_WRITE_FIRST: Self = Self(0x06);
    /// RC RDMA WRITE Middle.
    pub const RC_RDMA_WRITE_MIDDLE: Self = Self(0x07);
    /// RC RDMA WRITE Last.
    pub const RC_RDMA_WRITE_LAST: Self = Self(0x08);
    /// RC RDMA WRITE Last with Immediate (ImmDt).
    pub const RC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Self = Self(0x09);
    /// RC RDMA WRITE Only (RETH).
    pub const RC_RDMA_WRITE_ONLY: Self = Self(0x0A);
    /// RC RDMA WRITE Only with Immediate (RETH, ImmDt).
    pub const RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Self = Self(0x0B);
    /// RC RDMA READ Request (RETH).
    pub const RC_RDMA_READ_REQUEST: Self = Self(0x0C);
    /// RC RDMA READ Response First (AETH).
    pub const RC_RDMA_READ_RESPONSE_FIRST: Self = Self(0x0D);
    /// RC RDMA READ Response Middle.
    pub const RC_RDMA_READ_RESPONSE_MIDDLE: Self = Self(0x0E);
    /// RC RDMA READ Response Last (AETH).
    pub const RC_RDMA_READ_RESPONSE_LAST: Self = Self(0x0F);
    /// RC RDMA READ Response Only (AETH).
    pub const RC_RDMA_READ_RESPONSE_ONLY: Self = Self(0x10);
    /// RC Acknowledge (AETH): ACK, RNR NAK or NAK.
    pub const RC_ACKNOWLEDGE: Self = Self(0x11);
    /// RC Atomic Acknowledge (AETH, AtomicAckETH).
    pub const RC_ATOMIC_ACKNOWLEDGE: Self = Self(0x12);
    /// RC CmpSwap (AtomicETH).
    pub const RC_COMPARE_SWAP: Self = Self(0x13);
    /// RC FetchAdd (AtomicETH).
    pub const RC_FETCH_ADD: Self = Self(0x14);
    /// RC SEND Last with Invalidate (IETH).
    pub const RC_SEND_LAST_WITH_INVALIDATE: Self = Self(0x16);
    /// RC SEND Only with Invalidate (IETH).
    pub const RC_SEND_ONLY_WITH_INVALIDATE: Self = Self(0x17);
    /// RC FLUSH (FETH, RETH; newer kernels).
    pub const RC_FLUSH: Self = Self(0x1C);
    /// RC ATOMIC WRITE (RETH, 8-byte payload; newer kernels).
    pub const RC_ATOMIC_WRITE: Self = Self(0x1D);

    /// UC SEND First.
    pub const UC_SEND_FIRST: Self = Self(0x20);
    /// UC SEND Middle.
    pub const UC_SEND_MIDDLE: Self = Self(0x21);
    /// UC SEND Last.
    pub const UC_SEND_LAST: Self = Self(0x22);
    /// UC SEND Last with Immediate (ImmDt).
    pub const UC_SEND_LAST_WITH_IMMEDIATE: Self = Self(0x23);
    /// UC SEND Only.
    pub const UC_SEND_ONLY: Self = Self(0x24);
    /// UC SEND Only with Immediate (ImmDt).
    pub const UC_SEND_ONLY_WITH_IMMEDIATE: Self = Self(0x25);
    /// UC RDMA WRITE First (RETH).
    pub const UC_RDMA_WRITE_FIRST: Self = Self(0x26);
    /// UC RDMA WRITE Middle.
    pub const UC_RDMA_WRITE_MIDDLE: Self = Self(0x27);
    /// UC RDMA WRITE Last.
    pub const UC_RDMA_WRITE_LAST: Self = Self(0x28);
    /// UC RDMA WRITE Last with Immediate (ImmDt).
    pub const UC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Self = Self(0x29);
    /// UC RDMA WRITE Only (RETH).
    pub const UC_RDMA_WRITE_ONLY: Self = Self(0x2A);
    /// UC RDMA WRITE Only with Immediate (RETH, ImmDt).
    pub const UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Self = Self(0x2B);

    /// UD SEND Only (DETH). Carries CM MADs to QP1.
    pub const UD_SEND_ONLY: Self = Self(0x64);
    /// UD SEND Only with Immediate (DETH, ImmDt).
    pub const UD_SEND_ONLY_WITH_IMMEDIATE: Self = Self(0x65);

    /// Congestion Notification Packet (16 reserved bytes after the BTH).
    pub const CNP: Self = Self(0x81);

    /// Every opcode for which [`is_known`](Self::is_known) is true, in numeric order.
    pub const ALL_KNOWN: [Self; 40] = [
        Self::RC_SEND_FIRST,
        Self::RC_SEND_MIDDLE,
        Self::RC_SEND_LAST,
        Self::RC_SEND_LAST_WITH_IMMEDIATE,
        Self::RC_SEND_ONLY,
        Self::RC_SEND_ONLY_WITH_IMMEDIATE,
        Self::RC_RDMA_WRITE_FIRST,
        Self::RC_RDMA_WRITE_MIDDLE,
        Self::RC_RDMA_WRITE_LAST,
        Self::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
        Self::RC_RDMA_WRITE_ONLY,
        Self::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
        Self::RC_RDMA_READ_REQUEST,
        Self::RC_RDMA_READ_RESPONSE_FIRST,
        Self::RC_RDMA_READ_RESPONSE_MIDDLE,
        Self::RC_RDMA_READ_RESPONSE_LAST,
        Self::RC_RDMA_READ_RESPONSE_ONLY,
        Self::RC_ACKNOWLEDGE,
        Self::RC_ATOMIC_ACKNOWLEDGE,
        Self::RC_COMPARE_SWAP,
        Self::RC_FETCH_ADD,
        Self::RC_SEND_LAST_WITH_INVALIDATE,
        Self::RC_SEND_ONLY_WITH_INVALIDATE,
        Self::RC_FLUSH,
        Self::RC_ATOMIC_WRITE,
        Self::UC_SEND_FIRST,
        Self::UC_SEND_MIDDLE,
        Self::UC_SEND_LAST,
        Self::UC_SEND_LAST_WITH_IMMEDIATE,
        Self::UC_SEND_ONLY,
        Self::UC_SEND_ONLY_WITH_IMMEDIATE,
        Self::UC_RDMA_WRITE_FIRST,
        Self::UC_RDMA_WRITE_MIDDLE,
        Self::UC_RDMA_WRITE_LAST,
        Self::UC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
        Self::UC_RDMA_WRITE_ONLY,
        Self::UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
        Self::UD_SEND_ONLY,
        Self::UD_SEND_ONLY_WITH_IMMEDIATE,
        Self::CNP,
    ];

    /// The opcode table: header sequences and lengths from `rxe_opcode.c`.
    const fn info(self) -> Option<Info> {
        match self.0 {
            0x00 => info("RC_SEND_FIRST", 0, FIRST | SEND),
            0x01 => info("RC_SEND_MIDDLE", 0, MIDDLE | SEND),
            0x02 => info("RC_SEND_LAST", 0, LAST | SEND),
            0x03 => info("RC_SEND_LAST_WITH_IMMEDIATE", 4, LAST | SEND | IMM),
            0x04 => info("RC_SEND_ONLY", 0, ONLY | SEND),
            0x05 => info("RC_SEND_ONLY_WITH_IMMEDIATE", 4, ONLY | SEND | IMM),
            0x06 => info("RC_RDMA_WRITE_FIRST", 16, FIRST | RETH),
            0x07 => info("RC_RDMA_WRITE_MIDDLE", 0, MIDDLE),
            0x08 => info("RC_RDMA_WRITE_LAST", 0, LAST),
            0x09 => info("RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", 4, LAST | IMM),
            0x0A => info("RC_RDMA_WRITE_ONLY", 16, ONLY | RETH),
            0x0B => info("RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", 20, ONLY | RETH | IMM),
            0x0C => info("RC_RDMA_READ_REQUEST", 16, RETH | NO_PAYLOAD),
            0x0D => info("RC_RDMA_READ_RESPONSE_FIRST", 4, FIRST | AETH | RESPONSE),
            0x0E => info("RC_RDMA_READ_RESPONSE_MIDDLE", 0, MIDDLE | RESPONSE),
            0x0F => info("RC_RDMA_READ_RESPONSE_LAST", 4, LAST | AETH | RESPONSE),
            0x10 => info("RC_RDMA_READ_RESPONSE_ONLY", 4, ONLY | AETH | RESPONSE),
            0x11 => info("RC_ACKNOWLEDGE", 4, AETH | NO_PAYLOAD | RESPONSE),
            0x12 => info(
                "RC_ATOMIC_ACKNOWLEDGE",
                12,
                AETH | NO_PAYLOAD | RESPONSE | UNSUPPORTED,
            ),
            0x13 => info("RC_COMPARE_SWAP", 28, NO_PAYLOAD | UNSUPPORTED),
            0x14 => info("RC_FETCH_ADD", 28, NO_PAYLOAD | UNSUPPORTED),
            0x16 => info("RC_SEND_LAST_WITH_INVALIDATE", 4, LAST | SEND | UNSUPPORTED),
            0x17 => info("RC_SEND_ONLY_WITH_INVALIDATE", 4, ONLY | SEND | UNSUPPORTED),
            0x1C => info("RC_FLUSH", 20, RETH | NO_PAYLOAD | UNSUPPORTED),
            0x1D => info("RC_ATOMIC_WRITE", 16, RETH),
            0x20 => info("UC_SEND_FIRST", 0, FIRST | SEND),
            0x21 => info("UC_SEND_MIDDLE", 0, MIDDLE | SEND),
            0x22 => info("UC_SEND_LAST", 0, LAST | SEND),
            0x23 => info("UC_SEND_LAST_WITH_IMMEDIATE", 4, LAST | SEND | IMM),
            0x24 => info("UC_SEND_ONLY", 0, ONLY | SEND),
            0x25 => info("UC_SEND_ONLY_WITH_IMMEDIATE", 4, ONLY | SEND | IMM),
            0x26 => info("UC_RDMA_WRITE_FIRST", 16, FIRST | RETH),
            0x27 => info("UC_RDMA_WRITE_MIDDLE", 0, MIDDLE),
            0x28 => info("UC_RDMA_WRITE_LAST", 0, LAST),
            0x29 => info("UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", 4, LAST | IMM),
            0x2A => info("UC_RDMA_WRITE_ONLY", 16, ONLY | RETH),
            0x2B => info("UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", 20, ONLY | RETH | IMM),
            0x64 => info("UD_SEND_ONLY", 8, ONLY | SEND | DETH),
            0x65 => info("UD_SEND_ONLY_WITH_IMMEDIATE", 12, ONLY | SEND | DETH | IMM),
            0x81 => info("CNP", 16, NO_PAYLOAD),
            _ => None,
        }
    }

    const fn flag(self, f: u16) -> bool {
        match self.info() {
            Some(i) => i.flags & f != 0,
            None => false,
        }
    }

    /// Whether this is one of the opcodes listed as associated constants.
    #[must_use]
    pub const fn is_known(self) -> bool {
        self.info().is_some()
    }

    /// Whether [`RocePacket`](super::RocePacket) can represent packets with this opcode: known,
    /// and without AtomicETH, AtomicAckETH, IETH or FETH.
    #[must_use]
    pub const fn is_supported(self) -> bool {
        self.is_known() && !self.flag(UNSUPPORTED)
    }

    /// The transport service (bits 7:5).
    #[must_use]
    pub const fn transport(self) -> Transport {
        match self.0 >> 5 {
            0b000 => Transport::Rc,
            0b001 => Transport::Uc,
            0b010 => Transport::Rd,
            0b011 => Transport::Ud,
            0b100 => Transport::Cnp,
            0b101 => Transport::Xrc,
            _ => Transport::Vendor,
        }
    }

    /// First packet of a multi-packet SEND, RDMA WRITE or RDMA READ response.
    #[must_use]
    pub const fn is_first(self) -> bool {
        self.flag(FIRST)
    }

    /// Middle packet of a multi-packet SEND, RDMA WRITE or RDMA READ response.
    #[must_use]
    pub const fn is_middle(self) -> bool {
        self.flag(MIDDLE)
    }

    /// Last packet of a multi-packet SEND, RDMA WRITE or RDMA READ response.
    #[must_use]
    pub const fn is_last(self) -> bool {
        self.flag(LAST)
    }

    /// Single-packet SEND, RDMA WRITE or RDMA READ response (all UD SENDs).
    #[must_use]
    pub const fn is_only(self) -> bool {
        self.flag(ONLY)
    }

    /// Any SEND packet (RC, UC or UD; with or without immediate or invalidate).
    #[must_use]
    pub const fn is_send(self) -> bool {
        self.flag(SEND)
    }

    /// A packet from the responder: RDMA READ responses and (atomic) acknowledges.
    #[must_use]
    pub const fn is_response(self) -> bool {
        self.flag(RESPONSE)
    }

    /// Carries an ImmDt header.
    #[must_use]
    pub const fn has_immediate(self) -> bool {
        self.flag(IMM)
    }

    /// Carries an AETH header.
    #[must_use]
    pub const fn has_aeth(self) -> bool {
        self.flag(AETH)
    }

    /// Carries a DETH header.
    #[must_use]
    pub const fn has_deth(self) -> bool {
        self.flag(DETH)
    }

    /// Carries a RETH header.
    #[must_use]
    pub const fn has_reth(self) -> bool {
        self.flag(RETH)
    }

    /// Whether a payload may follow the headers (false for ACKs, atomics, RDMA READ requests,
    /// FLUSH and CNPs; false for unknown opcodes).
    #[must_use]
    pub const fn has_payload(self) -> bool {
        self.is_known() && !self.flag(NO_PAYLOAD)
    }

    /// Bytes of extension headers between the BTH and the payload; 0 for unknown opcodes.
    #[must_use]
    pub const fn ext_header_len(self) -> usize {
        match self.info() {
            Some(i) => i.ext_len as usize,
            None => 0,
        }
    }

    /// The `ib_pack.h` name without the `IB_OPCODE_` prefix, e.g. `"RC_SEND_ONLY"`;
    /// `"UNKNOWN"` for unknown opcodes.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self.info() {
            Some(i) => i.name,
            None => "UNKNOWN",
        }
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({:#04x})", self.name(), self.0)
    }
}

/// The Base Transport Header, decoded.
///
/// Reserved bits (`resv6a`, `resv7`) are dropped on parse and written as zero on emit.
/// [`dest_qp`](Self::dest_qp) and [`psn`](Self::psn) are 24-bit; [`emit`](Self::emit) masks
/// them (and [`pad_count`](Self::pad_count) to 2 bits, [`tver`](Self::tver) to 4 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bth {
    /// OpCode (byte 0).
    pub opcode: Opcode,
    /// SE: solicited event.
    pub solicited: bool,
    /// M: migration request; RoCE senders use 0.
    pub mig_req: bool,
    /// PadCnt: bytes of zero padding after the payload (0..=3).
    pub pad_count: u8,
    /// TVer: transport header version; must be 0.
    pub tver: u8,
    /// P_Key: partition key; RoCE uses [`DEFAULT_PKEY`].
    pub pkey: u16,
    /// FECN: forward explicit congestion notification. Masked out of the ICRC.
    pub fecn: bool,
    /// BECN: backward explicit congestion notification. Masked out of the ICRC.
    pub becn: bool,
    /// DestQP (24 bits).
    pub dest_qp: u32,
    /// A: acknowledge request.
    pub ack_req: bool,
    /// PSN (24 bits).
    pub psn: u32,
}

impl Bth {
    /// Size of the BTH on the wire.
    pub const HEADER_LEN: usize = 12;

    /// A header with the given opcode, destination QP and PSN, P_Key [`DEFAULT_PKEY`], and
    /// every flag, count and version zero.
    #[must_use]
    pub const fn new(opcode: Opcode, dest_qp: u32, psn: u32) -> Self {
        Self {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp: dest_qp & QPN_MASK,
            ack_req: false,
            psn: psn & PSN_MASK,
        }
    }

    /// Decodes the first [`HEADER_LEN`](Self::HEADER_LEN) bytes of `buf`.
    ///
    /// Only the length is checked: any opcode and any TVer are accepted, so callers can count
    /// them (see [`check_tver`](Self::check_tver), [`Opcode::is_known`]).
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is shorter than 12 bytes.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        buf.first_chunk::<{ Self::HEADER_LEN }>()
            .map(Self::from_bytes)
            .ok_or(WireError::Truncated)
    }

    /// Decodes a BTH from exactly 12 bytes. Infallible.
    #[must_use]
    pub const fn from_bytes(b: &[u8; Self::HEADER_LEN]) -> Self {
        Self {
            opcode: Opcode(b[0]),
            solicited: b[1] & 0x80 != 0,
            mig_req: b[1] & 0x40 != 0,
            pad_count: (b[1] >> 4) & 0x3,
            tver: b[1] & 0x0F,
            pkey: u16::from_be_bytes([b[2], b[3]]),
            fecn: b[4] & 0x80 != 0,
            becn: b[4] & 0x40 != 0,
            dest_qp: u32::from_be_bytes([0, b[5], b[6], b[7]]),
            ack_req: b[8] & 0x80 != 0,
            psn: u32::from_be_bytes([0, b[9], b[10], b[11]]),
        }
    }

    /// Encodes the header; out-of-range fields are masked to their widths.
    #[must_use]
    pub const fn to_bytes(&self) -> [u8; Self::HEADER_LEN] {
        let qp = (self.dest_qp & QPN_MASK).to_be_bytes();
        let psn = (self.psn & PSN_MASK).to_be_bytes();
        let pkey = self.pkey.to_be_bytes();
        [
            self.opcode.0,
            (self.solicited as u8) << 7
                | (self.mig_req as u8) << 6
                | (self.pad_count & 0x3) << 4
                | (self.tver & 0x0F),
            pkey[0],
            pkey[1],
            (self.fecn as u8) << 7 | (self.becn as u8) << 6,
            qp[1],
            qp[2],
            qp[3],
            (self.ack_req as u8) << 7,
            psn[1],
            psn[2],
            psn[3],
        ]
    }

    /// Writes the header into the first [`HEADER_LEN`](Self::HEADER_LEN) bytes of `buf`.
    ///
    /// # Panics
    ///
    /// If `buf` is shorter than 12 bytes (a caller bug, not a wire condition).
    pub fn emit(&self, buf: &mut [u8]) {
        emit_head(buf, &self.to_bytes());
    }

    /// # Errors
    ///
    /// [`WireError::BadTver`] unless [`tver`](Self::tver) is 0, the only version defined.
    pub const fn check_tver(&self) -> Result<()> {
        if self.tver == 0 {
            Ok(())
        } else {
            Err(WireError::BadTver(self.tver))
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn all_known_is_complete_and_consistent() {
        let listed: std::collections::BTreeSet<u8> =
            Opcode::ALL_KNOWN.iter().map(|o| o.0).collect();
        let known: std::collections::BTreeSet<u8> =
            (0..=255u8).filter(|&b| Opcode(b).is_known()).collect();
        assert_eq!(listed, known);
        assert_eq!(
            listed.len(),
            Opcode::ALL_KNOWN.len(),
            "duplicates in ALL_KNOWN"
        );
        for op in Opcode::ALL_KNOWN {
            assert_ne!(op.name(), "UNKNOWN");
            // Header length = sum of the headers the flags announce, for supported opcodes.
            if op.is_supported() && op != Opcode::CNP {
                let expect = usize::from(op.has_reth()) * 16
                    + usize::from(op.has_aeth()) * 4
                    + usize::from(op.has_deth()) * 8
                    + usize::from(op.has_immediate()) * 4;
                assert_eq!(op.ext_header_len(), expect, "{op}");
            }
            let segs = [op.is_first(), op.is_middle(), op.is_last(), op.is_only()];
            assert!(segs.iter().filter(|&&s| s).count() <= 1, "{op}");
        }
    }

    #[test]
    fn spec_header_lengths() {
        // §1.3 "Hdr len (BTH…)" column.
        let table: &[(Opcode, usize)] = &[
            (Opcode::RC_SEND_FIRST, 12),
            (Opcode::RC_SEND_LAST_WITH_IMMEDIATE, 16),
            (Opcode::RC_RDMA_WRITE_FIRST, 28),
            (Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, 32),
            (Opcode::RC_RDMA_READ_REQUEST, 28),
            (Opcode::RC_RDMA_READ_RESPONSE_FIRST, 16),
            (Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, 12),
            (Opcode::RC_ACKNOWLEDGE, 16),
            (Opcode::RC_ATOMIC_ACKNOWLEDGE, 24),
            (Opcode::RC_COMPARE_SWAP, 40),
            (Opcode::RC_FETCH_ADD, 40),
            (Opcode::RC_SEND_ONLY_WITH_INVALIDATE, 16),
            (Opcode::UD_SEND_ONLY, 20),
            (Opcode::UD_SEND_ONLY_WITH_IMMEDIATE, 24),
        ];
        for &(op, len) in table {
            assert_eq!(Bth::HEADER_LEN + op.ext_header_len(), len, "{op}");
        }
    }

    #[test]
    fn opcode_properties() {
        assert_eq!(Opcode::RC_ACKNOWLEDGE.0, 0x11);
        assert_eq!(Opcode::RC_SEND_ONLY.transport(), Transport::Rc);
        assert_eq!(Opcode::UC_SEND_ONLY.transport(), Transport::Uc);
        assert_eq!(Opcode::UD_SEND_ONLY.transport(), Transport::Ud);
        assert_eq!(Opcode::CNP.transport(), Transport::Cnp);
        assert_eq!(Opcode(0x40).transport(), Transport::Rd);
        assert_eq!(Opcode(0xA0).transport(), Transport::Xrc);
        assert_eq!(Opcode(0xE0).transport(), Transport::Vendor);
        assert!(!Opcode(0x15).is_known());
        assert!(!Opcode(0x40).is_known());
        assert_eq!(Opcode(0x15).ext_header_len(), 0);
        assert_eq!(Opcode(0x15).name(), "UNKNOWN");
        assert!(Opcode::UD_SEND_ONLY.is_only() && Opcode::UD_SEND_ONLY.is_send());
        assert!(Opcode::RC_SEND_LAST_WITH_IMMEDIATE.has_immediate());
        assert!(Opcode::RC_RDMA_READ_RESPONSE_ONLY.has_aeth());
        assert!(!Opcode::RC_RDMA_READ_RESPONSE_MIDDLE.has_aeth());
        assert!(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE.is_response());
        assert!(!Opcode::RC_ACKNOWLEDGE.has_payload());
        assert!(!Opcode::RC_COMPARE_SWAP.is_supported());
        assert!(Opcode::RC_COMPARE_SWAP.is_known());
        assert_eq!(
            Opcode::RC_SEND_ONLY.to_string(),
            "RC_SEND_ONLY(0x04)".to_string()
        );
    }

    #[test]
    fn bth_known_bytes() {
        // BTH of the §1.7 test vectors: RC SEND_ONLY, pad 3, P_Key 0xFFFF, QP 0x11, A, PSN 1.
        let b = [
            0x04, 0x30, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x00, 0x00, 0x01,
        ];
        let bth = Bth::parse(&b).unwrap();
        let mut expect = Bth::new(Opcode::RC_SEND_ONLY, 0x11, 1);
        expect.pad_count = 3;
        expect.ack_req = true;
        assert_eq!(bth, expect);
        assert_eq!(bth.to_bytes(), b);
        assert_eq!(bth.check_tver(), Ok(()));
    }

    #[test]
    fn bth_truncated_and_tver() {
        for n in 0..Bth::HEADER_LEN {
            assert_eq!(Bth::parse(&[0u8; 12][..n]), Err(WireError::Truncated));
        }
        let mut b = [0u8; 13];
        b[1] = 0x05;
        let bth = Bth::parse(&b).unwrap();
        assert_eq!(bth.tver, 5);
        assert_eq!(bth.check_tver(), Err(WireError::BadTver(5)));
    }

    #[test]
    fn bth_masks_24_bit_fields_and_reserved() {
        let mut bth = Bth::new(Opcode::RC_SEND_ONLY, 0, 0);
        bth.dest_qp = 0xAB12_3456;
        bth.psn = 0xFFFF_FFFF;
        bth.pad_count = 0xFF;
        bth.tver = 0xF3;
        let b = bth.to_bytes();
        let back = Bth::from_bytes(&b);
        assert_eq!(back.dest_qp, 0x12_3456);
        assert_eq!(back.psn, 0xFF_FFFF);
        assert_eq!(back.pad_count, 3);
        assert_eq!(back.tver, 3);
        // Reserved bits are ignored on parse and zero on emit.
        let mut raw = [0u8; 12];
        raw[4] = 0x3F;
        raw[8] = 0x7F;
        let parsed = Bth::parse(&raw).unwrap();
        assert_eq!(parsed.to_bytes(), [0u8; 12]);
        assert_eq!(Bth::new(Opcode(0), 0x0100_0001, 0x0100_0002).dest_qp, 1);
    }

    #[test]
    #[should_panic(expected = "does not fit")]
    fn bth_emit_short_buffer_panics() {
        Bth::new(Opcode::RC_SEND_ONLY, 1, 1).emit(&mut [0u8; 11]);
    }

    pub(crate) fn arb_bth() -> impl Strategy<Value = Bth> {
        (
            any::<u8>(),
            any::<[bool; 5]>(),
            0u8..4,
            0u8..16,
            any::<u16>(),
            0u32..=QPN_MASK,
            0u32..=PSN_MASK,
        )
            .prop_map(|(op, f, pad_count, tver, pkey, dest_qp, psn)| Bth {
                opcode: Opcode(op),
                solicited: f[0],
                mig_req: f[1],
                pad_count,
                tver,
                pkey,
                fecn: f[2],
                becn: f[3],
                dest_qp,
                ack_req: f[4],
                psn,
            })
    }

    proptest! {
        #[test]
        fn bth_round_trip(bth in arb_bth()) {
            let mut buf = [0u8; 20];
            bth.emit(&mut buf);
            prop_assert_eq!(Bth::parse(&buf)?, bth);
            prop_assert_eq!(&buf[12..], &[0u8; 8]);
        }

        #[test]
        fn bth_parse_emit_is_identity_on_non_reserved_bits(raw in any::<[u8; 12]>()) {
            let bytes = Bth::parse(&raw)?.to_bytes();
            let mut masked = raw;
            masked[4] &= 0xC0;
            masked[8] &= 0x80;
            prop_assert_eq!(bytes, masked);
        }

        #[test]
        fn bth_masks_any_qpn_psn(qp in any::<u32>(), psn in any::<u32>()) {
            let mut bth = Bth::new(Opcode::RC_SEND_ONLY, 0, 0);
            bth.dest_qp = qp;
            bth.psn = psn;
            let back = Bth::from_bytes(&bth.to_bytes());
            prop_assert_eq!(back.dest_qp, qp & QPN_MASK);
            prop_assert_eq!(back.psn, psn & PSN_MASK);
        }

    }
}
