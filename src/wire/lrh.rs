//! The Local Route Header (LRH) of native InfiniBand packets and the Variant CRC (VCRC).
//!
//! Layout (8 bytes, big-endian; IBTA Vol. 1 §7.7):
//!
//! ```text
//!  byte 0        1                2..=3   4..=5           6..=7
//! +------------+----------------+-------+---------------+-------+
//! | VL   LVer  | SL  rsv2  LNH  | DLID  | rsv5  PktLen  | SLID  |
//! +------------+----------------+-------+---------------+-------+
//!   4    4       4   2     2      16      5     11        16     bits
//! ```
//!
//! A packet on an InfiniBand link is `LRH [GRH] BTH … payload pad ICRC VCRC` (no ICRC after a
//! raw packet). PktLen counts 4-byte words from the first byte of the LRH through the last
//! byte before the VCRC (the ICRC, where there is one): [`pkt_len_words`].
//!
//! The VCRC (IBTA Vol. 1 §7.8.2) is the CRC-16 with polynomial `0x100B` over the same bytes,
//! computed least significant bit first (reflected, `0xD008`), with initial value `0xFFFF`
//! and the result inverted: the same conventions as the ICRC's CRC-32. It is sent
//! **little-endian**, like the ICRC: the two bytes on the wire are `vcrc(..).to_le_bytes()`.
//! [`append_vcrc`], [`read_vcrc`] and [`verify_vcrc`] do that. Mellanox's MPGA packet library
//! (`update_VCRC`, `append_VCRC`) and Endace's `dagcrc.c` compute it the same way. Every hop
//! recomputes it, since switches rewrite the VL.

use super::field::emit_head;
use super::{Result, WireError};

/// Size of the LRH on the wire.
pub const LRH_LEN: usize = 8;

/// Size of the VCRC trailer on the wire.
pub const VCRC_LEN: usize = 2;

/// The largest PktLen, in 4-byte words (the field is 11 bits wide).
pub const MAX_PKT_LEN_WORDS: u16 = 0x07FF;

/// Link Next Header: what follows the LRH (the low two bits of byte 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Lnh {
    /// `0b00`: a raw packet (a raw header follows; no ICRC).
    Raw = 0b00,
    /// `0b01`: IP non-IBA transport (a raw IPv6 header follows; no ICRC).
    IpNonIba = 0b01,
    /// `0b10`: IBA local: the BTH follows.
    IbaLocal = 0b10,
    /// `0b11`: IBA global: a GRH follows, then the BTH.
    IbaGlobal = 0b11,
}

impl Lnh {
    /// The LNH in the low two bits of `bits`; the other bits are ignored.
    #[must_use]
    pub const fn from_bits(bits: u8) -> Self {
        match bits & 0b11 {
            0b00 => Self::Raw,
            0b01 => Self::IpNonIba,
            0b10 => Self::IbaLocal,
            _ => Self::IbaGlobal,
        }
    }

    /// The two-bit field value.
    #[must_use]
    pub const fn bits(self) -> u8 {
        self as u8
    }
}

/// The Local Route Header, decoded.
///
/// LVer and the reserved bits are dropped on parse (see [`lver`](Self::lver)); LVer and the
/// reserved bits are written as zero on emit. [`vl`](Self::vl) and [`sl`](Self::sl) are
/// 4-bit and [`pkt_len_words`](Self::pkt_len_words) is 11-bit; [`emit`](Self::emit) masks
/// them to those widths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lrh {
    /// VL: virtual lane (4 bits; 15 is VL15, subnet management).
    pub vl: u8,
    /// SL: service level (4 bits).
    pub sl: u8,
    /// LNH: what follows the LRH.
    pub lnh: Lnh,
    /// DLID: destination local identifier.
    pub dlid: u16,
    /// PktLen: 4-byte words from the first byte of the LRH through the last byte before the
    /// VCRC (11 bits).
    pub pkt_len_words: u16,
    /// SLID: source local identifier.
    pub slid: u16,
}

