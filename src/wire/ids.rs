//! The identifiers the wire formats carry: 24-bit QPNs and PSNs (with the PSN window
//! arithmetic), 128-bit GIDs and the path MTU enumeration.
//!
//! They live in `wire` because the codecs decode into them; `verbs` re-exports them.

use core::cmp::Ordering;
use core::fmt;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::bth::{PSN_MASK, QPN_MASK};

/// A map keyed by identifiers this process allocates itself (QPNs, CQ/SRQ/PD ids, local
/// communication ids), hashed with the unkeyed Fx hash: it costs a few instructions per lookup
/// where SipHash costs about a hundred, and these tables are looked up several times per
/// packet. A key that arrives from the wire may be looked up (a lookup's probe length is set
/// by the keys inserted, which are ours), but keys a peer chooses, such as addresses or GIDs
/// learned from ARP/ND, must never be inserted: those go in a [`PeerMap`].
pub type IdMap<K, V> = HashMap<K, V, rustc_hash::FxBuildHasher>;

/// A map whose keys a peer can choose (addresses and GIDs learned from ARP/ND), hashed with
/// foldhash under a random seed per process and per map, so that a peer cannot precompute
/// keys that collide; its lookups cost a few tens of instructions where SipHash costs a few
/// hundred for a GID.
pub type PeerMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// A 24-bit queue pair number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QpNum(u32);

impl QpNum {
    /// QP1, the General Services Interface QP that carries CM MADs.
    pub const GSI: Self = Self(1);

    /// Wraps a raw value, keeping the low 24 bits.
    pub const fn new(raw: u32) -> Self {
        Self(raw & QPN_MASK)
    }

    /// The raw 24-bit value.
    pub const fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Display for QpNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

/// A 24-bit packet sequence number with IBTA wrap-around arithmetic.
///
/// Ordering is only meaningful inside a ±2^23 window, exactly as rxe's `psn_compare`; use
/// [`Psn::cmp_window`] rather than comparing raw values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// Wraps a raw value, keeping the low 24 bits.
    pub const fn new(raw: u32) -> Self {
        Self(raw & PSN_MASK)
    }

    /// The raw 24-bit value.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// `self + n`, modulo 2^24.
    #[must_use]
    pub const fn add(self, n: u32) -> Self {
        Self::new(self.0.wrapping_add(n))
    }

    /// `self - n`, modulo 2^24.
    #[must_use]
    pub const fn sub(self, n: u32) -> Self {
        Self::new(self.0.wrapping_sub(n))
    }

    /// Signed distance `self - other` in 24-bit PSN space, in `-2^23 ..= 2^23 - 1`.
    ///
    /// Positive means `self` is after `other`. This is rxe's `psn_compare`
    /// (`(s32)((a - b) << 8)`) scaled back down, so the sign always agrees with it. Two PSNs
    /// exactly 2^23 apart compare as "before" in both directions, as in rxe.
    #[must_use]
    pub const fn diff(self, other: Self) -> i32 {
        // The 24-bit difference shifted into the top of the word, read as signed and shifted
        // back arithmetically, is the sign-extended distance.
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }

