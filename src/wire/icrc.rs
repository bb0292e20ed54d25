//! The RoCEv2 invariant CRC (ICRC), exactly as Linux `rdma_rxe` computes it
//! (`rxe_icrc.c`), which scapy's `contrib/roce.py` agrees with.
//!
//! The ICRC is the standard reflected CRC-32 (zlib's, polynomial `0xEDB88320`) over:
//!
//! 1. eight `0xFF` bytes, standing in for the InfiniBand LRH;
//! 2. the IP header, with the fields routers may change set to all ones: IPv4 TOS, TTL and
//!    header checksum; IPv6 traffic class, flow label and hop limit;
//! 3. the UDP header, with the checksum set to `0xFFFF`;
//! 4. the BTH, with byte 4 (FECN, BECN, resv6a) set to `0xFF`;
//! 5. the remaining transport headers, the payload and the pad bytes.
//!
//! It is appended **little-endian** (least significant byte first): the four bytes on the wire
//! are `compute_icrc(..).to_le_bytes()`. [`append_icrc`] and [`read_icrc`] do that.
//!
//! The masked fields are not needed to compute it, so [`IpHeaderInfo`] carries only what is
//! covered. Lengths are derived from the transport bytes. Note that the IPv4
//! **Identification** is covered, and a receiver on a plain UDP socket cannot see it: it
//! checks with ID 0 and, when that fails, solves for the one ID that explains the received
//! ICRC ([`Ipv4IdShift::solve`]), which leaves a false-accept probability of 2^-16 per
//! corrupted IPv4 packet instead of 2^-32 (derived in `ipv4_id`'s docs, see [`Ipv4IdShift`]).

use core::net::{Ipv4Addr, Ipv6Addr};

use crc32fast::Hasher;

use super::bth::Bth;
use super::field::Bytes;

mod ipv4_id;

pub use ipv4_id::{shift_icrc, Ipv4IdShift, Ipv4IdShiftCache, GSO_MAX_SEGMENTS};

/// Bytes of the ICRC trailer.
pub const ICRC_LEN: usize = 4;

/// UDP header length.
const UDP_HEADER_LEN: usize = 8;

/// IP protocol / next header number of UDP.
const IPPROTO_UDP: u8 = 17;

/// The IP header fields the ICRC covers.
///
/// Version, header length (20 bytes, no options), protocol (UDP) and the length fields are
/// implied. TOS/traffic class, TTL/hop limit, the IPv4 checksum and the flow label are masked
/// to all ones in the ICRC, so they are not needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpHeaderInfo {
    /// IPv4 without options; fragment offset 0, MF clear.
    V4 {
        /// Source address.
        src: Ipv4Addr,
        /// Destination address.
        dst: Ipv4Addr,
        /// The Identification field as sent. Linux writes 0 for an unconnected UDP socket that
        /// sends with DF set.
        identification: u16,
        /// The DF flag as sent (rxe sets it).
        dont_fragment: bool,
    },
    /// IPv6 without extension headers.
    V6 {
        /// Source address.
        src: Ipv6Addr,
        /// Destination address.
        dst: Ipv6Addr,
    },
}

impl IpHeaderInfo {
    /// The masked IP header as fed to the CRC, for a UDP datagram of `udp_len` bytes.
    /// Returns the buffer and how many of its bytes are the header (20 or 40).
    fn masked_header(&self, udp_len: u16) -> ([u8; 40], usize) {
        let mut h = [0u8; 40];
        match *self {
            Self::V4 {
                src,
                dst,
                identification,
                dont_fragment,
            } => {
                let flags = if dont_fragment { 0x40 } else { 0x00 };
                // Version/IHL, TOS (masked).
                h.put_bytes::<0, 2>([0x45, 0xFF]);
                h.put_be16::<2>(20u16.wrapping_add(udp_len));
                h.put_be16::<4>(identification);
                // Flags and fragment offset, TTL (masked), protocol, checksum (masked).
                h.put_bytes::<6, 6>([flags, 0x00, 0xFF, IPPROTO_UDP, 0xFF, 0xFF]);
                h.put_bytes::<12, 4>(src.octets());
                h.put_bytes::<16, 4>(dst.octets());
                (h, 20)
            }
            Self::V6 { src, dst } => {
                // Version 6, then traffic class and flow label all ones.
                h.put_bytes::<0, 4>([0x6F, 0xFF, 0xFF, 0xFF]);
                h.put_be16::<4>(udp_len);
                // Next header, hop limit (masked).
                h.put_bytes::<6, 2>([IPPROTO_UDP, 0xFF]);
                h.put_bytes::<8, 16>(src.octets());
                h.put_bytes::<24, 16>(dst.octets());
                (h, 40)
            }
        }
    }
}

