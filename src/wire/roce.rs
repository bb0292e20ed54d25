//! A whole RoCEv2 datagram (the UDP payload): BTH, extension headers, payload, pad, ICRC.
//!
//! [`RocePacket`] is the parsed, borrowed view of a received datagram; [`RoceRepr`] is the
//! header set a sender fills in and [`emit`](RoceRepr::emit)s with a payload.
//!
//! ```text
//! +-----+------+------+------+-------+---------+-----+------+
//! | BTH | RETH | AETH | DETH | ImmDt | payload | pad | ICRC |
//! +-----+------+------+------+-------+---------+-----+------+
//!   12    16     4      8      4       n        0..3   4 (little-endian)
//! ```
//!
//! Which extension headers are present is decided by the opcode ([`Opcode::has_reth`] …);
//! no opcode carries both RETH and AETH or both AETH and DETH, so the order above is the
//! order of every opcode this module represents. Opcodes whose headers have no field here
//! (atomics, invalidate, FLUSH) parse as [`WireError::UnsupportedOpcode`].

use super::bth::Bth;
#[cfg(doc)]
use super::bth::Opcode;
use super::ext::{Aeth, Deth, ImmDt, Reth};
use super::field::take;
use super::icrc::{self, IpHeaderInfo, ICRC_LEN};
use super::{Result, WireError};

/// Pad bytes after a payload of `len` bytes: `(-len) & 3`.
#[inline]
const fn pad_for(len: usize) -> usize {
    len.wrapping_neg() & 3
}

/// A parsed RoCEv2 datagram, borrowing its payload from the receive buffer.
///
/// Produced by [`parse`](Self::parse), which checks the structure but not the ICRC: call
/// [`verify_icrc`](Self::verify_icrc) (or use [`parse_verified`](Self::parse_verified)) when
/// the IP header is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RocePacket<'a> {
    /// Base Transport Header. Its `tver` is not checked (see [`Bth::check_tver`]).
    pub bth: Bth,
    /// RETH, present iff [`Opcode::has_reth`].
    pub reth: Option<Reth>,
    /// AETH, present iff [`Opcode::has_aeth`].
    pub aeth: Option<Aeth>,
    /// DETH, present iff [`Opcode::has_deth`].
    pub deth: Option<Deth>,
    /// ImmDt, present iff [`Opcode::has_immediate`].
    pub imm: Option<ImmDt>,
    /// The payload, without pad and ICRC.
    pub payload: &'a [u8],
    /// The ICRC trailer, read little-endian; compare with [`icrc::compute_icrc`].
    pub icrc: u32,
}