    /// Orders two PSNs within the ±2^23 window ([`diff`](Self::diff)'s sign).
    #[must_use]
    pub fn cmp_window(self, other: Self) -> Ordering {
        self.diff(other).cmp(&0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

/// A 128-bit global identifier. On RoCEv2 it is the port's IP address (IPv4 as `::ffff:a.b.c.d`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The GID for an IP address: IPv6 as is, IPv4 mapped into `::ffff:0:0/96`.
    pub fn from_ip(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Self(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => Self(v6.octets()),
        }
    }

    /// The IP address this GID stands for on RoCEv2 (IPv4-mapped GIDs become IPv4).
    pub fn to_ip(self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }

    /// The IP multicast group that carries this multicast GID on a RoCEv2 underlay of
    /// `underlay`'s family, or `None` when it has none there (or is no multicast GID).
    ///
    /// As rdma_rxe (`rdma_gid2ip`): an IPv4-mapped MGID (`::ffff:a.b.c.d`, the form rdma_cm
    /// gives RoCEv2 IPv4 groups) is the IPv4 group `a.b.c.d`; any other MGID is the IPv6
    /// multicast address with the MGID's 16 bytes. On an IPv4 underlay rxe has no address for
    /// the second kind (it would send to `0.0.0.0`), and the IPoIB groups are all of that
    /// kind, so they cross it as the organisation-local IPv4 group `239.255.X.Y`, with `X.Y`
    /// the MGID's bytes 4 and 5: the P_Key of an IPoIB MGID. Every IPoIB group of a partition
    /// (broadcast, all-nodes, solicited-node) thus shares one IPv4 group, and a receiver
    /// delivers what arrives on it to the QPs attached to any of them, as an IPoIB node that
    /// joined them all would receive it.
    pub fn multicast_group(self, underlay: IpAddr) -> Option<IpAddr> {
        let ip = match self.to_ip() {
            IpAddr::V4(v4) if v4.is_multicast() => IpAddr::V4(v4),
            IpAddr::V6(v6) if v6.is_multicast() && underlay.is_ipv4() => {
                IpAddr::V4(Ipv4Addr::new(239, 255, self.0[4], self.0[5]))
            }
            IpAddr::V6(v6) if v6.is_multicast() => IpAddr::V6(v6),
            _ => return None,
        };
        (ip.is_ipv4() == underlay.is_ipv4()).then_some(ip)
    }

    /// True for `::ffff:a.b.c.d`.
    pub fn is_ipv4_mapped(self) -> bool {
        Ipv6Addr::from(self.0).to_ipv4_mapped().is_some()
    }

    /// The GID in the hex format of rdma-core's pingpong exchange (32 hex digits, byte order).
    pub fn to_wire_hex(self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses [`Gid::to_wire_hex`]'s format.
    pub fn from_wire_hex(s: &str) -> Option<Self> {
        if s.len() != 32 || !s.is_ascii() {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Self(out))
    }
}

impl From<Ipv4Addr> for Gid {
    fn from(ip: Ipv4Addr) -> Self {
        Self::from_ip(IpAddr::V4(ip))
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&Ipv6Addr::from(self.0), f)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// Path MTU, the IB enumeration (`IBV_MTU_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PathMtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl PathMtu {
    /// Payload bytes per packet.
    pub const fn bytes(self) -> usize {
        256 << (self as usize - 1)
    }

    /// The IB enum value carried in CM messages (1..=5).
    pub const fn to_enum(self) -> u8 {
        self as u8
    }

    /// From the IB enum value (1..=5).
    pub const fn from_enum(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Mtu256,
            2 => Self::Mtu512,
            3 => Self::Mtu1024,
            4 => Self::Mtu2048,
            5 => Self::Mtu4096,
            _ => return None,
        })
    }

    /// From a byte count that is exactly one of the IB MTUs.
    pub const fn from_bytes(b: usize) -> Option<Self> {
        Some(match b {
            256 => Self::Mtu256,
            512 => Self::Mtu512,
            1024 => Self::Mtu1024,
            2048 => Self::Mtu2048,
            4096 => Self::Mtu4096,
            _ => return None,
        })
    }

    /// [`for_link_mtu`](Self::for_link_mtu), at least 256 (the smallest IB MTU, what a link
    /// too small for any is taken to carry).
    pub fn carried_by_link(link_mtu: u32) -> Self {
        usize::try_from(link_mtu)
            .ok()
            .and_then(Self::for_link_mtu)
            .unwrap_or(Self::Mtu256)
    }

    /// The largest IB MTU whose RoCEv2 packet fits a link of `link_mtu` bytes, as rxe does:
    /// `link_mtu - 80`, rounded down (1500 gives 1024, 9000 gives 4096).
    pub fn for_link_mtu(link_mtu: usize) -> Option<Self> {
        let room = link_mtu.checked_sub(80)?;
        [
            Self::Mtu4096,
            Self::Mtu2048,
            Self::Mtu1024,
            Self::Mtu512,
            Self::Mtu256,
        ]
        .into_iter()
        .find(|m| m.bytes() <= room)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn psn_wraps_and_compares_in_window() {
        let a = Psn::new(0xFF_FFFF);
        assert_eq!(a.add(1), Psn::new(0));
        assert_eq!(Psn::new(0).sub(1), a);
        assert_eq!(Psn::new(0).diff(a), 1);
        assert_eq!(a.diff(Psn::new(0)), -1);
        assert_eq!(Psn::new(5).cmp_window(a), Ordering::Greater);
    }

    #[test]
    fn psn_arithmetic() {
        let p = Psn::new;
        assert_eq!(p(PSN_MASK).add(1), p(0));
        assert_eq!(p(5).add(0xFF_FFFF), p(4));
        assert_eq!(p(0).diff(p(PSN_MASK)), 1);
        assert_eq!(p(PSN_MASK).diff(p(0)), -1);
        assert_eq!(p(10).diff(p(3)), 7);
        assert_eq!(p(0).cmp_window(p(PSN_MASK)), Ordering::Greater);
        assert_eq!(p(7).cmp_window(p(7)), Ordering::Equal);
        assert_eq!(p(1 << 23).cmp_window(p(0)), Ordering::Less);
        assert_eq!(p(0).cmp_window(p(1 << 23)), Ordering::Less);
        assert_eq!(Psn::new(0x0123_4567).get(), 0x23_4567);
    }

    proptest! {
        #[test]
        fn psn_diff_inverts_add(base in 0u32..0x100_0000, n in 0u32..0x80_0000) {
            let p = Psn::new(base);
            prop_assert_eq!(p.add(n).diff(p), n as i32);
            prop_assert_eq!(p.diff(p.add(n)), -(n as i32));
            prop_assert_eq!(p.add(n).sub(n), p);
        }

        #[test]
        fn psn_cmp_window_is_antisymmetric_off_the_boundary(a in 0u32..=PSN_MASK, b in 0u32..=PSN_MASK) {
            let (a, b) = (Psn::new(a), Psn::new(b));
            prop_assert_eq!(a.cmp_window(b), a.diff(b).cmp(&0));
            if a.diff(b) != -(1 << 23) {
                prop_assert_eq!(b.cmp_window(a), a.cmp_window(b).reverse());
                prop_assert_eq!(b.diff(a), -a.diff(b));
            }
        }

        #[test]
        fn gid_hex_round_trips(bytes in any::<[u8; 16]>()) {
            let g = Gid(bytes);
            prop_assert_eq!(Gid::from_wire_hex(&g.to_wire_hex()), Some(g));
        }
    }

    #[test]
    fn gid_maps_ipv4() {
        let g = Gid::from(Ipv4Addr::new(198, 18, 0, 1));
        assert!(g.is_ipv4_mapped());
        assert_eq!(g.to_ip(), IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)));
        assert_eq!(g.to_string(), "::ffff:198.18.0.1");
        assert_eq!(Gid::from_wire_hex("zz"), None);
    }

    #[test]
    fn mtu_for_link() {
        assert_eq!(PathMtu::for_link_mtu(1500), Some(PathMtu::Mtu1024));
        assert_eq!(PathMtu::for_link_mtu(9000), Some(PathMtu::Mtu4096));
        assert_eq!(PathMtu::for_link_mtu(300), None);
        assert_eq!(PathMtu::Mtu4096.bytes(), 4096);
        assert_eq!(PathMtu::from_enum(3), Some(PathMtu::Mtu1024));
    }
}