/// Computes the ICRC of a RoCEv2 packet.
///
/// `transport` is the UDP payload **without** the ICRC: BTH, extension headers, payload and
/// pad. The UDP length is taken as `8 + transport.len() + 4`, the IPv4 total length as
/// `20 +` that, and the IPv6 payload length as the UDP length (no options or extension
/// headers). A datagram too long for these 16-bit fields is not a valid packet; the lengths
/// then wrap and the result is meaningless, but nothing panics.
///
/// Returns the CRC as a number; it is sent as `to_le_bytes()`.
#[must_use]
pub fn compute_icrc(
    ip: &IpHeaderInfo,
    udp_src_port: u16,
    udp_dst_port: u16,
    transport: &[u8],
) -> u32 {
    let udp_len = (UDP_HEADER_LEN + transport.len() + ICRC_LEN) as u16;
    // Everything before the payload goes into one buffer and one CRC update (small updates
    // take the CRC's slow path): the LRH stand-in (rxe's seed 0xdebb20e3 is the CRC state
    // after these eight 0xFF bytes), the masked IP header, the UDP header with the checksum
    // masked, and the BTH with byte 4 (FECN, BECN, resv6a) masked.
    let mut prefix = [0xFFu8; 8 + 40 + UDP_HEADER_LEN + Bth::HEADER_LEN];
    let (ip_hdr, ip_len) = ip.masked_header(udp_len);
    // The UDP checksum (bytes 6..8) is masked.
    let mut udp = [0xFFu8; UDP_HEADER_LEN];
    udp.put_be16::<0>(udp_src_port);
    udp.put_be16::<2>(udp_dst_port);
    udp.put_be16::<4>(udp_len);
    // A shorter `transport` is not a packet; it is hashed the same way as far as it goes.
    let (bth, rest) = transport.split_at(transport.len().min(Bth::HEADER_LEN));
    let mut len = 8;
    for part in [ip_hdr.get(..ip_len).unwrap_or_default(), &udp, bth] {
        if let Some(dst) = prefix.get_mut(len..len + part.len()) {
            dst.copy_from_slice(part);
        }
        len += part.len();
    }
    if bth.len() > 4 {
        if let Some(b4) = prefix.get_mut(8 + ip_len + UDP_HEADER_LEN + 4) {
            *b4 = 0xFF;
        }
    }
    let mut crc = Hasher::new();
    crc.update(prefix.get(..len).unwrap_or_default());
    crc.update(rest);
    crc.finalize()
}

/// Appends the ICRC of `buf` (BTH … pad) to it, little-endian.
pub fn append_icrc(ip: &IpHeaderInfo, udp_src_port: u16, udp_dst_port: u16, buf: &mut Vec<u8>) {
    let icrc = compute_icrc(ip, udp_src_port, udp_dst_port, buf);
    buf.extend_from_slice(&icrc.to_le_bytes());
}

/// The ICRC trailer of a datagram (its last four bytes, little-endian), or `None` if it is
/// shorter than four bytes.
#[must_use]
pub fn read_icrc(datagram: &[u8]) -> Option<u32> {
    datagram
        .last_chunk::<ICRC_LEN>()
        .map(|b| u32::from_le_bytes(*b))
}

/// Whether the trailer of `datagram` (the whole UDP payload, BTH … ICRC) is its correct ICRC.
/// False for datagrams shorter than the ICRC.
#[must_use]
pub fn verify_icrc(
    ip: &IpHeaderInfo,
    udp_src_port: u16,
    udp_dst_port: u16,
    datagram: &[u8],
) -> bool {
    icrc_difference(ip, udp_src_port, udp_dst_port, datagram) == Some(0)
}