impl<'a> RocePacket<'a> {
    /// Parses a UDP payload (BTH … ICRC).
    ///
    /// Checks, in this order: the BTH fits; the opcode is known and representable; the
    /// datagram holds the opcode's headers plus the ICRC; each header decodes; the pad count
    /// fits in what lies between the headers and the ICRC; no payload follows an opcode that
    /// carries none. Pad bytes are not required to be zero, and `tver` is not checked.
    ///
    /// # Errors
    ///
    /// - [`WireError::Truncated`]: shorter than the BTH, or than the headers plus the ICRC.
    /// - [`WireError::UnknownOpcode`]: [`Opcode::is_known`] is false.
    /// - [`WireError::UnsupportedOpcode`]: [`Opcode::is_supported`] is false.
    /// - [`WireError::BadSyndrome`]: the AETH syndrome is reserved.
    /// - [`WireError::BadPad`]: the pad count exceeds the payload.
    /// - [`WireError::BadLength`]: a payload on an ACK, RDMA READ request or CNP.
    pub fn parse(datagram: &'a [u8]) -> Result<Self> {
        let bth = Bth::parse(datagram)?;
        let op = bth.opcode;
        if !op.is_known() {
            return Err(WireError::UnknownOpcode(op.0));
        }
        if !op.is_supported() {
            return Err(WireError::UnsupportedOpcode(op.0));
        }
        let (body, icrc) = datagram
            .split_last_chunk::<ICRC_LEN>()
            .ok_or(WireError::Truncated)?;
        let (headers, rest) = body
            .split_at_checked(Bth::HEADER_LEN + op.ext_header_len())
            .ok_or(WireError::Truncated)?;

        let mut ext = headers.get(Bth::HEADER_LEN..).unwrap_or_default();
        let reth = if op.has_reth() {
            Some(Reth::from_bytes(
                take(&mut ext).ok_or(WireError::Truncated)?,
            ))
        } else {
            None
        };
        let aeth = if op.has_aeth() {
            Some(Aeth::from_bytes(
                take(&mut ext).ok_or(WireError::Truncated)?,
            )?)
        } else {
            None
        };
        let deth = if op.has_deth() {
            Some(Deth::from_bytes(
                take(&mut ext).ok_or(WireError::Truncated)?,
            ))
        } else {
            None
        };
        let imm = if op.has_immediate() {
            Some(ImmDt::from_bytes(
                take(&mut ext).ok_or(WireError::Truncated)?,
            ))
        } else {
            None
        };
        // Whatever is left of `ext` is reserved (the CNP's 16 bytes).

        let payload_len = rest
            .len()
            .checked_sub(usize::from(bth.pad_count))
            .ok_or(WireError::BadPad)?;
        if !op.has_payload() && !rest.is_empty() {
            return Err(WireError::BadLength);
        }
        let (payload, _pad) = rest.split_at(payload_len);

        Ok(Self {
            bth,
            reth,
            aeth,
            deth,
            imm,
            payload,
            icrc: u32::from_le_bytes(*icrc),
        })
    }

    /// [`parse`](Self::parse), then [`verify_icrc`](Self::verify_icrc).
    ///
    /// # Errors
    ///
    /// As [`parse`](Self::parse), and [`WireError::BadIcrc`] if the ICRC does not match.
    pub fn parse_verified(
        datagram: &'a [u8],
        ip: &IpHeaderInfo,
        udp_src: u16,
        udp_dst: u16,
    ) -> Result<Self> {
        let pkt = Self::parse(datagram)?;
        if Self::verify_icrc(datagram, ip, udp_src, udp_dst) {
            Ok(pkt)
        } else {
            Err(WireError::BadIcrc)
        }
    }

    /// Whether the last four bytes of `datagram` (a UDP payload, BTH … ICRC) are its ICRC,
    /// given the IP header and UDP ports it arrived with. False if it is shorter than 4 bytes.
    /// Works on any bytes; it does not parse the headers.
    #[must_use]
    pub fn verify_icrc(datagram: &[u8], ip: &IpHeaderInfo, udp_src: u16, udp_dst: u16) -> bool {
        icrc::verify_icrc(ip, udp_src, udp_dst, datagram)
    }

    /// The headers of this packet, for re-emitting or comparing. The BTH keeps the received
    /// pad count (which [`RoceRepr::emit`] recomputes).
    #[must_use]
    pub const fn repr(&self) -> RoceRepr {
        RoceRepr {
            bth: self.bth,
            reth: self.reth,
            aeth: self.aeth,
            deth: self.deth,
            imm: self.imm,
        }
    }
}

/// The headers of a RoCEv2 packet to send; [`emit`](Self::emit) adds payload, pad and ICRC.
///
/// Exactly the extension headers the opcode requires must be `Some`
/// ([`check`](Self::check)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RoceRepr {
    /// Base Transport Header. `pad_count` is ignored by [`emit`](Self::emit), which computes
    /// it from the payload length.
    pub bth: Bth,
    /// RETH, for RDMA WRITE First/Only and RDMA READ requests.
    pub reth: Option<Reth>,
    /// AETH, for ACKs and RDMA READ responses First/Last/Only.
    pub aeth: Option<Aeth>,
    /// DETH, for UD.
    pub deth: Option<Deth>,
    /// ImmDt, for the "with immediate" opcodes.
    pub imm: Option<ImmDt>,
}

