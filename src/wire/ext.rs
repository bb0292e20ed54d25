//! Extension transport headers: RETH, AETH, DETH and ImmDt (`rxe_hdr.h`).
//!
//! | Header | Size | Layout |
//! |---|---|---|
//! | [`Reth`] | 16 | VA (u64), R_Key (u32), DMA length (u32) |
//! | [`Aeth`] | 4 | syndrome (u8), MSN (24 bits) |
//! | [`Deth`] | 8 | Q_Key (u32), reserved (u8), SrcQP (24 bits) |
//! | [`ImmDt`] | 4 | immediate data, opaque |
//!
//! After the BTH they appear in the order RETH, AETH, DETH, ImmDt (no opcode carries both
//! RETH and AETH, or AETH and DETH).

use core::time::Duration;

use super::bth::QPN_MASK;
use super::field::{emit_head, head};
use super::{Result, WireError};

/// Mask of the 24-bit AETH Message Sequence Number.
const MSN_MASK: u32 = 0x00FF_FFFF;

/// RDMA Extended Transport Header (16 bytes): the remote buffer of an RDMA WRITE or READ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Reth {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// DMA length: the length of the whole message, not of this packet.
    pub dma_len: u32,
}

impl Reth {
    /// Size of the RETH on the wire.
    pub const HEADER_LEN: usize = 16;

    /// Decodes the first 16 bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is shorter than 16 bytes.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        head::<{ Self::HEADER_LEN }>(buf)
            .ok_or(WireError::Truncated)
            .map(Self::from_bytes)
    }

    /// Decodes a RETH from exactly 16 bytes.
    #[must_use]
    pub const fn from_bytes(b: &[u8; Self::HEADER_LEN]) -> Self {
        Self {
            va: u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
            rkey: u32::from_be_bytes([b[8], b[9], b[10], b[11]]),
            dma_len: u32::from_be_bytes([b[12], b[13], b[14], b[15]]),
        }
    }

    /// Encodes the header.
    #[must_use]
    pub const fn to_bytes(&self) -> [u8; Self::HEADER_LEN] {
        let v = self.va.to_be_bytes();
        let r = self.rkey.to_be_bytes();
        let l = self.dma_len.to_be_bytes();
        [
            v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], r[0], r[1], r[2], r[3], l[0], l[1],
            l[2], l[3],
        ]
    }

    /// Writes the header into the first 16 bytes of `buf`.
    ///
    /// # Panics
    ///
    /// If `buf` is shorter than 16 bytes.
    pub fn emit(&self, buf: &mut [u8]) {
        emit_head(buf, &self.to_bytes());
    }
}

/// The NAK codes of an AETH syndrome (low five bits when the type is `11`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0: PSN sequence error; the requester retransmits from the NAK's PSN.
    PsnSequenceError,
    /// 1: invalid request.
    InvalidRequest,
    /// 2: remote access error.
    RemoteAccessError,
    /// 3: remote operational error.
    RemoteOperationalError,
    /// 4: invalid RD request.
    InvalidRdRequest,
    /// 5..=31: reserved. Holds the five-bit code; values 0..=4 are decoded as the named
    /// variants, so `Reserved(0..=4)` does not survive a round trip.
    Reserved(u8),
}

impl NakCode {
    /// Decodes the low five bits of `code`.
    #[must_use]
    pub const fn from_code(code: u8) -> Self {
        match code & 0x1F {
            0 => Self::PsnSequenceError,
            1 => Self::InvalidRequest,
            2 => Self::RemoteAccessError,
            3 => Self::RemoteOperationalError,
            4 => Self::InvalidRdRequest,
            c => Self::Reserved(c),
        }
    }

    /// The five-bit code.
    #[must_use]
    pub const fn code(self) -> u8 {
        match self {
            Self::PsnSequenceError => 0,
            Self::InvalidRequest => 1,
            Self::RemoteAccessError => 2,
            Self::RemoteOperationalError => 3,
            Self::InvalidRdRequest => 4,
            Self::Reserved(c) => c & 0x1F,
        }
    }
}

/// The AETH syndrome byte: bit 7 reserved, bits 6:5 type, bits 4:0 value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// Type `00`: ACK with an end-to-end credit count (five bits; `0x1F` = invalid/unlimited,
    /// which rxe always sends).
    Ack {
        /// Credit count (0..=31).
        credits: u8,
    },
    /// Type `01`: receiver not ready; retry after the timer (see [`rnr_timer_duration`]).
    RnrNak {
        /// RNR timer code (0..=31).
        timer: u8,
    },
    /// Type `11`: NAK.
    Nak(NakCode),
}