impl Lrh {
    /// Size of the LRH on the wire ([`LRH_LEN`]).
    pub const HEADER_LEN: usize = LRH_LEN;

    /// Decodes the first [`HEADER_LEN`](Self::HEADER_LEN) bytes of `buf`.
    ///
    /// Only the length is checked: any LVer is accepted (and dropped), so a caller that drops
    /// link versions other than 0 reads it with [`lver`](Self::lver) first.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is shorter than 8 bytes.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        buf.first_chunk::<LRH_LEN>()
            .map(Self::from_bytes)
            .ok_or(WireError::Truncated)
    }

    /// Decodes an LRH from exactly 8 bytes. Infallible.
    #[must_use]
    pub const fn from_bytes(b: &[u8; LRH_LEN]) -> Self {
        Self {
            vl: b[0] >> 4,
            sl: b[1] >> 4,
            lnh: Lnh::from_bits(b[1]),
            dlid: u16::from_be_bytes([b[2], b[3]]),
            pkt_len_words: u16::from_be_bytes([b[4], b[5]]) & MAX_PKT_LEN_WORDS,
            slid: u16::from_be_bytes([b[6], b[7]]),
        }
    }

    /// Encodes the header; out-of-range fields are masked to their widths.
    #[must_use]
    pub const fn to_bytes(&self) -> [u8; LRH_LEN] {
        let dlid = self.dlid.to_be_bytes();
        let len = (self.pkt_len_words & MAX_PKT_LEN_WORDS).to_be_bytes();
        let slid = self.slid.to_be_bytes();
        [
            (self.vl & 0x0F) << 4,
            (self.sl & 0x0F) << 4 | self.lnh.bits(),
            dlid[0],
            dlid[1],
            len[0],
            len[1],
            slid[0],
            slid[1],
        ]
    }

    /// Writes the header into the first [`HEADER_LEN`](Self::HEADER_LEN) bytes of `buf`.
    ///
    /// # Panics
    ///
    /// If `buf` is shorter than 8 bytes (a caller bug, not a wire condition).
    pub fn emit(&self, buf: &mut [u8]) {
        emit_head(buf, &self.to_bytes());
    }

    /// The LVer (link version, low four bits of byte 0) of an encoded LRH; 0 is the only
    /// version defined.
    #[must_use]
    pub const fn lver(b: &[u8; LRH_LEN]) -> u8 {
        b[0] & 0x0F
    }

    /// [`pkt_len_words`](Self::pkt_len_words) in bytes (LRH through ICRC, 11 bits masked).
    #[must_use]
    pub const fn pkt_len_bytes(&self) -> usize {
        (self.pkt_len_words & MAX_PKT_LEN_WORDS) as usize * 4
    }
}

/// The PktLen of a packet with `bytes_from_lrh_through_icrc` bytes from the first byte of the
/// LRH through the last byte before the VCRC; `None` if that is not a multiple of 4 or needs
/// more than [`MAX_PKT_LEN_WORDS`] words.
#[must_use]
pub fn pkt_len_words(bytes_from_lrh_through_icrc: usize) -> Option<u16> {
    if bytes_from_lrh_through_icrc % 4 != 0 {
        return None;
    }
    u16::try_from(bytes_from_lrh_through_icrc / 4)
        .ok()
        .filter(|&w| w <= MAX_PKT_LEN_WORDS)
}

/// The reflected form of the VCRC polynomial `0x100B` (`x^16 + x^12 + x^3 + x + 1`).
const VCRC_POLY_REFLECTED: u16 = 0xD008;

/// The VCRC of `packet`: every byte of it, which for a packet on the link is the first byte
/// of the LRH through the last byte of the ICRC (see the [module docs](self)).
#[must_use]
pub fn vcrc(packet: &[u8]) -> u16 {
    let mut crc: u16 = 0xFFFF;
    for &byte in packet {
        crc ^= u16::from(byte);
        for _ in 0..8 {
            let lsb = crc & 1;
            crc >>= 1;
            if lsb != 0 {
                crc ^= VCRC_POLY_REFLECTED;
            }
        }
    }
    !crc
}