impl RoceRepr {
    /// A repr with just a BTH (no extension headers), as SEND and RDMA WRITE middle packets
    /// need.
    #[must_use]
    pub const fn new(bth: Bth) -> Self {
        Self {
            bth,
            reth: None,
            aeth: None,
            deth: None,
            imm: None,
        }
    }

    /// Checks that the opcode is known and representable and that exactly its extension
    /// headers are present.
    ///
    /// # Errors
    ///
    /// [`WireError::UnknownOpcode`], [`WireError::UnsupportedOpcode`], or
    /// [`WireError::HeaderMismatch`] when an extension header is missing or superfluous.
    pub const fn check(&self) -> Result<()> {
        let op = self.bth.opcode;
        if !op.is_known() {
            return Err(WireError::UnknownOpcode(op.0));
        }
        if !op.is_supported() {
            return Err(WireError::UnsupportedOpcode(op.0));
        }
        if op.has_reth() != self.reth.is_some()
            || op.has_aeth() != self.aeth.is_some()
            || op.has_deth() != self.deth.is_some()
            || op.has_immediate() != self.imm.is_some()
        {
            return Err(WireError::HeaderMismatch(op.0));
        }
        Ok(())
    }

    /// Bytes of BTH plus extension headers.
    #[must_use]
    pub const fn header_len(&self) -> usize {
        Bth::HEADER_LEN + self.bth.opcode.ext_header_len()
    }

    /// Length of the datagram [`emit`](Self::emit) writes for a payload of `payload_len`
    /// bytes: headers, payload, pad and ICRC.
    #[must_use]
    pub const fn datagram_len(&self, payload_len: usize) -> usize {
        self.header_len() + payload_len + pad_for(payload_len) + ICRC_LEN
    }

    /// Replaces the contents of `out` with the datagram: the BTH (with `pad_count` set to
    /// `(-payload.len()) & 3`), the opcode's extension headers in wire order, `payload`, zero
    /// pad bytes, and the ICRC (little-endian) computed for the given IP header and UDP ports.
    ///
    /// `out` is cleared first; reusing one buffer avoids reallocating.
    ///
    /// The headers written are those the opcode calls for. The repr should pass
    /// [`check`](Self::check) and the payload should be empty on opcodes without one
    /// ([`Opcode::has_payload`]); both are `debug_assert`ed. In release builds a missing
    /// header is written as zeros, a superfluous one is ignored, and reserved header bytes
    /// (the CNP's, or the unrepresentable headers of unsupported opcodes) are zero.
    pub fn emit(
        &self,
        payload: &[u8],
        ip: &IpHeaderInfo,
        udp_src: u16,
        udp_dst: u16,
        out: &mut Vec<u8>,
    ) {
        out.clear();
        self.emit_append(payload, ip, udp_src, udp_dst, out);
    }

    /// As [`emit`](Self::emit), but appends the datagram to `out` instead of replacing its
    /// contents (for building several datagrams back to back in one buffer).
    pub fn emit_append(
        &self,
        payload: &[u8],
        ip: &IpHeaderInfo,
        udp_src: u16,
        udp_dst: u16,
        out: &mut Vec<u8>,
    ) {
        let start = out.len();
        self.emit_transport_append(payload, out);
        let icrc = icrc::compute_icrc(ip, udp_src, udp_dst, out.get(start..).unwrap_or_default());
        out.extend_from_slice(&icrc.to_le_bytes());
    }

