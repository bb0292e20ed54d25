//! The 40-byte GRH area at the start of every UD receive buffer.
//!
//! A UD receive completes with the packet's network header in front of the payload. On
//! RoCEv2 over IPv6 (and on native InfiniBand, whose GRH has the same layout) that is the
//! 40-byte IPv6 header; on RoCEv2 over IPv4 it is 20 zero bytes and then the 20-byte IPv4
//! header, as RoCEv2 HCAs and rxe write it.
//!
//! ```text
//! IPv6 form:  0          4        6     7     8          24         40
//!            +----------+--------+-----+-----+----------+----------+
//!            | V TC FL  | PayLen | NxH | HLm |   SGID   |   DGID   |
//!            +----------+--------+-----+-----+----------+----------+
//!
//! IPv4 form:  0          20   22     24  26   28  29  30   32    36    40
//!            +----------+----+------+---+----+---+---+----+-----+-----+
//!            | zero     | VI | TLen |ID |Flg |TTL|Pro|Csum| Src | Dst |
//!            +----------+----+------+---+----+---+---+----+-----+-----+
//! ```
//!
//! [`GrhRepr`] is the parse/emit pair; [`grh_source_gid`] reads just the sender.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::bth::Bth;
use super::ext::Deth;
use super::field::{emit_head, Bytes};
use super::Gid;
use super::{Result, WireError, ICRC_LEN};

/// Size of the GRH area at the start of every UD receive buffer.
pub const GRH_LEN: usize = 40;

/// Byte offsets inside the GRH area (each field's width is in the access that reads it).
mod offset {
    /// IPv6 form: the payload length (what follows the 40-byte header), 2 bytes.
    pub(super) const V6_PAYLOAD_LEN: usize = 4;
    /// IPv6 form: the next header.
    pub(super) const V6_NEXT_HEADER: usize = 6;
    /// IPv6 form: the hop limit.
    pub(super) const V6_HOP_LIMIT: usize = 7;
    /// IPv6 form: the source address (SGID), 16 bytes.
    pub(super) const V6_SRC: usize = 8;
    /// IPv6 form: the destination address (DGID), 16 bytes.
    pub(super) const V6_DST: usize = 24;

    /// IPv4 form: the 20 zero bytes in front of the IPv4 header.
    pub(super) const V4_PAD: usize = 0;
    /// IPv4 form: version and header length.
    pub(super) const V4_VER_IHL: usize = 20;
    /// IPv4 form: the total length (IPv4 header included), 2 bytes.
    pub(super) const V4_TOTAL_LEN: usize = 22;
    /// IPv4 form: the flags byte (DF is `0x40`).
    pub(super) const V4_FLAGS: usize = 26;
    /// IPv4 form: the time to live.
    pub(super) const V4_TTL: usize = 28;
    /// IPv4 form: the protocol.
    pub(super) const V4_PROTOCOL: usize = 29;
    /// IPv4 form: the source address, 4 bytes.
    pub(super) const V4_SRC: usize = 32;
    /// IPv4 form: the destination address, 4 bytes.
    pub(super) const V4_DST: usize = 36;
}

/// Version 4, five 32-bit words of header: the only IPv4 header the IPv4 form holds.
const IPV4_VERSION_IHL: u8 = 0x45;
/// Version 6 in the top nibble, traffic class and flow label 0.
const V6_VERSION: u8 = 0x60;
/// Length of the IPv4 header inside the IPv4 form.
const V4_HEADER_LEN: u16 = 20;
/// The IP protocol / next header of RoCEv2: UDP.
const IPPROTO_UDP: u8 = 17;
/// TTL and hop limit written on emit.
const HOP_LIMIT: u8 = 64;
/// The IPv4 "don't fragment" flag in the flags byte.
const V4_DONT_FRAGMENT: u8 = 0x40;
/// Size of a UDP header.
const UDP_HEADER_LEN: usize = 8;

/// What a GRH area says: the packet's source and destination and the length of the UDP
/// datagram that followed the IP header.
///
/// An IPv4 form parses to IPv4 addresses; anything else is read as the IPv6 form, whose
/// addresses are GIDs (IPv4-mapped ones included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GrhRepr {
    /// The sender's address.
    pub src: IpAddr,
    /// The address the packet was sent to.
    pub dst: IpAddr,
    /// Bytes after the IP header: the IPv6 payload length, or the IPv4 total length less the
    /// IPv4 header.
    pub udp_len: u16,
}

impl GrhRepr {
    /// The GRH area of a RoCEv2 UD receive of `payload_len` bytes from `src` to `dst`. The
    /// UDP length is that of the datagram that carried it: UDP header, BTH, DETH, payload and
    /// ICRC (an immediate is not counted), saturating at `u16::MAX`.
    #[must_use]
    pub fn rocev2_ud(src: IpAddr, dst: IpAddr, payload_len: usize) -> Self {
        let udp_len = UDP_HEADER_LEN + Bth::HEADER_LEN + Deth::HEADER_LEN + payload_len + ICRC_LEN;
        Self {
            src,
            dst,
            udp_len: u16::try_from(udp_len).unwrap_or(u16::MAX),
        }
    }