/// Appends the VCRC of `buf` (LRH … ICRC) to it, little-endian.
pub fn append_vcrc(buf: &mut Vec<u8>) {
    let crc = vcrc(buf);
    buf.extend_from_slice(&crc.to_le_bytes());
}

/// The VCRC trailer of a packet (its last two bytes, little-endian), or `None` if it is
/// shorter than two bytes.
#[must_use]
pub fn read_vcrc(packet_with_vcrc: &[u8]) -> Option<u16> {
    packet_with_vcrc
        .last_chunk::<VCRC_LEN>()
        .map(|b| u16::from_le_bytes(*b))
}

/// Whether the trailer of `packet_with_vcrc` (LRH … ICRC VCRC) is the VCRC of the bytes
/// before it. False for packets shorter than the VCRC.
#[must_use]
pub fn verify_vcrc(packet_with_vcrc: &[u8]) -> bool {
    match packet_with_vcrc.split_last_chunk::<VCRC_LEN>() {
        Some((covered, trailer)) => vcrc(covered) == u16::from_le_bytes(*trailer),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// IBTA Vol. 1's CRC example packet (an RC RDMA WRITE Only with a 14-byte payload, pad 2)
    /// as it travels: VL 7 and BTH resv8a 0, which the spec's table shows masked to ones
    /// (`0xF0`, `0xFF`) for the ICRC, then the ICRC `0x9625B75A`. The same bytes are
    /// `test_array_vcrc` in Mellanox's MPGA packet library.
    const IBTA_EXAMPLE: [u8; 56] = [
        0x70, 0x12, 0x37, 0x5C, 0x00, 0x0E, 0x17, 0xD2, 0x0A, 0x20, 0x24, 0x87, 0x00, 0x87, 0xB1,
        0xB3, 0x00, 0x0D, 0xEC, 0x2A, 0x01, 0x71, 0x0A, 0x1C, 0x01, 0x5D, 0x40, 0x02, 0x38, 0xF2,
        0x7A, 0x05, 0x00, 0x00, 0x00, 0x0E, 0xBB, 0x88, 0x4D, 0x85, 0xFD, 0x5C, 0xFB, 0xA4, 0x72,
        0x8B, 0xC0, 0x69, 0x0E, 0xD4, 0x00, 0x00, 0x96, 0x25, 0xB7, 0x5A,
    ];

    /// An LRH from its fields, the LNH as its two bits.
    fn fields(vl: u8, sl: u8, lnh: u8, dlid: u16, pkt_len_words: u16, slid: u16) -> Lrh {
        let lnh = Lnh::from_bits(lnh);
        Lrh {
            vl,
            sl,
            lnh,
            dlid,
            pkt_len_words,
            slid,
        }
    }

    #[test]
    fn lrh_known_bytes() {
        // VL 0, SL 3, LNH IBA local, DLID 4, 0x1E words, SLID 1.
        let b = [0x00, 0x32, 0x00, 0x04, 0x00, 0x1E, 0x00, 0x01];
        let lrh = Lrh::parse(&b).unwrap();
        assert_eq!((lrh.vl, lrh.sl, lrh.lnh), (0, 3, Lnh::IbaLocal));
        assert_eq!(
            (lrh.dlid, lrh.pkt_len_words, lrh.slid),
            (0x0004, 0x1E, 0x0001)
        );
        assert_eq!(lrh.pkt_len_bytes(), 120);
        assert_eq!(lrh.to_bytes(), b);
        assert_eq!(Lrh::lver(&b), 0);
        let lrh = Lrh::parse(&IBTA_EXAMPLE).unwrap();
        assert_eq!(lrh, fields(7, 1, 0b10, 0x375C, 14, 0x17D2));
        assert_eq!(lrh.pkt_len_bytes(), IBTA_EXAMPLE.len());
        assert_eq!(pkt_len_words(IBTA_EXAMPLE.len()), Some(14));
    }

    #[test]
    fn lrh_truncated_reserved_lver_and_masks() {
        for n in 0..LRH_LEN {
            assert_eq!(Lrh::parse(&[0u8; 8][..n]), Err(WireError::Truncated));
        }
        // LVer 5 and every reserved bit set: dropped on parse, zero on emit.
        let raw = [0x05, 0x0C, 0, 0, 0xF8, 0, 0, 0];
        assert_eq!(Lrh::lver(&raw), 5);
        let lrh = Lrh::parse(&raw).unwrap();
        assert_eq!((lrh.lnh, lrh.pkt_len_words), (Lnh::Raw, 0));
        assert_eq!(lrh.to_bytes(), [0u8; 8]);
        // Out-of-range fields are masked on emit.
        let lrh = fields(0xFF, 0x1A, 0b11, 0xFFFF, 0xFFFF, 0xC000);
        let back = Lrh::from_bytes(&lrh.to_bytes());
        assert_eq!((back.vl, back.sl), (0x0F, 0x0A));
        assert_eq!(back.pkt_len_words, MAX_PKT_LEN_WORDS);
        assert_eq!(lrh.pkt_len_bytes(), 0x07FF * 4);
        assert_eq!(
            lrh.to_bytes(),
            [0xF0, 0xA3, 0xFF, 0xFF, 0x07, 0xFF, 0xC0, 0x00]
        );
    }

    #[test]
    #[should_panic(expected = "does not fit")]
    fn lrh_emit_short_buffer_panics() {
        Lrh::from_bytes(&[0; 8]).emit(&mut [0u8; 7]);
    }

    #[test]
    fn lnh_bits_and_pkt_len_words() {
        for bits in 0..4 {
            assert_eq!(Lnh::from_bits(bits).bits(), bits);
            assert_eq!(Lnh::from_bits(bits | 0xFC).bits(), bits);
        }
        assert_eq!(pkt_len_words(0), Some(0));
        assert_eq!(pkt_len_words(8), Some(2));
        assert_eq!(pkt_len_words(0x07FF * 4), Some(0x07FF));
        assert_eq!(pkt_len_words(0x0800 * 4), None);
        assert_eq!(pkt_len_words(usize::MAX & !3), None);
        for n in [1, 2, 3, 9, 57] {
            assert_eq!(pkt_len_words(n), None);
        }
    }

    /// CRC-16 poly 0x100B, most significant bit first, init 0xFFFF, inverted: the
    /// textbook form, to check the reflected one against.
    fn vcrc_msb_first(bytes: impl Iterator<Item = u8>) -> u16 {
        let mut crc: u16 = 0xFFFF;
        for byte in bytes {
            crc ^= u16::from(byte) << 8;
            for _ in 0..8 {
                let msb = crc & 0x8000;
                crc <<= 1;
                if msb != 0 {
                    crc ^= 0x100B;
                }
            }
        }
        !crc
    }

    #[test]
    fn vcrc_matches_mpga_table() {
        // Entries of `crc16_table` in Mellanox's MPGA ("Polynomial 0x100B seed 0xFFFF"):
        // table[i] is the register after shifting byte i through a zero register.
        // The CRC is affine in its input, so the init and final inversion cancel out here.
        let entry = |i: u8| vcrc(&[i]) ^ vcrc(&[0]);
        let index = [0x01, 0x02, 0x08, 0x10, 0x7F, 0x80, 0xAB, 0xFF];
        let table = [
            0x1BA1, 0x3742, 0xDD08, 0x1A01, 0xD968, 0xD008, 0x15E1, 0x0960,
        ];
        for (i, want) in index.into_iter().zip(table) {
            assert_eq!(entry(i), want, "table[{i:#04x}]");
        }
    }

    #[test]
    fn vcrc_of_the_ibta_example() {
        // The example's ICRC (standard CRC-32 over the packet with VL and resv8a set to ones)
        // matches its trailer: these are the spec's bytes.
        let mut masked = IBTA_EXAMPLE;
        masked[0] |= 0xF0;
        masked[12] = 0xFF;
        let icrc = crc32fast::hash(&masked[..52]);
        assert_eq!(icrc, 0x5AB7_2596);
        assert_eq!(icrc.to_le_bytes(), IBTA_EXAMPLE[52..]);
        let crc = vcrc(&IBTA_EXAMPLE);
        let reflected = vcrc_msb_first(IBTA_EXAMPLE.iter().map(|b| b.reverse_bits()));
        assert_eq!(crc, reflected.reverse_bits());
        // Computed here, not quoted: no published VCRC of this packet was found. The algorithm
        // is pinned by `vcrc_matches_mpga_table` and the MSB-first cross-check above.
        assert_eq!(crc, 0xFA45);
        let mut pkt = IBTA_EXAMPLE.to_vec();
        append_vcrc(&mut pkt);
        assert_eq!(pkt[56..], crc.to_le_bytes());
        assert_eq!(read_vcrc(&pkt), Some(crc));
        assert!(verify_vcrc(&pkt));
        assert_eq!(vcrc(&[]), 0x0000);
        assert!(!verify_vcrc(&[]) && !verify_vcrc(&[0x00]));
        assert_eq!(read_vcrc(&[0x12]), None);
        assert_eq!(read_vcrc(&[0x12, 0x34, 0x56]), Some(0x5634));
        // The VCRC covers the LRH's VL, which the ICRC leaves out.
        pkt[0] ^= 0x10;
        assert!(!verify_vcrc(&pkt));
    }

    fn arb_lrh() -> impl Strategy<Value = Lrh> {
        let len = 0..=MAX_PKT_LEN_WORDS;
        (0u8..16, 0u8..16, 0u8..4, any::<u16>(), len, any::<u16>())
            .prop_map(|(vl, sl, lnh, dlid, len, slid)| fields(vl, sl, lnh, dlid, len, slid))
    }

    proptest! {
        #[test]
        fn lrh_round_trip(lrh in arb_lrh()) {
            let mut buf = [0u8; 12];
            lrh.emit(&mut buf);
            prop_assert_eq!(Lrh::parse(&buf)?, lrh);
            prop_assert_eq!(Lrh::lver(&lrh.to_bytes()), 0);
            prop_assert_eq!(&buf[8..], &[0u8; 4]);
        }

        #[test]
        fn lrh_parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..16)) {
            match Lrh::parse(&b) {
                Ok(lrh) => {
                    prop_assert!(b.len() >= LRH_LEN);
                    let masked = [b[0] & 0xF0, b[1] & 0xF3, b[2], b[3], b[4] & 0x07, b[5], b[6], b[7]];
                    prop_assert_eq!(lrh.to_bytes(), masked);
                }
                Err(e) => {
                    prop_assert_eq!(e, WireError::Truncated);
                    prop_assert!(b.len() < LRH_LEN);
                }
            }
        }

        #[test]
        fn vcrc_detects_every_single_bit_flip(body in proptest::collection::vec(any::<u8>(), 1..96)) {
            let mut pkt = body;
            append_vcrc(&mut pkt);
            prop_assert!(verify_vcrc(&pkt));
            for bit in 0..pkt.len() * 8 {
                let mut bad = pkt.clone();
                bad[bit / 8] ^= 1 << (bit % 8);
                prop_assert!(!verify_vcrc(&bad), "flip of bit {} went unnoticed", bit);
            }
        }

        #[test]
        fn vcrc_is_the_reflected_0x100b_crc(body in proptest::collection::vec(any::<u8>(), 0..64)) {
            let msb = vcrc_msb_first(body.iter().map(|b| b.reverse_bits()));
            prop_assert_eq!(vcrc(&body), msb.reverse_bits());
        }
    }
}
