//! Native InfiniBand packets as an IB link carries them: `LRH [GRH] BTH … payload pad ICRC
//! VCRC` (IBTA Vol. 1 §7.7–7.8, §8.3), built around the transport part a [`RoceRepr`] writes.
//!
//! Inside a subnet a unicast packet has no GRH (LNH "IBA local") and is routed by its DLID;
//! a multicast packet, and one on a global path, carries a GRH (LNH "IBA global", next
//! header 0x1B) with the real GIDs.
//!
//! The ICRC here is the InfiniBand one: the same reflected CRC-32 as RoCEv2's
//! ([`crate::wire::icrc`]), over the packet from the first byte of the LRH through the pad,
//! with the fields a switch or router may change set to all ones: the LRH's VL (4 bits),
//! the GRH's traffic class, flow label and hop limit, and BTH byte 4. It matches the
//! example packet of the IBTA (checked in [`crate::wire::lrh`]'s tests). The VCRC follows it.
//!
//! # Panics
//!
//! Parsing never panics and never allocates.

use crc32fast::Hasher;

use super::field::Bytes;
use super::lrh::{self, Lnh, Lrh, LRH_LEN, VCRC_LEN};
use super::roce::RoceRepr;
use super::{Gid, ICRC_LEN};

/// Size of a GRH.
pub const IB_GRH_LEN: usize = 40;

/// The GRH's next header for an IBA transport header (`IB_GRH_NEXT_HDR`).
pub const NEXT_HEADER_IBA: u8 = 0x1B;

/// Bytes a native IB packet adds around the transport part: LRH, ICRC and VCRC (and a GRH
/// where there is one).
pub const IB_LOCAL_OVERHEAD: usize = LRH_LEN + ICRC_LEN + VCRC_LEN;

/// Offset of BTH byte 4 (FECN, BECN, resv6a), masked in the ICRC, within the BTH.
const BTH_MASKED_BYTE: usize = 4;

/// A GRH as InfiniBand carries it (IPv6-shaped, IBTA §8.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IbGrh {
    /// Traffic class.
    pub tclass: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Bytes after the GRH through the ICRC.
    pub payload_len: u16,
    /// Next header ([`NEXT_HEADER_IBA`]).
    pub next_header: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Source GID.
    pub sgid: Gid,
    /// Destination GID.
    pub dgid: Gid,
}

impl IbGrh {
    /// Decodes 40 bytes; the IP version nibble is not checked.
    #[must_use]
    pub fn from_bytes(b: &[u8; IB_GRH_LEN]) -> Self {
        let w0 = b.be32::<0>();
        Self {
            tclass: ((w0 >> 20) & 0xFF) as u8,
            flow_label: w0 & 0x000F_FFFF,
            payload_len: b.be16::<4>(),
            next_header: b.bytes::<6, 1>()[0],
            hop_limit: b.bytes::<7, 1>()[0],
            sgid: Gid(b.bytes::<8, 16>()),
            dgid: Gid(b.bytes::<24, 16>()),
        }
    }

    /// Encodes 40 bytes (IP version 6).
    #[must_use]
    pub fn to_bytes(&self) -> [u8; IB_GRH_LEN] {
        let mut b = [0u8; IB_GRH_LEN];
        let w0 = (6 << 28) | (u32::from(self.tclass) << 20) | (self.flow_label & 0x000F_FFFF);
        b.put_be32::<0>(w0);
        b.put_be16::<4>(self.payload_len);
        b.put_bytes::<6, 2>([self.next_header, self.hop_limit]);
        b.put_bytes::<8, 16>(self.sgid.0);
        b.put_bytes::<24, 16>(self.dgid.0);
        b
    }
}

/// The link-layer addressing of one packet to emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IbAddressing {
    /// Service level.
    pub sl: u8,
    /// Destination LID (unicast, or a multicast LID).
    pub dlid: u16,
    /// Source LID (the port's base LID with the path bits).
    pub slid: u16,
    /// The GRH, for a multicast or global packet; its `payload_len` and `next_header` are
    /// filled in by [`emit_ib_append`].
    pub grh: Option<IbGrh>,
}