impl Syndrome {
    /// The ACK rxe sends: credit count `0x1F`, "unlimited" (syndrome byte `0x1F`).
    pub const ACK_UNLIMITED: Self = Self::Ack { credits: 0x1F };

    /// Decodes a syndrome byte.
    ///
    /// # Errors
    ///
    /// [`WireError::BadSyndrome`] if the reserved bit 7 is set or the type is the reserved
    /// `10` (`0x40..=0x5F`). rxe's completer treats both as errors too.
    pub const fn from_byte(b: u8) -> Result<Self> {
        let v = b & 0x1F;
        match b & 0xE0 {
            0x00 => Ok(Self::Ack { credits: v }),
            0x20 => Ok(Self::RnrNak { timer: v }),
            0x60 => Ok(Self::Nak(NakCode::from_code(v))),
            _ => Err(WireError::BadSyndrome(b)),
        }
    }

    /// Encodes the syndrome byte; values are masked to five bits.
    #[must_use]
    pub const fn to_byte(self) -> u8 {
        match self {
            Self::Ack { credits } => credits & 0x1F,
            Self::RnrNak { timer } => 0x20 | (timer & 0x1F),
            Self::Nak(code) => 0x60 | code.code(),
        }
    }
}

/// ACK Extended Transport Header (4 bytes): syndrome and Message Sequence Number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Aeth {
    /// ACK, RNR NAK or NAK.
    pub syndrome: Syndrome,
    /// Message Sequence Number (24 bits; masked on emit).
    pub msn: u32,
}

impl Aeth {
    /// Size of the AETH on the wire.
    pub const HEADER_LEN: usize = 4;

    /// A positive ACK with unlimited credits ([`Syndrome::ACK_UNLIMITED`]).
    #[must_use]
    pub const fn ack(msn: u32) -> Self {
        Self {
            syndrome: Syndrome::ACK_UNLIMITED,
            msn: msn & MSN_MASK,
        }
    }

    /// An RNR NAK carrying `timer` (an RNR timer code, masked to five bits on emit).
    #[must_use]
    pub const fn rnr_nak(timer: u8, msn: u32) -> Self {
        Self {
            syndrome: Syndrome::RnrNak { timer },
            msn: msn & MSN_MASK,
        }
    }

    /// A NAK with the given code.
    #[must_use]
    pub const fn nak(code: NakCode, msn: u32) -> Self {
        Self {
            syndrome: Syndrome::Nak(code),
            msn: msn & MSN_MASK,
        }
    }

    /// Decodes the first 4 bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is shorter than 4 bytes;
    /// [`WireError::BadSyndrome`] as in [`Syndrome::from_byte`].
    pub fn parse(buf: &[u8]) -> Result<Self> {
        Self::from_bytes(head::<{ Self::HEADER_LEN }>(buf).ok_or(WireError::Truncated)?)
    }

    /// Decodes an AETH from exactly 4 bytes.
    ///
    /// # Errors
    ///
    /// [`WireError::BadSyndrome`] as in [`Syndrome::from_byte`].
    pub const fn from_bytes(b: &[u8; Self::HEADER_LEN]) -> Result<Self> {
        match Syndrome::from_byte(b[0]) {
            Ok(syndrome) => Ok(Self {
                syndrome,
                msn: u32::from_be_bytes([0, b[1], b[2], b[3]]),
            }),
            Err(e) => Err(e),
        }
    }

    /// Encodes the header.
    #[must_use]
    pub const fn to_bytes(&self) -> [u8; Self::HEADER_LEN] {
        let m = (self.msn & MSN_MASK).to_be_bytes();
        [self.syndrome.to_byte(), m[1], m[2], m[3]]
    }

    /// Writes the header into the first 4 bytes of `buf`.
    ///
    /// # Panics
    ///
    /// If `buf` is shorter than 4 bytes.
    pub fn emit(&self, buf: &mut [u8]) {
        emit_head(buf, &self.to_bytes());
    }
}