/// The received ICRC of `datagram` XOR the one computed for it: 0 when it is correct, the
/// [`Ipv4IdShift::delta`] of its ID when only the IPv4 ID differs from the one in `ip`. `None`
/// for datagrams shorter than the ICRC.
#[must_use]
pub fn icrc_difference(
    ip: &IpHeaderInfo,
    udp_src_port: u16,
    udp_dst_port: u16,
    datagram: &[u8],
) -> Option<u32> {
    let body_len = datagram.len().checked_sub(ICRC_LEN)?;
    let (body, _) = datagram.split_at(body_len);
    Some(read_icrc(datagram)? ^ compute_icrc(ip, udp_src_port, udp_dst_port, body))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Decodes a hex string (test helper).
    pub(crate) fn hex(s: &str) -> Vec<u8> {
        assert!(s.len() % 2 == 0);
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// §1.7 IPv4 vector: RC SEND_ONLY "hello", 10.0.0.1 → 10.0.0.2, UDP 49152 → 4791.
    pub(crate) const V4_VECTOR: &str = "4500003400004000401126b70a0000010a000002c00012b7002000000430ffff000000118000000168656c6c6f00000045516d61";
    /// §1.7 IPv6 vector: the same packet, fd00::1 → fd00::2.
    pub(crate) const V6_VECTOR: &str = "6000000000201140fd000000000000000000000000000001fd000000000000000000000000000002c00012b7002000000430ffff000000118000000168656c6c6f00000039d993da";

    pub(crate) fn v4_info() -> IpHeaderInfo {
        IpHeaderInfo::V4 {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
            identification: 0,
            dont_fragment: true,
        }
    }

    pub(crate) fn v6_info() -> IpHeaderInfo {
        IpHeaderInfo::V6 {
            src: "fd00::1".parse().unwrap(),
            dst: "fd00::2".parse().unwrap(),
        }
    }

    #[test]
    fn crc_seed_matches_rxe() {
        // rxe starts from the raw state 0xdebb20e3 = !crc32(8 x 0xFF).
        assert_eq!(!crc32fast::hash(&[0xFF; 8]), 0xdebb_20e3);
    }

    #[test]
    fn ipv4_vector() {
        let pkt = hex(V4_VECTOR);
        let (ip, udp) = pkt.split_at(20);
        let transport = &udp[8..udp.len() - 4];
        let icrc = compute_icrc(&v4_info(), 49152, 4791, transport);
        assert_eq!(icrc.to_le_bytes(), [0x45, 0x51, 0x6d, 0x61]);
        assert!(verify_icrc(&v4_info(), 49152, 4791, &udp[8..]));
        assert_eq!(read_icrc(udp), Some(icrc));

        // Our pseudo-header is the captured one with TOS, TTL and checksum masked.
        let (masked, n) = v4_info().masked_header(32);
        let mut expect = ip.to_vec();
        expect[1] = 0xFF;
        expect[8] = 0xFF;
        expect[10] = 0xFF;
        expect[11] = 0xFF;
        assert_eq!(&masked[..n], &expect[..]);
    }

    #[test]
    fn ipv6_vector() {
        let pkt = hex(V6_VECTOR);
        let (ip, udp) = pkt.split_at(40);
        let transport = &udp[8..udp.len() - 4];
        let icrc = compute_icrc(&v6_info(), 49152, 4791, transport);
        assert_eq!(icrc.to_le_bytes(), [0x39, 0xd9, 0x93, 0xda]);
        assert!(verify_icrc(&v6_info(), 49152, 4791, &udp[8..]));

        let (masked, n) = v6_info().masked_header(32);
        let mut expect = ip.to_vec();
        expect[0] |= 0x0F;
        expect[1] = 0xFF;
        expect[2] = 0xFF;
        expect[3] = 0xFF;
        expect[7] = 0xFF;
        assert_eq!(&masked[..n], &expect[..]);
    }

    #[test]
    fn covered_fields_change_the_crc() {
        let pkt = hex(V4_VECTOR);
        let dgram = &pkt[28..];
        let base = v4_info();
        assert!(verify_icrc(&base, 49152, 4791, dgram));
        let IpHeaderInfo::V4 { src, dst, .. } = base else {
            unreachable!()
        };
        let variants = [
            IpHeaderInfo::V4 {
                src,
                dst,
                identification: 1,
                dont_fragment: true,
            },
            IpHeaderInfo::V4 {
                src,
                dst,
                identification: 0,
                dont_fragment: false,
            },
            IpHeaderInfo::V4 {
                src: dst,
                dst: src,
                identification: 0,
                dont_fragment: true,
            },
        ];
        for v in variants {
            assert!(!verify_icrc(&v, 49152, 4791, dgram), "{v:?}");
        }
        assert!(!verify_icrc(&base, 49153, 4791, dgram));
        assert!(!verify_icrc(&base, 49152, 4792, dgram));
        assert!(!verify_icrc(&v6_info(), 49152, 4791, dgram));
    }

    #[test]
    fn short_inputs_do_not_panic() {
        for n in 0..16 {
            let buf = vec![0xA5u8; n];
            let _ = compute_icrc(&v4_info(), 1, 2, &buf);
            let _ = compute_icrc(&v6_info(), 1, 2, &buf);
            assert!(n >= 4 || !verify_icrc(&v4_info(), 1, 2, &buf));
            assert_eq!(read_icrc(&buf).is_some(), n >= 4);
        }
    }

    #[test]
    fn append_then_verify() {
        let mut buf = hex(V6_VECTOR)[48..48 + 20].to_vec();
        append_icrc(&v6_info(), 49152, 4791, &mut buf);
        assert_eq!(&buf[20..], &[0x39, 0xd9, 0x93, 0xda]);
        assert!(verify_icrc(&v6_info(), 49152, 4791, &buf));
    }
}