/// Why a received datagram is no native IB packet this crate takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum IbPacketError {
    /// Shorter than its headers and trailers, or than its LRH's PktLen says.
    #[error("truncated IB packet")]
    Truncated,
    /// The LRH version is not 0, or the LNH is raw (no IBA transport).
    #[error("unsupported LRH (version or next header)")]
    Unsupported,
    /// The PktLen field disagrees with the datagram's length.
    #[error("PktLen disagrees with the packet")]
    BadLength,
    /// The VCRC does not check.
    #[error("bad VCRC")]
    BadVcrc,
    /// The ICRC does not check.
    #[error("bad ICRC")]
    BadIcrc,
}

/// A received native IB packet, checked: its LRH, its GRH if any, and the transport part
/// (BTH through ICRC) for [`RocePacket::parse`](super::roce::RocePacket::parse).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IbFrame<'a> {
    /// The LRH.
    pub lrh: Lrh,
    /// The GRH (LNH "IBA global").
    pub grh: Option<IbGrh>,
    /// BTH through ICRC.
    pub transport: &'a [u8],
}

/// The InfiniBand ICRC of `packet` (LRH through pad; `grh` says whether a GRH follows the
/// LRH): see the [module docs](self).
#[must_use]
pub fn ib_icrc(packet: &[u8], grh: bool) -> u32 {
    let mut h = Hasher::new();
    let Some((lrh, rest)) = packet.split_first_chunk::<LRH_LEN>() else {
        h.update(packet);
        return h.finalize();
    };
    let mut lrh = *lrh;
    lrh[0] |= 0xF0;
    h.update(&lrh);
    let rest = match rest.split_first_chunk::<IB_GRH_LEN>() {
        Some((g, after)) if grh => {
            let mut g = *g;
            // Traffic class and flow label (all of bytes 0-3 but the version), hop limit.
            g[0] |= 0x0F;
            g[1] = 0xFF;
            g[2] = 0xFF;
            g[3] = 0xFF;
            g[7] = 0xFF;
            h.update(&g);
            after
        }
        _ => rest,
    };
    match rest.split_at_checked(BTH_MASKED_BYTE) {
        Some((head, tail)) if !tail.is_empty() => {
            h.update(head);
            h.update(&[0xFF]);
            h.update(tail.get(1..).unwrap_or_default());
        }
        _ => h.update(rest),
    }
    h.finalize()
}

/// Appends a native IB packet to `out`: the LRH of `addr`, its GRH if any, the transport part
/// of `repr` with `payload`, the ICRC and the VCRC.
pub fn emit_ib_append(repr: &RoceRepr, payload: &[u8], addr: &IbAddressing, out: &mut Vec<u8>) {
    let start = out.len();
    let grh_len = if addr.grh.is_some() { IB_GRH_LEN } else { 0 };
    // Header room first; the lengths are known once the transport part is written.
    out.resize(start + LRH_LEN + grh_len, 0);
    repr.emit_transport_append(payload, out);
    let transport_len = out.len() - start - LRH_LEN - grh_len;
    let total = LRH_LEN + grh_len + transport_len + ICRC_LEN;
    let lrh = Lrh {
        vl: 0,
        sl: addr.sl & 0x0F,
        lnh: if addr.grh.is_some() {
            Lnh::IbaGlobal
        } else {
            Lnh::IbaLocal
        },
        dlid: addr.dlid,
        pkt_len_words: lrh::pkt_len_words(total).unwrap_or(lrh::MAX_PKT_LEN_WORDS),
        slid: addr.slid,
    };
    if let Some(h) = out.get_mut(start..start + LRH_LEN) {
        h.copy_from_slice(&lrh.to_bytes());
    }
    if let Some(g) = addr.grh {
        let g = IbGrh {
            payload_len: u16::try_from(transport_len + ICRC_LEN).unwrap_or(u16::MAX),
            next_header: NEXT_HEADER_IBA,
            ..g
        };
        if let Some(h) = out.get_mut(start + LRH_LEN..start + LRH_LEN + IB_GRH_LEN) {
            h.copy_from_slice(&g.to_bytes());
        }
    }
    let icrc = ib_icrc(out.get(start..).unwrap_or_default(), addr.grh.is_some());
    out.extend_from_slice(&icrc.to_le_bytes());
    let vcrc = lrh::vcrc(out.get(start..).unwrap_or_default());
    out.extend_from_slice(&vcrc.to_le_bytes());
}

