//! IP classification for the data path: what the daemon needs to know about a packet read
//! from the TUN device (or received from a peer) to encapsulate and route it.
//!
//! The header is checked for consistency (version, header length, total length within the
//! buffer) but not for its checksum, options or extension headers; the kernel checks the rest
//! when the packet reaches its IP stack.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{IpoibError, Result, ETHERTYPE_IPV4, ETHERTYPE_IPV6};
use crate::wire::field::{head, Bytes};

/// The IP version of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpVersion {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl IpVersion {
    /// The EtherType that goes in the [`IpoibHeader`](super::IpoibHeader).
    #[must_use]
    pub const fn ethertype(self) -> u16 {
        match self {
            Self::V4 => ETHERTYPE_IPV4,
            Self::V6 => ETHERTYPE_IPV6,
        }
    }
}

/// What [`classify`] found out about an IP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpInfo {
    /// IPv4 or IPv6.
    pub version: IpVersion,
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Length of the packet according to its header (IPv4 total length; 40 + IPv6 payload
    /// length). Bytes of the buffer after it are not part of the packet.
    pub total_len: usize,
    /// Length of the IP header: IHL × 4 for IPv4 (options included); 40 for IPv6 (extension
    /// headers are not walked; they belong to the payload).
    pub header_len: usize,
    /// The IPv4 Protocol or the IPv6 Next Header field (6 TCP, 17 UDP, 1 ICMP, 58 ICMPv6, 0
    /// hop-by-hop options, …).
    pub protocol: u8,
}

impl IpInfo {
    /// True if the destination is multicast or broadcast: such packets go over UD to a
    /// multicast group, never over a CM connection. See [`is_multicast_or_broadcast`].
    #[must_use]
    pub fn is_multicast_or_broadcast(&self) -> bool {
        is_multicast_or_broadcast(self.dst)
    }

    /// The packet's payload after the IP header (up to `total_len`), from the buffer that
    /// was classified; `None` if `packet` is not that buffer (too short).
    #[must_use]
    pub fn payload<'a>(&self, packet: &'a [u8]) -> Option<&'a [u8]> {
        packet.get(self.header_len..self.total_len)
    }
}

/// True for IPv4 multicast (224.0.0.0/4) and limited broadcast (255.255.255.255), and IPv6
/// multicast (ff00::/8). A subnet-directed IPv4 broadcast depends on the interface's prefix
/// and is not recognised here.
#[must_use]
pub const fn is_multicast_or_broadcast(dst: IpAddr) -> bool {
    match dst {
        IpAddr::V4(a) => a.is_multicast() || a.is_broadcast(),
        IpAddr::V6(a) => a.is_multicast(),
    }
}

/// Minimum IPv4 header length.
const IPV4_MIN_HEADER_LEN: usize = 20;

/// IPv6 header length.
const IPV6_HEADER_LEN: usize = 40;

/// Classifies the IP packet at the start of `packet` (no link header). Never panics.
///
/// # Errors
///
/// - [`IpoibError::Truncated`] if `packet` is shorter than the fixed header, than the IPv4
///   header length, or than the total length the header claims.
/// - [`IpoibError::BadIpVersion`] if the version nibble is neither 4 nor 6.
/// - [`IpoibError::BadIpHeaderLen`] if the IPv4 IHL is below 5 or the IPv4 total length is
///   below the header length.
pub fn classify(packet: &[u8]) -> Result<IpInfo> {
    let first = *packet.first().ok_or(IpoibError::Truncated)?;
    match first >> 4 {
        4 => classify_v4(packet),
        6 => classify_v6(packet),
        v => Err(IpoibError::BadIpVersion(v)),
    }
}

/// [`classify`] for IPv4.
fn classify_v4(packet: &[u8]) -> Result<IpInfo> {
    let h = packet
        .first_chunk::<IPV4_MIN_HEADER_LEN>()
        .ok_or(IpoibError::Truncated)?;
    let ihl = h[0] & 0x0f;
    let header_len = usize::from(ihl) * 4;
    let total_len = usize::from(h.be16::<2>());
    if header_len < IPV4_MIN_HEADER_LEN || total_len < header_len {
        return Err(IpoibError::BadIpHeaderLen(ihl));
    }
    if total_len > packet.len() {
        return Err(IpoibError::Truncated);
    }
    Ok(IpInfo {
        version: IpVersion::V4,
        src: IpAddr::V4(Ipv4Addr::new(h[12], h[13], h[14], h[15])),
        dst: IpAddr::V4(Ipv4Addr::new(h[16], h[17], h[18], h[19])),
        total_len,
        header_len,
        protocol: h[9],
    })
}

