//! Identifiers and small value types shared by every provider: QPNs, PSNs, GIDs, keys, MTUs,
//! QP states and types, and the handles the [`Verbs`](super::Verbs) trait lends out.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

const MASK_24: u32 = 0x00FF_FFFF;

/// A 24-bit queue pair number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QpNum(u32);

impl QpNum {
    /// QP1, the General Services Interface QP that carries CM MADs.
    pub const GSI: Self = Self(1);

    /// Wraps a raw value, keeping the low 24 bits.
    pub const fn new(raw: u32) -> Self {
        Self(raw & MASK_24)
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
        Self(raw & MASK_24)
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

    /// Signed distance `self - other` in the ±2^23 window (rxe `psn_compare`).
    pub const fn diff(self, other: Self) -> i32 {
        (self.0.wrapping_sub(other.0) << 8) as i32 >> 8
    }

    /// Orders two PSNs within the ±2^23 window.
    pub fn cmp_window(self, other: Self) -> std::cmp::Ordering {
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

/// A 32-bit queue key, checked on every UD receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct QKey(pub u32);

impl QKey {
    /// The Q_Key of QP1 (`GSI_QKEY`); rxe drops QP1 traffic with any other key.
    pub const GSI: Self = Self(0x8001_0000);
}

/// A 16-bit partition key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PKey(pub u16);

impl PKey {
    /// The default full-member partition key every RoCE port carries.
    pub const DEFAULT: Self = Self(0xFFFF);

    /// IBTA P_Key match (rxe `pkey_match`): equal non-zero low 15 bits and at least one full
    /// member.
    pub fn matches(self, other: Self) -> bool {
        let (a, b) = (self.0, other.0);
        (a & 0x7FFF) != 0 && (a & 0x7FFF) == (b & 0x7FFF) && ((a | b) & 0x8000) != 0
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

/// IBTA queue pair states (`IBV_QPS_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Created, nothing allowed.
    Reset,
    /// Receives may be posted; nothing is processed.
    Init,
    /// Ready to receive: incoming requests are processed.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drained: no new send WQEs are started.
    Sqd,
    /// Send queue error (UD only in practice).
    Sqe,
    /// Error: every WR completes with `WrFlushErr`.
    Err,
}

impl QpState {
    /// Lowercase name as used in logs and status output.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Reset => "reset",
            Self::Init => "init",
            Self::Rtr => "rtr",
            Self::Rts => "rts",
            Self::Sqd => "sqd",
            Self::Sqe => "sqe",
            Self::Err => "err",
        }
    }
}

/// Queue pair transport types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected.
    Rc,
    /// Unreliable datagram.
    Ud,
    /// QP1, the General Services Interface (a UD QP with Q_Key `0x80010000`).
    Gsi,
}

/// A protection domain handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PdId(pub u32);

/// A completion queue handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CqId(pub u32);

/// A shared receive queue handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SrqId(pub u32);

/// A registered buffer pool handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolId(pub u16);

/// One buffer of a registered pool. Lent to the provider while a WR that uses it is posted,
/// returned by the completion that ends the WR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufId {
    /// The pool.
    pub pool: PoolId,
    /// Index within the pool.
    pub index: u32,
}

/// The caller's 64-bit work request id, returned verbatim in the completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct WrId(pub u64);

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
        assert_eq!(Psn::new(5).cmp_window(a), std::cmp::Ordering::Greater);
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

    #[test]
    fn pkey_match_rules() {
        assert!(PKey::DEFAULT.matches(PKey::DEFAULT));
        assert!(PKey(0x7FFF).matches(PKey::DEFAULT));
        assert!(!PKey(0x7FFF).matches(PKey(0x7FFF)));
        assert!(!PKey(0x8000).matches(PKey(0x8000)));
        assert!(!PKey(0xFFFF).matches(PKey(0x8001)));
    }
}