/// Checks and splits a received native IB packet: LRH (version 0, an IBA transport next),
/// PktLen equal to the datagram's length, VCRC, ICRC.
///
/// # Errors
///
/// [`IbPacketError`] for the first check that fails.
pub fn parse_ib(datagram: &[u8]) -> Result<IbFrame<'_>, IbPacketError> {
    let head = datagram
        .first_chunk::<LRH_LEN>()
        .ok_or(IbPacketError::Truncated)?;
    if Lrh::lver(head) != 0 {
        return Err(IbPacketError::Unsupported);
    }
    let lrh = Lrh::from_bytes(head);
    let global = match lrh.lnh {
        Lnh::IbaLocal => false,
        Lnh::IbaGlobal => true,
        Lnh::Raw | Lnh::IpNonIba => return Err(IbPacketError::Unsupported),
    };
    let grh_len = if global { IB_GRH_LEN } else { 0 };
    if datagram.len() < LRH_LEN + grh_len + super::bth::Bth::HEADER_LEN + ICRC_LEN + VCRC_LEN {
        return Err(IbPacketError::Truncated);
    }
    if lrh.pkt_len_bytes() + VCRC_LEN != datagram.len() {
        return Err(IbPacketError::BadLength);
    }
    if !lrh::verify_vcrc(datagram) {
        return Err(IbPacketError::BadVcrc);
    }
    let body_end = datagram.len() - VCRC_LEN;
    let icrc_at = body_end - ICRC_LEN;
    let (covered, icrc) = (
        datagram.get(..icrc_at).unwrap_or_default(),
        datagram.get(icrc_at..body_end).unwrap_or_default(),
    );
    let got = icrc
        .first_chunk::<ICRC_LEN>()
        .map(|b| u32::from_le_bytes(*b))
        .ok_or(IbPacketError::Truncated)?;
    if ib_icrc(covered, global) != got {
        return Err(IbPacketError::BadIcrc);
    }
    let grh = datagram
        .get(LRH_LEN..)
        .and_then(|r| r.first_chunk::<IB_GRH_LEN>())
        .filter(|_| global)
        .map(IbGrh::from_bytes);
    let transport = datagram
        .get(LRH_LEN + grh_len..body_end)
        .ok_or(IbPacketError::Truncated)?;
    Ok(IbFrame {
        lrh,
        grh,
        transport,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::bth::tests::arb_bth;
    use crate::wire::bth::{Bth, Opcode};
    use crate::wire::ext::Deth;
    use crate::wire::roce::RocePacket;
    use proptest::prelude::*;

    fn ud(dest_qp: u32, qkey: u32) -> RoceRepr {
        let mut r = RoceRepr::new(Bth::new(Opcode::UD_SEND_ONLY, dest_qp, 7));
        r.deth = Some(Deth { qkey, src_qp: 0x48 });
        r
    }

    /// Subnet-local addressing (no GRH) from LID 2 to `dlid`.
    fn local(dlid: u16) -> IbAddressing {
        IbAddressing {
            sl: 0,
            dlid,
            slid: 2,
            grh: None,
        }
    }

    fn gid(last: u8) -> Gid {
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        g[15] = last;
        Gid(g)
    }

    #[test]
    fn a_local_packet_is_lrh_bth_deth_payload_icrc_vcrc() {
        let mut out = Vec::new();
        let addr = IbAddressing {
            sl: 3,
            dlid: 4,
            slid: 2,
            grh: None,
        };
        emit_ib_append(&ud(0x49, 0x0B1B), b"hello", &addr, &mut out);
        // 8 + 12 + 8 + 5 + 3 pad + 4 + 2.
        assert_eq!(out.len(), 42);
        let f = parse_ib(&out).expect("parses");
        assert_eq!((f.lrh.sl, f.lrh.dlid, f.lrh.slid), (3, 4, 2));
        assert_eq!(f.lrh.lnh, Lnh::IbaLocal);
        assert_eq!(f.lrh.pkt_len_bytes(), 40);
        assert_eq!(f.grh, None);
        let p = RocePacket::parse(f.transport).expect("transport");
        assert_eq!(p.bth.dest_qp, 0x49);
        assert_eq!(p.deth.map(|d| d.qkey), Some(0x0B1B));
        assert_eq!(p.payload, b"hello");
    }

    #[test]
    fn a_multicast_packet_carries_its_grh() {
        let mut out = Vec::new();
        let mgid = Gid([
            0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff,
        ]);
        let addr = IbAddressing {
            sl: 0,
            dlid: 0xC000,
            slid: 2,
            grh: Some(IbGrh {
                tclass: 0,
                flow_label: 0,
                payload_len: 0,
                next_header: 0,
                hop_limit: 1,
                sgid: gid(2),
                dgid: mgid,
            }),
        };
        emit_ib_append(&ud(0xFF_FFFF, 0x0B1B), b"arp", &addr, &mut out);
        let f = parse_ib(&out).expect("parses");
        let g = f.grh.expect("grh");
        assert_eq!(
            (g.sgid, g.dgid, g.next_header),
            (gid(2), mgid, NEXT_HEADER_IBA)
        );
        assert_eq!(usize::from(g.payload_len), f.transport.len());
        assert_eq!(f.lrh.lnh, Lnh::IbaGlobal);
    }

    #[test]
    fn what_a_switch_may_change_is_outside_the_icrc() {
        let mut out = Vec::new();
        let addr = local(4);
        emit_ib_append(&ud(0x49, 1), b"x", &addr, &mut out);
        let n = out.len();
        let icrc = ib_icrc(&out[..n - 6], false);
        // A new VL and FECN/BECN: the ICRC holds, the VCRC is recomputed per hop.
        out[0] = (out[0] & 0x0F) | 0x50;
        out[8 + 4] = 0xC0;
        assert_eq!(ib_icrc(&out[..n - 6], false), icrc);
        // The DLID is covered.
        out[3] ^= 1;
        assert_ne!(ib_icrc(&out[..n - 6], false), icrc);
    }

    #[test]
    fn damaged_packets_are_refused_by_the_right_check() {
        let mut out = Vec::new();
        let addr = local(4);
        emit_ib_append(&ud(0x49, 1), b"payload!", &addr, &mut out);
        assert_eq!(parse_ib(&out[..7]), Err(IbPacketError::Truncated));
        assert_eq!(
            parse_ib(&out[..out.len() - 4]),
            Err(IbPacketError::BadLength)
        );
        let mut bad = out.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert_eq!(parse_ib(&bad), Err(IbPacketError::BadVcrc));
        // A payload bit and a VCRC made good again: the ICRC catches it.
        let mut bad = out.clone();
        bad[30] ^= 1;
        let n = bad.len();
        let v = lrh::vcrc(&bad[..n - 2]);
        bad[n - 2..].copy_from_slice(&v.to_le_bytes());
        assert_eq!(parse_ib(&bad), Err(IbPacketError::BadIcrc));
        let mut raw = out.clone();
        raw[1] &= !0b11;
        assert_eq!(parse_ib(&raw), Err(IbPacketError::Unsupported));
    }

    proptest! {
        #[test]
        fn parsing_never_panics(buf in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse_ib(&buf);
            let _ = ib_icrc(&buf, true);
        }

        #[test]
        fn what_is_emitted_parses_back(
            bth in arb_bth(),
            payload in proptest::collection::vec(any::<u8>(), 0..300),
            sl in 0u8..16, dlid: u16, slid: u16, global: bool,
        ) {
            let mut bth = bth;
            bth.opcode = Opcode::UD_SEND_ONLY;
            let mut r = RoceRepr::new(bth);
            r.deth = Some(Deth { qkey: 1, src_qp: 2 });
            let grh = global.then_some(IbGrh {
                tclass: 0, flow_label: 0, payload_len: 0, next_header: 0, hop_limit: 1,
                sgid: gid(1), dgid: gid(9),
            });
            let addr = IbAddressing { sl, dlid, slid, grh };
            let mut out = Vec::new();
            emit_ib_append(&r, &payload, &addr, &mut out);
            let f = parse_ib(&out).expect("parses");
            prop_assert_eq!((f.lrh.sl, f.lrh.dlid, f.lrh.slid), (sl, dlid, slid));
            let p = RocePacket::parse(f.transport).expect("transport");
            prop_assert_eq!(p.payload, &payload[..]);
        }
    }
}