    /// Decodes the first [`GRH_LEN`] bytes of `buf`. The IPv4 form is recognised by its 20
    /// zero bytes and a `0x45` version byte; everything else is taken as the IPv6 form without
    /// checking its version, next header or hop limit.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if `buf` is shorter than [`GRH_LEN`].
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let b = buf.first_chunk::<GRH_LEN>().ok_or(WireError::Truncated)?;
        Ok(Self::from_bytes(b))
    }

    /// Decodes exactly [`GRH_LEN`] bytes (see [`parse`](Self::parse)).
    #[must_use]
    pub fn from_bytes(b: &[u8; GRH_LEN]) -> Self {
        use offset::*;
        let is_v4 = b[V4_VER_IHL] == IPV4_VERSION_IHL && b.bytes::<V4_PAD, 20>() == [0; 20];
        if is_v4 {
            Self {
                src: IpAddr::V4(Ipv4Addr::from(b.bytes::<V4_SRC, 4>())),
                dst: IpAddr::V4(Ipv4Addr::from(b.bytes::<V4_DST, 4>())),
                udp_len: b.be16::<V4_TOTAL_LEN>().saturating_sub(V4_HEADER_LEN),
            }
        } else {
            Self {
                src: IpAddr::V6(Ipv6Addr::from(b.bytes::<V6_SRC, 16>())),
                dst: IpAddr::V6(Ipv6Addr::from(b.bytes::<V6_DST, 16>())),
                udp_len: b.be16::<V6_PAYLOAD_LEN>(),
            }
        }
    }

    /// Encodes the GRH area: the IPv4 form when both addresses are IPv4, otherwise the IPv6
    /// form (an IPv4 address then as its IPv4-mapped GID). Unwritten bytes (traffic class,
    /// flow label, IP ID, checksum) are zero.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; GRH_LEN] {
        use offset::*;
        let mut b = [0u8; GRH_LEN];
        match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                b[V4_VER_IHL] = IPV4_VERSION_IHL;
                b.put_be16::<V4_TOTAL_LEN>(self.udp_len.saturating_add(V4_HEADER_LEN));
                b[V4_FLAGS] = V4_DONT_FRAGMENT;
                b[V4_TTL] = HOP_LIMIT;
                b[V4_PROTOCOL] = IPPROTO_UDP;
                b.put_bytes::<V4_SRC, 4>(s.octets());
                b.put_bytes::<V4_DST, 4>(d.octets());
            }
            (s, d) => {
                b[0] = V6_VERSION;
                b.put_be16::<V6_PAYLOAD_LEN>(self.udp_len);
                b[V6_NEXT_HEADER] = IPPROTO_UDP;
                b[V6_HOP_LIMIT] = HOP_LIMIT;
                b.put_bytes::<V6_SRC, 16>(Gid::from_ip(s).0);
                b.put_bytes::<V6_DST, 16>(Gid::from_ip(d).0);
            }
        }
        b
    }

    /// Writes the GRH area into the first [`GRH_LEN`] bytes of `buf`.
    ///
    /// # Panics
    ///
    /// If `buf` is shorter than [`GRH_LEN`].
    #[track_caller]
    pub fn emit(&self, buf: &mut [u8]) {
        emit_head(buf, &self.to_bytes());
    }
}