    /// Appends the transport part to `out`: the BTH, the headers the opcode calls for, the
    /// payload and the pad, without the ICRC (which the link layer computes: over the IP
    /// and UDP headers on RoCEv2, over the LRH and GRH on InfiniBand). Asserts as
    /// [`emit`](Self::emit).
    pub fn emit_transport_append(&self, payload: &[u8], out: &mut Vec<u8>) {
        debug_assert_eq!(self.check(), Ok(()), "inconsistent RoceRepr {self:?}");
        debug_assert!(
            self.bth.opcode.has_payload() || payload.is_empty(),
            "payload on {}",
            self.bth.opcode
        );
        let op = self.bth.opcode;
        let pad = pad_for(payload.len());
        let start = out.len();
        out.reserve(self.datagram_len(payload.len()));

        let mut bth = self.bth;
        bth.pad_count = pad as u8;
        out.extend_from_slice(&bth.to_bytes());
        if op.has_reth() {
            out.extend_from_slice(&self.reth.map_or([0; Reth::HEADER_LEN], |h| h.to_bytes()));
        }
        if op.has_aeth() {
            out.extend_from_slice(&self.aeth.map_or([0; Aeth::HEADER_LEN], |h| h.to_bytes()));
        }
        if op.has_deth() {
            out.extend_from_slice(&self.deth.map_or([0; Deth::HEADER_LEN], |h| h.to_bytes()));
        }
        if op.has_immediate() {
            out.extend_from_slice(&self.imm.map_or([0; ImmDt::HEADER_LEN], |h| h.to_bytes()));
        }
        // Reserved or unrepresentable header bytes.
        out.resize(start + self.header_len(), 0);

        out.extend_from_slice(payload);
        out.resize(out.len() + pad, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::bth::tests::arb_bth;
    use crate::wire::bth::Opcode;
    use crate::wire::ext::tests::{arb_aeth, arb_deth, arb_reth};
    use crate::wire::ext::{NakCode, Syndrome};
    use crate::wire::icrc::tests::{hex, v4_info, v6_info, V4_VECTOR, V6_VECTOR};
    use crate::wire::{GSI_QKEY, ROCEV2_UDP_PORT};
    use core::net::{Ipv4Addr, Ipv6Addr};
    use proptest::prelude::*;

    const SPORT: u16 = 49152;

    fn vector_repr() -> RoceRepr {
        let mut bth = Bth::new(Opcode::RC_SEND_ONLY, 0x11, 1);
        bth.ack_req = true;
        RoceRepr::new(bth)
    }

    fn emit(repr: &RoceRepr, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        repr.emit(payload, &v4_info(), SPORT, ROCEV2_UDP_PORT, &mut out);
        out
    }

    /// A repr with the headers `op` calls for, filled with recognisable values.
    fn sample_repr(op: Opcode) -> RoceRepr {
        RoceRepr {
            bth: Bth::new(op, 0x12_3456, 0xAB_CDEF),
            reth: op.has_reth().then_some(Reth {
                va: 0x1122_3344_5566_7788,
                rkey: 0x99AA_BBCC,
                dma_len: 4096,
            }),
            aeth: op.has_aeth().then_some(Aeth::ack(7)),
            deth: op.has_deth().then_some(Deth {
                qkey: GSI_QKEY,
                src_qp: 1,
            }),
            imm: op.has_immediate().then_some(ImmDt(0xDEAD_BEEF)),
        }
    }

    fn supported() -> impl Iterator<Item = Opcode> {
        Opcode::ALL_KNOWN.into_iter().filter(|o| o.is_supported())
    }

    #[test]
    fn emit_reproduces_ipv4_vector() {
        let pkt = hex(V4_VECTOR);
        let out = emit(&vector_repr(), b"hello");
        assert_eq!(out, &pkt[28..]);
        assert_eq!(out.len(), vector_repr().datagram_len(5));
        assert_eq!(&out[out.len() - 4..], &[0x45, 0x51, 0x6d, 0x61]);
    }

    #[test]
    fn emit_reproduces_ipv6_vector() {
        let pkt = hex(V6_VECTOR);
        let mut out = Vec::new();
        vector_repr().emit(b"hello", &v6_info(), SPORT, ROCEV2_UDP_PORT, &mut out);
        assert_eq!(out, &pkt[48..]);
        assert_eq!(&out[out.len() - 4..], &[0x39, 0xd9, 0x93, 0xda]);
    }

    #[test]
    fn parse_vectors() {
        for (v, off, ip) in [(V4_VECTOR, 28, v4_info()), (V6_VECTOR, 48, v6_info())] {
            let pkt = hex(v);
            let d = &pkt[off..];
            let p = RocePacket::parse_verified(d, &ip, SPORT, ROCEV2_UDP_PORT).unwrap();
            assert_eq!(p.payload, b"hello");
            assert_eq!(p.bth.pad_count, 3);
            assert_eq!(p.bth.dest_qp, 0x11);
            assert_eq!(p.bth.psn, 1);
            assert!(p.bth.ack_req);
            assert_eq!(p.icrc.to_le_bytes(), d[d.len() - 4..]);
            let mut r = p.repr();
            r.bth.pad_count = 0;
            assert_eq!(r, vector_repr());
            assert_eq!(
                RocePacket::parse_verified(d, &ip, SPORT + 1, ROCEV2_UDP_PORT),
                Err(WireError::BadIcrc)
            );
        }
    }

    #[test]
    fn every_bit_flip_of_vector_is_detected_except_byte_4() {
        let pkt = hex(V4_VECTOR);
        let d = &pkt[28..];
        for bit in 0..d.len() * 8 {
            let mut f = d.to_vec();
            f[bit / 8] ^= 1 << (bit % 8);
            let ok = RocePacket::verify_icrc(&f, &v4_info(), SPORT, ROCEV2_UDP_PORT);
            assert_eq!(ok, bit / 8 == 4, "bit {bit}");
        }
    }

    #[test]
    fn pad_bytes_follow_payload_length() {
        let repr = vector_repr();
        for len in 0..12usize {
            let payload: Vec<u8> = (1..=len as u8).collect();
            let out = emit(&repr, &payload);
            let pad = (4 - len % 4) % 4;
            assert_eq!(out.len(), 12 + len + pad + 4);
            assert_eq!(out.len(), repr.datagram_len(len));
            assert_eq!(usize::from(out[1] >> 4 & 3), pad);
            assert!(out[12 + len..12 + len + pad].iter().all(|&b| b == 0));
            assert_eq!((out.len() - 4) % 4, 0);
            let p = RocePacket::parse(&out).unwrap();
            assert_eq!(p.payload, &payload[..]);
            assert_eq!(usize::from(p.bth.pad_count), pad);
        }
    }

    #[test]
    fn emit_append_builds_datagrams_back_to_back() {
        let repr = vector_repr();
        let ip = v4_info();
        let mut one = Vec::new();
        repr.emit(b"hello", &ip, SPORT, ROCEV2_UDP_PORT, &mut one);
        let mut two = vec![0xEE; 3];
        repr.emit_append(b"hello", &ip, SPORT, ROCEV2_UDP_PORT, &mut two);
        repr.emit_append(b"hello", &ip, SPORT, ROCEV2_UDP_PORT, &mut two);
        assert_eq!(two.len(), 3 + 2 * one.len());
        assert_eq!(&two[3..3 + one.len()], &one[..]);
        assert_eq!(&two[3 + one.len()..], &one[..]);
        assert!(icrc::verify_icrc(
            &ip,
            SPORT,
            ROCEV2_UDP_PORT,
            &two[3 + one.len()..]
        ));
    }

    #[test]
    fn emit_overrides_callers_pad_count_and_clears_out() {
        let mut repr = vector_repr();
        repr.bth.pad_count = 2;
        let mut out = vec![0xEE; 100];
        repr.emit(&[1, 2, 3, 4], &v4_info(), SPORT, ROCEV2_UDP_PORT, &mut out);
        assert_eq!(out.len(), 12 + 4 + 4);
        assert_eq!(out[1] >> 4 & 3, 0);
    }

    #[test]
    fn nonzero_pad_bytes_are_accepted() {
        let mut out = emit(&vector_repr(), b"hello");
        out[12 + 5] = 0x55;
        let p = RocePacket::parse(&out).unwrap();
        assert_eq!(p.payload, b"hello");
    }

    #[test]
    fn zero_length_payload_every_opcode() {
        for op in supported() {
            let repr = sample_repr(op);
            let out = emit(&repr, &[]);
            assert_eq!(out.len(), repr.header_len() + 4, "{op}");
            let p = RocePacket::parse(&out).unwrap();
            assert!(p.payload.is_empty());
            assert_eq!(p.repr(), repr, "{op}");
            assert!(RocePacket::verify_icrc(
                &out,
                &v4_info(),
                SPORT,
                ROCEV2_UDP_PORT
            ));
        }
    }

    #[test]
    fn truncated_headers_every_opcode() {
        for op in supported() {
            let repr = sample_repr(op);
            let out = emit(&repr, &[]);
            for n in 0..out.len() {
                assert_eq!(
                    RocePacket::parse(&out[..n]),
                    Err(WireError::Truncated),
                    "{op} at {n}"
                );
            }
        }
    }

    #[test]
    fn header_order_write_only_with_immediate_and_ud_with_immediate() {
        let out = emit(
            &sample_repr(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE),
            b"x",
        );
        assert_eq!(&out[12..20], &0x1122_3344_5566_7788u64.to_be_bytes());
        assert_eq!(&out[28..32], &[0xDE, 0xAD, 0xBE, 0xEF]);
        assert_eq!(out[32], b'x');
        let out = emit(&sample_repr(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE), b"x");
        assert_eq!(&out[12..20], &[0x80, 0x01, 0, 0, 0, 0, 0, 1]);
        assert_eq!(&out[20..24], &[0xDE, 0xAD, 0xBE, 0xEF]);
        let out = emit(&sample_repr(Opcode::RC_RDMA_READ_RESPONSE_FIRST), b"x");
        assert_eq!(&out[12..16], &[0x1F, 0, 0, 7]);
    }

    #[test]
    fn cm_mad_envelope_sizes() {
        // §4.1: UD SEND_ONLY to QP1 with a 256-byte MAD: UDP length 288.
        let mut bth = Bth::new(Opcode::UD_SEND_ONLY, 1, 0);
        bth.pkey = crate::wire::DEFAULT_PKEY;
        let repr = RoceRepr {
            deth: Some(Deth {
                qkey: GSI_QKEY,
                src_qp: 1,
            }),
            ..RoceRepr::new(bth)
        };
        assert_eq!(8 + repr.datagram_len(256), 288);
    }

    #[test]
    fn opcode_errors() {
        let mut d = emit(&vector_repr(), b"hello");
        d[0] = 0x15;
        assert_eq!(RocePacket::parse(&d), Err(WireError::UnknownOpcode(0x15)));
        d[0] = 0x40;
        assert_eq!(RocePacket::parse(&d), Err(WireError::UnknownOpcode(0x40)));
        for op in [0x12, 0x13, 0x14, 0x16, 0x17, 0x1C] {
            d[0] = op;
            assert_eq!(RocePacket::parse(&d), Err(WireError::UnsupportedOpcode(op)));
        }
        // Unknown opcode wins over truncation once the BTH is there.
        assert_eq!(
            RocePacket::parse(&[0x15; 12]),
            Err(WireError::UnknownOpcode(0x15))
        );
    }

    #[test]
    fn bad_pad_and_bad_length() {
        // pad_count 3 with only 2 bytes between headers and ICRC.
        let mut d = emit(&vector_repr(), &[1, 2]);
        assert_eq!(d.len(), 12 + 2 + 2 + 4);
        d.truncate(12 + 2);
        d.extend_from_slice(&[0; 4]);
        d[1] = (d[1] & !0x30) | 0x30;
        assert_eq!(RocePacket::parse(&d), Err(WireError::BadPad));
        // pad_count 1 on an empty SEND_ONLY.
        let mut d = emit(&vector_repr(), &[]);
        d[1] |= 0x10;
        assert_eq!(RocePacket::parse(&d), Err(WireError::BadPad));
        // An ACK with trailing bytes before the ICRC.
        let mut d = emit(&sample_repr(Opcode::RC_ACKNOWLEDGE), &[]);
        d.splice(16..16, [0u8; 4]);
        assert_eq!(RocePacket::parse(&d), Err(WireError::BadLength));
        // ... even if the pad count claims them.
        d[1] |= 0x30;
        assert_eq!(RocePacket::parse(&d), Err(WireError::BadLength));
    }

    #[test]
    fn bad_syndrome_in_ack() {
        let mut d = emit(&sample_repr(Opcode::RC_ACKNOWLEDGE), &[]);
        d[12] = 0x45;
        assert_eq!(RocePacket::parse(&d), Err(WireError::BadSyndrome(0x45)));
    }

    #[test]
    fn nak_and_rnr_round_trip() {
        for aeth in [
            Aeth::nak(NakCode::PsnSequenceError, 3),
            Aeth::nak(NakCode::Reserved(9), 3),
            Aeth::rnr_nak(14, 0xFF_FFFF),
        ] {
            let repr = RoceRepr {
                aeth: Some(aeth),
                ..RoceRepr::new(Bth::new(Opcode::RC_ACKNOWLEDGE, 5, 6))
            };
            let out = emit(&repr, &[]);
            assert_eq!(RocePacket::parse(&out).unwrap().aeth, Some(aeth));
        }
        assert_eq!(
            Aeth::rnr_nak(14, 0).syndrome,
            Syndrome::RnrNak { timer: 14 }
        );
    }

    #[test]
    fn cnp_round_trip() {
        let repr = RoceRepr::new(Bth::new(Opcode::CNP, 9, 0));
        let out = emit(&repr, &[]);
        assert_eq!(out.len(), 12 + 16 + 4);
        assert!(out[12..28].iter().all(|&b| b == 0));
        assert_eq!(RocePacket::parse(&out).unwrap().repr(), repr);
    }

    #[test]
    fn check_reports_mismatches() {
        assert_eq!(vector_repr().check(), Ok(()));
        for op in supported() {
            assert_eq!(sample_repr(op).check(), Ok(()), "{op}");
        }
        let mut r = sample_repr(Opcode::RC_SEND_ONLY);
        r.aeth = Some(Aeth::ack(0));
        assert_eq!(r.check(), Err(WireError::HeaderMismatch(0x04)));
        let mut r = sample_repr(Opcode::RC_RDMA_WRITE_FIRST);
        r.reth = None;
        assert_eq!(r.check(), Err(WireError::HeaderMismatch(0x06)));
        let r = RoceRepr::new(Bth::new(Opcode(0x15), 1, 1));
        assert_eq!(r.check(), Err(WireError::UnknownOpcode(0x15)));
        let r = RoceRepr::new(Bth::new(Opcode::RC_FETCH_ADD, 1, 1));
        assert_eq!(r.check(), Err(WireError::UnsupportedOpcode(0x14)));
    }

    fn arb_ip() -> impl Strategy<Value = IpHeaderInfo> {
        prop_oneof![
            (
                any::<[u8; 4]>(),
                any::<[u8; 4]>(),
                any::<u16>(),
                any::<bool>()
            )
                .prop_map(|(s, d, identification, dont_fragment)| IpHeaderInfo::V4 {
                    src: Ipv4Addr::from(s),
                    dst: Ipv4Addr::from(d),
                    identification,
                    dont_fragment,
                }),
            (any::<[u8; 16]>(), any::<[u8; 16]>()).prop_map(|(s, d)| IpHeaderInfo::V6 {
                src: Ipv6Addr::from(s),
                dst: Ipv6Addr::from(d),
            }),
        ]
    }

    /// An opcode-consistent repr (pad_count 0, as a parse would give back after emit for a
    /// 4-aligned payload; the tests fix it up) and a payload of up to `max` bytes.
    fn arb_packet(max: usize) -> impl Strategy<Value = (RoceRepr, Vec<u8>)> {
        let ops: Vec<Opcode> = supported().collect();
        (
            proptest::sample::select(ops),
            arb_bth(),
            arb_reth(),
            arb_aeth(),
            arb_deth(),
            any::<u32>(),
            proptest::collection::vec(any::<u8>(), 0..=max),
        )
            .prop_map(move |(op, mut bth, reth, aeth, deth, imm, mut payload)| {
                bth.opcode = op;
                if !op.has_payload() {
                    payload.clear();
                }
                let repr = RoceRepr {
                    bth,
                    reth: op.has_reth().then_some(reth),
                    aeth: op.has_aeth().then_some(aeth),
                    deth: op.has_deth().then_some(deth),
                    imm: op.has_immediate().then_some(ImmDt(imm)),
                };
                (repr, payload)
            })
    }

    proptest! {
        #[test]
        fn packet_round_trip(
            (repr, payload) in arb_packet(5000),
            ip in arb_ip(),
            sport in any::<u16>(),
        ) {
            let mut out = Vec::new();
            repr.emit(&payload, &ip, sport, ROCEV2_UDP_PORT, &mut out);
            prop_assert_eq!(out.len(), repr.datagram_len(payload.len()));
            let p = RocePacket::parse(&out)?;
            let mut expect = repr;
            expect.bth.pad_count = (payload.len().wrapping_neg() & 3) as u8;
            prop_assert_eq!(p.repr(), expect);
            prop_assert_eq!(p.payload, &payload[..]);
            prop_assert_eq!(
                p.icrc,
                icrc::compute_icrc(&ip, sport, ROCEV2_UDP_PORT, &out[..out.len() - 4])
            );
            prop_assert!(RocePacket::verify_icrc(&out, &ip, sport, ROCEV2_UDP_PORT));
            // Emitting the parsed packet gives the same bytes.
            let mut again = Vec::new();
            p.repr().emit(p.payload, &ip, sport, ROCEV2_UDP_PORT, &mut again);
            prop_assert_eq!(again, out);
        }

        #[test]
        fn single_bit_flip_breaks_icrc_unless_masked(
            (repr, payload) in arb_packet(200),
            ip in arb_ip(),
            bit in any::<proptest::sample::Index>(),
        ) {
            let mut out = Vec::new();
            repr.emit(&payload, &ip, SPORT, ROCEV2_UDP_PORT, &mut out);
            let bit = bit.index(out.len() * 8);
            out[bit / 8] ^= 1 << (bit % 8);
            let ok = RocePacket::verify_icrc(&out, &ip, SPORT, ROCEV2_UDP_PORT);
            // BTH byte 4 (FECN, BECN, resv6a) is masked out of the ICRC.
            prop_assert_eq!(ok, bit / 8 == 4);
        }

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = RocePacket::parse(&bytes);
            let _ = RocePacket::verify_icrc(&bytes, &v4_info(), 1, 2);
        }

        #[test]
        fn parse_never_panics_with_known_opcode(
            op in proptest::sample::select(Opcode::ALL_KNOWN.to_vec()),
            mut bytes in proptest::collection::vec(any::<u8>(), 1..80),
        ) {
            bytes[0] = op.0;
            if let Ok(p) = RocePacket::parse(&bytes) {
                // Structural invariants of a successful parse.
                let r = p.repr();
                prop_assert_eq!(r.check(), Ok(()));
                let pad = usize::from(p.bth.pad_count);
                prop_assert_eq!(bytes.len(), r.header_len() + p.payload.len() + pad + 4);
                prop_assert!(op.has_payload() || p.payload.is_empty());
            }
        }
    }
}