/// RNR NAK timer codes in microseconds, indexed by code (IBTA table 45; rxe `rnrnak_usec[]`
/// with its 61410 µs typo for code 25 corrected to 61440 µs).
const RNR_TIMER_USEC: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// How long an RNR NAK with timer `code` asks the requester to wait.
///
/// Only the low five bits of `code` are used. Code 0 is the longest, 655.36 ms; codes 1..=31
/// grow from 0.01 ms to 491.52 ms.
#[must_use]
// The index is masked to 0..=31 and the table has 32 entries.
#[allow(clippy::indexing_slicing)]
pub const fn rnr_timer_duration(code: u8) -> Duration {
    Duration::from_micros(RNR_TIMER_USEC[(code & 0x1F) as usize] as u64)
}

/// The RNR timer code with the shortest duration that is at least `d`.
///
/// `Duration::ZERO` gives code 1 (0.01 ms). Anything above 491.52 ms gives code 0
/// (655.36 ms), which is also the answer, saturating, for anything longer than that.
#[must_use]
pub fn rnr_timer_code_at_least(d: Duration) -> u8 {
    (1..=31u8)
        .find(|&c| rnr_timer_duration(c) >= d)
        .unwrap_or(0)
}

/// Datagram Extended Transport Header (8 bytes): Q_Key and source QP of a UD packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Deth {
    /// Queue key; [`GSI_QKEY`](super::GSI_QKEY) for QP1.
    pub qkey: u32,
    /// Source QP number (24 bits; masked on emit).
    pub src_qp: u32,
}

impl Deth {
    /// Size of the DETH on the wire.
    pub const HEADER_LEN: usize = 8;

    /// Decodes the first 8 bytes of `buf`. The reserved byte 4 is ignored.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is shorter than 8 bytes.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        head::<{ Self::HEADER_LEN }>(buf)
            .ok_or(WireError::Truncated)
            .map(Self::from_bytes)
    }

    /// Decodes a DETH from exactly 8 bytes.
    #[must_use]
    pub const fn from_bytes(b: &[u8; Self::HEADER_LEN]) -> Self {
        Self {
            qkey: u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            src_qp: u32::from_be_bytes([0, b[5], b[6], b[7]]),
        }
    }

    /// Encodes the header (reserved byte zero).
    #[must_use]
    pub const fn to_bytes(&self) -> [u8; Self::HEADER_LEN] {
        let q = self.qkey.to_be_bytes();
        let s = (self.src_qp & QPN_MASK).to_be_bytes();
        [q[0], q[1], q[2], q[3], 0, s[1], s[2], s[3]]
    }

    /// Writes the header into the first 8 bytes of `buf`.
    ///
    /// # Panics
    ///
    /// If `buf` is shorter than 8 bytes.
    pub fn emit(&self, buf: &mut [u8]) {
        emit_head(buf, &self.to_bytes());
    }
}

/// Immediate data (4 bytes), carried opaquely from the sender's work request to the
/// receiver's completion.
///
/// The value is the big-endian reading of the four wire bytes, so libibverbs' `imm_data`
/// (a `__be32`) corresponds to `ImmDt(u32::from_be(imm_data))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImmDt(pub u32);

impl ImmDt {
    /// Size of the ImmDt header on the wire.
    pub const HEADER_LEN: usize = 4;