/// The source GID of a UD receive, read from its GRH area (`None` if `grh` is shorter than
/// [`GRH_LEN`]). An IPv4 source comes back as its IPv4-mapped GID.
#[must_use]
pub fn grh_source_gid(grh: &[u8]) -> Option<Gid> {
    GrhRepr::parse(grh).ok().map(|g| Gid::from_ip(g.src))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const V4_SRC: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const V4_DST: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    #[test]
    fn ipv4_form_bytes() {
        let g = GrhRepr::rocev2_ud(V4_SRC.into(), V4_DST.into(), 100);
        // UDP 8 + BTH 12 + DETH 8 + 100 + ICRC 4.
        assert_eq!(g.udp_len, 132);
        let b = g.to_bytes();
        let mut want = [0u8; GRH_LEN];
        want[20..40].copy_from_slice(&[
            0x45, 0, 0, 152, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ]);
        assert_eq!(b, want);
        assert_eq!(GrhRepr::parse(&b), Ok(g));
        assert_eq!(
            grh_source_gid(&b),
            Some(Gid::from(Ipv4Addr::new(10, 0, 0, 1)))
        );
    }

    #[test]
    fn ipv6_form_bytes() {
        let s: Ipv6Addr = "fd00::1".parse().unwrap();
        let d: Ipv6Addr = "fd00::2".parse().unwrap();
        let g = GrhRepr::rocev2_ud(s.into(), d.into(), 0);
        let b = g.to_bytes();
        assert_eq!(&b[..8], &[0x60, 0, 0, 0, 0, 32, 17, 64]);
        assert_eq!(&b[8..24], &s.octets());
        assert_eq!(&b[24..40], &d.octets());
        assert_eq!(GrhRepr::parse(&b), Ok(g));
        assert_eq!(grh_source_gid(&b), Some(Gid(s.octets())));
    }

    #[test]
    fn mixed_families_use_the_ipv6_form_with_mapped_gids() {
        let d: Ipv6Addr = "fd00::2".parse().unwrap();
        let b = GrhRepr::rocev2_ud(V4_SRC.into(), d.into(), 0).to_bytes();
        assert_eq!(b[0], 0x60);
        assert_eq!(&b[8..24], &V4_SRC.to_ipv6_mapped().octets());
        assert_eq!(grh_source_gid(&b), Some(Gid::from(V4_SRC)));
    }

    #[test]
    fn an_ib_grh_reads_as_the_ipv6_form() {
        // Native IB: version 6, next header 0x1B (BTH), hop limit 0; the SGID is a link-local
        // GID, not an IP address.
        let mut b = [0u8; GRH_LEN];
        b[0] = 0x60;
        b[4..6].copy_from_slice(&64u16.to_be_bytes());
        b[6] = 0x1B;
        let sgid = [0xFE, 0x80, 0, 0, 0, 0, 0, 0, 0, 2, 0xC9, 3, 0, 1, 2, 3];
        b[8..24].copy_from_slice(&sgid);
        let g = GrhRepr::parse(&b).unwrap();
        assert_eq!(g.udp_len, 64);
        assert_eq!(grh_source_gid(&b), Some(Gid(sgid)));
    }

    #[test]
    fn the_ipv4_form_needs_its_zero_prefix() {
        let mut b = GrhRepr::rocev2_ud(V4_SRC.into(), V4_DST.into(), 0).to_bytes();
        b[3] = 1;
        // No longer the IPv4 form: bytes 8..24 are the source.
        assert!(matches!(GrhRepr::parse(&b).unwrap().src, IpAddr::V6(_)));
        assert_eq!(
            grh_source_gid(&b).unwrap().0,
            <[u8; 16]>::try_from(&b[8..24]).unwrap()
        );
    }

    #[test]
    fn short_buffers_are_truncated() {
        assert_eq!(GrhRepr::parse(&[0u8; 39]), Err(WireError::Truncated));
        assert_eq!(grh_source_gid(&[0u8; 39]), None);
        assert_eq!(grh_source_gid(&[]), None);
    }

    #[test]
    fn udp_length_saturates() {
        let g = GrhRepr::rocev2_ud(V4_SRC.into(), V4_DST.into(), 1 << 20);
        assert_eq!(g.udp_len, u16::MAX);
        let b = g.to_bytes();
        assert_eq!(&b[22..24], &[0xFF, 0xFF]);
    }

    #[test]
    #[should_panic(expected = "does not fit")]
    fn emit_into_short_buffer_panics() {
        GrhRepr::rocev2_ud(V4_SRC.into(), V4_DST.into(), 0).emit(&mut [0u8; 39]);
    }

    fn same_family() -> impl Strategy<Value = (IpAddr, IpAddr, u16)> {
        prop_oneof![
            (
                any::<[u8; 4]>(),
                any::<[u8; 4]>(),
                0..=u16::MAX - V4_HEADER_LEN
            )
                .prop_map(|(s, d, l)| (
                    Ipv4Addr::from(s).into(),
                    Ipv4Addr::from(d).into(),
                    l
                )),
            (any::<[u8; 16]>(), any::<[u8; 16]>(), any::<u16>()).prop_map(|(s, d, l)| (
                Ipv6Addr::from(s).into(),
                Ipv6Addr::from(d).into(),
                l
            )),
        ]
    }

    proptest! {
        #[test]
        fn round_trip((src, dst, udp_len) in same_family(),
                      tail in proptest::collection::vec(any::<u8>(), 0..8)) {
            let g = GrhRepr { src, dst, udp_len };
            let mut buf = vec![0xEEu8; GRH_LEN];
            buf.extend_from_slice(&tail);
            g.emit(&mut buf);
            prop_assert_eq!(&buf[GRH_LEN..], &tail[..]);
            prop_assert_eq!(GrhRepr::parse(&buf)?, g);
            prop_assert_eq!(grh_source_gid(&buf), Some(Gid::from_ip(src)));
        }

        #[test]
        fn parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..48)) {
            match GrhRepr::parse(&b) {
                Ok(_) => prop_assert!(b.len() >= GRH_LEN),
                Err(e) => {
                    prop_assert_eq!(e, WireError::Truncated);
                    prop_assert!(b.len() < GRH_LEN);
                }
            }
        }
    }
}