/// [`classify`] for IPv6.
fn classify_v6(packet: &[u8]) -> Result<IpInfo> {
    let h = head::<IPV6_HEADER_LEN>(packet).ok_or(IpoibError::Truncated)?;
    let total_len = IPV6_HEADER_LEN + usize::from(h.be16::<4>());
    if total_len > packet.len() {
        return Err(IpoibError::Truncated);
    }
    Ok(IpInfo {
        version: IpVersion::V6,
        src: IpAddr::V6(Ipv6Addr::from(h.bytes::<8, 16>())),
        dst: IpAddr::V6(Ipv6Addr::from(h.bytes::<24, 16>())),
        total_len,
        header_len: IPV6_HEADER_LEN,
        protocol: h[6],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ipoib::nd::NeighborSolicitation;
    use crate::wire::ipoib::HwAddr;
    use proptest::prelude::*;

    /// A 20-byte-header IPv4 packet with `payload_len` bytes of UDP payload.
    fn v4(src: [u8; 4], dst: [u8; 4], payload_len: usize) -> Vec<u8> {
        let total = (20 + payload_len) as u16;
        let t = total.to_be_bytes();
        let mut p = vec![0x45, 0, t[0], t[1], 0, 0, 0x40, 0, 64, 17, 0, 0];
        p.extend_from_slice(&src);
        p.extend_from_slice(&dst);
        p.resize(usize::from(total), 0xAB);
        p
    }

    #[test]
    fn ipv4_unicast_and_multicast() {
        let p = v4([198, 19, 0, 1], [198, 19, 0, 2], 8);
        let i = classify(&p).unwrap();
        assert_eq!(i.version, IpVersion::V4);
        assert_eq!(i.version.ethertype(), 0x0800);
        assert_eq!(i.src, IpAddr::from([198, 19, 0, 1]));
        assert_eq!(i.dst, IpAddr::from([198, 19, 0, 2]));
        assert_eq!((i.total_len, i.header_len, i.protocol), (28, 20, 17));
        assert!(!i.is_multicast_or_broadcast());
        assert_eq!(i.payload(&p), Some(&[0xAB; 8][..]));

        for dst in [[224, 0, 0, 1], [239, 255, 255, 250], [255, 255, 255, 255]] {
            let i = classify(&v4([198, 19, 0, 1], dst, 0)).unwrap();
            assert!(i.is_multicast_or_broadcast(), "{dst:?}");
        }
        // Trailing bytes beyond the total length are allowed.
        let mut long = p.clone();
        long.extend_from_slice(&[0; 4]);
        assert_eq!(classify(&long), Ok(i));
    }

    #[test]
    fn ipv4_options_and_errors() {
        let mut p = v4([10, 0, 0, 1], [10, 0, 0, 2], 8);
        p[0] = 0x46; // IHL 6: 4 bytes of options, payload shrinks to 4
        assert_eq!(classify(&p).unwrap().header_len, 24);
        p[0] = 0x44;
        assert_eq!(classify(&p), Err(IpoibError::BadIpHeaderLen(4)));
        p[0] = 0x4f; // 60-byte header > 28 total
        assert_eq!(classify(&p), Err(IpoibError::BadIpHeaderLen(15)));
        let p = v4([10, 0, 0, 1], [10, 0, 0, 2], 8);
        assert_eq!(classify(&p[..27]), Err(IpoibError::Truncated));
        assert_eq!(classify(&p[..19]), Err(IpoibError::Truncated));
        assert_eq!(classify(&[]), Err(IpoibError::Truncated));
        assert_eq!(classify(&[0x55; 40]), Err(IpoibError::BadIpVersion(5)));
    }

    #[test]
    fn ipv6() {
        let ns = NeighborSolicitation::new(
            "fe80::1".parse().unwrap(),
            HwAddr::BROADCAST,
            "fe80::2".parse().unwrap(),
        );
        let p = ns.to_packet();
        let i = classify(&p).unwrap();
        assert_eq!(i.version, IpVersion::V6);
        assert_eq!(i.version.ethertype(), 0x86DD);
        assert_eq!(i.src, "fe80::1".parse::<IpAddr>().unwrap());
        assert_eq!(i.dst, "ff02::1:ff00:2".parse::<IpAddr>().unwrap());
        assert_eq!((i.total_len, i.header_len, i.protocol), (88, 40, 58));
        assert!(i.is_multicast_or_broadcast());
        assert_eq!(i.payload(&p).map(<[u8]>::len), Some(48));
        assert_eq!(classify(&p[..87]), Err(IpoibError::Truncated));
        assert_eq!(classify(&p[..39]), Err(IpoibError::Truncated));
        assert!(!is_multicast_or_broadcast("fe80::1".parse().unwrap()));
    }

    proptest! {
        #[test]
        fn ipv4_round_trip(src in any::<[u8; 4]>(), dst in any::<[u8; 4]>(), n in 0usize..64) {
            let p = v4(src, dst, n);
            let i = classify(&p)?;
            prop_assert_eq!(i.src, IpAddr::from(src));
            prop_assert_eq!(i.dst, IpAddr::from(dst));
            prop_assert_eq!(i.total_len, 20 + n);
            prop_assert_eq!(i.is_multicast_or_broadcast(), dst[0] >> 4 == 14 || dst == [255; 4]);
        }

        #[test]
        fn never_panics(b in proptest::collection::vec(any::<u8>(), 0..100)) {
            if let Ok(i) = classify(&b) {
                prop_assert!(i.total_len <= b.len());
                prop_assert!(i.header_len <= i.total_len);
                prop_assert!(i.payload(&b).is_some());
            }
        }

        #[test]
        fn never_panics_versioned(v in prop_oneof![Just(0x40u8), Just(0x60u8)], b in proptest::collection::vec(any::<u8>(), 0..100)) {
            let mut p = b;
            if let Some(f) = p.first_mut() {
                *f = v | (*f & 0x0f);
            }
            if let Ok(i) = classify(&p) {
                prop_assert!(i.header_len <= i.total_len && i.total_len <= p.len());
            }
        }
    }
}