    /// Decodes the first 4 bytes of `buf`.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is shorter than 4 bytes.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        head::<{ Self::HEADER_LEN }>(buf)
            .ok_or(WireError::Truncated)
            .map(Self::from_bytes)
    }

    /// Decodes an ImmDt from exactly 4 bytes.
    #[must_use]
    pub const fn from_bytes(b: &[u8; Self::HEADER_LEN]) -> Self {
        Self(u32::from_be_bytes(*b))
    }

    /// Encodes the header.
    #[must_use]
    pub const fn to_bytes(&self) -> [u8; Self::HEADER_LEN] {
        self.0.to_be_bytes()
    }

    /// Writes the header into the first 4 bytes of `buf`.
    ///
    /// # Panics
    ///
    /// If `buf` is shorter than 4 bytes.
    pub fn emit(&self, buf: &mut [u8]) {
        emit_head(buf, &self.to_bytes());
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn syndrome_bytes_from_spec() {
        assert_eq!(Syndrome::ACK_UNLIMITED.to_byte(), 0x1F);
        assert_eq!(Syndrome::RnrNak { timer: 14 }.to_byte(), 0x2E);
        assert_eq!(Syndrome::Nak(NakCode::PsnSequenceError).to_byte(), 0x60);
        assert_eq!(Syndrome::Nak(NakCode::InvalidRequest).to_byte(), 0x61);
        assert_eq!(Syndrome::Nak(NakCode::RemoteAccessError).to_byte(), 0x62);
        assert_eq!(
            Syndrome::Nak(NakCode::RemoteOperationalError).to_byte(),
            0x63
        );
        assert_eq!(Syndrome::Nak(NakCode::InvalidRdRequest).to_byte(), 0x64);
        assert_eq!(Syndrome::from_byte(0x1F), Ok(Syndrome::ACK_UNLIMITED));
        assert_eq!(
            Syndrome::from_byte(0x7F),
            Ok(Syndrome::Nak(NakCode::Reserved(0x1F)))
        );
        for b in 0x40..=0x5F {
            assert_eq!(Syndrome::from_byte(b), Err(WireError::BadSyndrome(b)));
        }
        for b in 0x80..=0xFF {
            assert_eq!(Syndrome::from_byte(b), Err(WireError::BadSyndrome(b)));
        }
    }

    #[test]
    fn syndrome_every_valid_byte_round_trips() {
        for b in 0..=0xFFu8 {
            if let Ok(s) = Syndrome::from_byte(b) {
                assert_eq!(s.to_byte(), b);
            }
        }
    }

    #[test]
    fn aeth_constructors_and_errors() {
        assert_eq!(Aeth::ack(0x0123_4567).to_bytes(), [0x1F, 0x23, 0x45, 0x67]);
        assert_eq!(Aeth::rnr_nak(14, 1).to_bytes(), [0x2E, 0, 0, 1]);
        assert_eq!(
            Aeth::nak(NakCode::PsnSequenceError, 2).to_bytes(),
            [0x60, 0, 0, 2]
        );
        assert_eq!(Aeth::parse(&[0x1F, 0, 0]), Err(WireError::Truncated));
        assert_eq!(
            Aeth::parse(&[0x40, 0, 0, 0]),
            Err(WireError::BadSyndrome(0x40))
        );
    }

    #[test]
    fn rnr_timer_table() {
        let ms = |c| rnr_timer_duration(c).as_secs_f64() * 1e3;
        assert!((ms(0) - 655.36).abs() < 1e-9);
        assert!((ms(1) - 0.01).abs() < 1e-9);
        assert!((ms(14) - 1.28).abs() < 1e-9);
        assert!((ms(25) - 61.44).abs() < 1e-9);
        assert!((ms(31) - 491.52).abs() < 1e-9);
        // Masked to five bits.
        assert_eq!(rnr_timer_duration(0x20 | 14), rnr_timer_duration(14));
        // Codes 1..=31 strictly increase, and code 0 is the largest.
        for c in 1..31 {
            assert!(rnr_timer_duration(c) < rnr_timer_duration(c + 1));
        }
        assert!(rnr_timer_duration(31) < rnr_timer_duration(0));
    }

    #[test]
    fn rnr_timer_code_selection() {
        assert_eq!(rnr_timer_code_at_least(Duration::ZERO), 1);
        assert_eq!(rnr_timer_code_at_least(Duration::from_micros(10)), 1);
        assert_eq!(rnr_timer_code_at_least(Duration::from_micros(11)), 2);
        assert_eq!(rnr_timer_code_at_least(Duration::from_micros(1_280)), 14);
        assert_eq!(rnr_timer_code_at_least(Duration::from_micros(61_000)), 25);
        assert_eq!(rnr_timer_code_at_least(Duration::from_micros(491_520)), 31);
        assert_eq!(rnr_timer_code_at_least(Duration::from_micros(491_521)), 0);
        assert_eq!(rnr_timer_code_at_least(Duration::from_secs(10)), 0);
        for c in 0..32 {
            assert_eq!(rnr_timer_code_at_least(rnr_timer_duration(c)), c);
        }
    }

    #[test]
    fn deth_known_bytes() {
        let d = Deth {
            qkey: crate::wire::GSI_QKEY,
            src_qp: 1,
        };
        assert_eq!(d.to_bytes(), [0x80, 0x01, 0, 0, 0, 0, 0, 1]);
        // Reserved byte ignored; src_qp masked.
        assert_eq!(
            Deth::parse(&[0, 0, 0, 7, 0xAA, 0, 0, 2, 9]),
            Ok(Deth { qkey: 7, src_qp: 2 })
        );
        let wide = Deth {
            qkey: 0,
            src_qp: 0xFF00_0003,
        };
        assert_eq!(Deth::from_bytes(&wide.to_bytes()).src_qp, 3);
        assert_eq!(Deth::parse(&[0; 7]), Err(WireError::Truncated));
    }

    #[test]
    fn reth_and_imm_truncated() {
        for n in 0..Reth::HEADER_LEN {
            assert_eq!(Reth::parse(&[0u8; 16][..n]), Err(WireError::Truncated));
        }
        for n in 0..ImmDt::HEADER_LEN {
            assert_eq!(ImmDt::parse(&[0u8; 4][..n]), Err(WireError::Truncated));
        }
        assert_eq!(ImmDt::parse(&[1, 2, 3, 4]), Ok(ImmDt(0x0102_0304)));
    }

    pub(crate) fn arb_nak_code() -> impl Strategy<Value = NakCode> {
        prop_oneof![
            Just(NakCode::PsnSequenceError),
            Just(NakCode::InvalidRequest),
            Just(NakCode::RemoteAccessError),
            Just(NakCode::RemoteOperationalError),
            Just(NakCode::InvalidRdRequest),
            (5u8..32).prop_map(NakCode::Reserved),
        ]
    }

    pub(crate) fn arb_aeth() -> impl Strategy<Value = Aeth> {
        let syndrome = prop_oneof![
            (0u8..32).prop_map(|credits| Syndrome::Ack { credits }),
            (0u8..32).prop_map(|timer| Syndrome::RnrNak { timer }),
            arb_nak_code().prop_map(Syndrome::Nak),
        ];
        (syndrome, 0u32..=MSN_MASK).prop_map(|(syndrome, msn)| Aeth { syndrome, msn })
    }

    pub(crate) fn arb_deth() -> impl Strategy<Value = Deth> {
        (any::<u32>(), 0u32..=QPN_MASK).prop_map(|(qkey, src_qp)| Deth { qkey, src_qp })
    }

    pub(crate) fn arb_reth() -> impl Strategy<Value = Reth> {
        (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(va, rkey, dma_len)| Reth {
            va,
            rkey,
            dma_len,
        })
    }

    proptest! {
        #[test]
        fn aeth_round_trip(a in arb_aeth()) {
            let mut buf = [0u8; 4];
            a.emit(&mut buf);
            prop_assert_eq!(Aeth::parse(&buf)?, a);
        }

        #[test]
        fn aeth_parse_never_panics(b in any::<[u8; 4]>()) {
            match Aeth::parse(&b) {
                Ok(a) => prop_assert_eq!(a.to_bytes(), b),
                Err(e) => prop_assert_eq!(e, WireError::BadSyndrome(b[0])),
            }
        }

        #[test]
        fn aeth_msn_masked(msn in any::<u32>()) {
            let a = Aeth { syndrome: Syndrome::ACK_UNLIMITED, msn };
            prop_assert_eq!(Aeth::parse(&a.to_bytes())?.msn, msn & MSN_MASK);
        }

        #[test]
        fn deth_round_trip(d in arb_deth()) {
            let mut buf = [0xEEu8; 9];
            d.emit(&mut buf);
            prop_assert_eq!(Deth::parse(&buf)?, d);
            prop_assert_eq!(buf[4], 0);
            prop_assert_eq!(buf[8], 0xEE);
        }

        #[test]
        fn reth_round_trip(r in arb_reth()) {
            let mut buf = [0u8; 16];
            r.emit(&mut buf);
            prop_assert_eq!(Reth::parse(&buf)?, r);
            prop_assert_eq!(Reth::from_bytes(&r.to_bytes()), r);
        }

        #[test]
        fn imm_round_trip(v in any::<u32>()) {
            let mut buf = [0u8; 4];
            ImmDt(v).emit(&mut buf);
            prop_assert_eq!(ImmDt::parse(&buf)?, ImmDt(v));
        }

        #[test]
        fn rnr_code_is_minimal(us in 0u64..800_000) {
            let d = Duration::from_micros(us);
            let c = rnr_timer_code_at_least(d);
            if us <= 655_360 {
                prop_assert!(rnr_timer_duration(c) >= d);
            } else {
                prop_assert_eq!(c, 0);
            }
            // No code with a shorter duration would also do.
            for other in 0..32u8 {
                let od = rnr_timer_duration(other);
                if od >= d {
                    prop_assert!(od >= rnr_timer_duration(c));
                }
            }
        }
    }
}
