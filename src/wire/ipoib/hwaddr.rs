//! The 20-byte IPoIB hardware address (RFC 4391 §9.1.1, RFC 4755 §4; Linux `dev_addr`).
//!
//! | Bytes | Field |
//! |---|---|
//! | 0 | flags: bit 7 ([`HwAddr::FLAG_CONNECTED`], Linux `IPOIB_FLAGS_RC`) = connected mode supported; bit 5 ([`HwAddr::FLAG_RDMA_CM`], ours) = the CM is reachable at the rdma_cm port with `cma_hdr` framing (a daemon on the kernel's CM, `docs/kernel-cm.md`); the other bits are reserved (Linux ignores every bit but 7) |
//! | 1..4 | the **UD** QPN of the interface (24 bits, big-endian); `0xFFFFFF` for multicast |
//! | 4..20 | the port GID (unicast) or the multicast GID |
//!
//! This is the address ARP and Neighbor Discovery carry and the one `ip link` prints as
//! `link/infiniband 80:00:00:48:fe:80:00:00:00:00:00:00:…`.

use core::fmt;
use core::str::FromStr;

use super::mcast::broadcast_mgid;
use super::{IpoibError, Result};
use crate::wire::field::{emit_head, head};
use crate::wire::{Gid, QpNum};

/// An IPoIB hardware address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HwAddr {
    /// The flags byte: [`HwAddr::FLAG_CONNECTED`] and [`HwAddr::FLAG_RDMA_CM`]; other bits
    /// are kept as received.
    pub flags: u8,
    /// The UD QPN ([`HwAddr::MULTICAST_QPN`] for multicast addresses).
    pub qpn: QpNum,
    /// The port GID, or the multicast GID.
    pub gid: Gid,
}

impl HwAddr {
    /// Size on the wire (`INFINIBAND_ALEN`).
    pub const LEN: usize = 20;

    /// Flag bit: the interface accepts IPoIB-CM connections (RFC 4755, Linux
    /// `IPOIB_FLAGS_RC`). Linux connects to a peer only if its address carries it.
    pub const FLAG_CONNECTED: u8 = 0x80;

    /// Flag bit (ours; reserved in RFC 4755 and ignored by Linux): the node's CM is reachable
    /// at the rdma_cm port with `cma_hdr` framing: its REQs go to the service ID
    /// `0x0000_0000_013F_0000 | rdma_cm_port` (`RDMA_PS_IB`) with rdma_cm's 36-byte header in
    /// front of `ipoib_cm_data`, not to `0x1000_0000_0000_0000 | QPN`. A daemon whose CM is
    /// the kernel's (librdmacm) sets it, because it cannot listen on the standard service ID;
    /// a daemon whose CM is ours serves both and leaves it clear.
    pub const FLAG_RDMA_CM: u8 = 0x20;

    /// Flag bit (ours; reserved in RFC 4755 and ignored by Linux): the node takes several
    /// connections from one peer, each a connection of its own, so a sender with several
    /// workers opens one from each. Without it a sender opens one connection to the node
    /// (Linux `ipoib_cm` spends a QP and, without an SRQ, a receive ring on each).
    pub const FLAG_CONN_PER_WORKER: u8 = 0x10;

    /// The QPN field of every multicast and broadcast address (`IB_MULTICAST_QPN`).
    pub const MULTICAST_QPN: QpNum = QpNum::new(0x00FF_FFFF);

    /// The broadcast address of the default partition (P_Key `0xffff`):
    /// `00:ff:ff:ff:ff:12:40:1b:ff:ff:00:00:00:00:00:00:ff:ff:ff:ff`.
    pub const BROADCAST: Self = Self::multicast(broadcast_mgid(0xFFFF));

    /// An address from its parts.
    #[must_use]
    pub const fn new(flags: u8, qpn: QpNum, gid: Gid) -> Self {
        Self { flags, qpn, gid }
    }

    /// The multicast address of the group `mgid`: flags 0, QPN [`HwAddr::MULTICAST_QPN`].
    #[must_use]
    pub const fn multicast(mgid: Gid) -> Self {
        Self::new(0, Self::MULTICAST_QPN, mgid)
    }

    /// True if the flags advertise connected mode ([`HwAddr::FLAG_CONNECTED`]).
    #[must_use]
    pub const fn connected_mode(&self) -> bool {
        self.flags & Self::FLAG_CONNECTED != 0
    }

    /// True if the flags say the node's CM is reached at the rdma_cm port with `cma_hdr`
    /// framing ([`HwAddr::FLAG_RDMA_CM`]).
    #[must_use]
    pub const fn rdma_cm(&self) -> bool {
        self.flags & Self::FLAG_RDMA_CM != 0
    }

    /// True if the node takes IPoIB-CM connections at all: connected mode
    /// ([`HwAddr::FLAG_CONNECTED`]) or a CM at the rdma_cm port ([`HwAddr::FLAG_RDMA_CM`], which
    /// a daemon on the kernel's CM over InfiniBand sets without `0x80`, so that kernel ipoib
    /// peers send it datagrams while daemons of ours connect).
    #[must_use]
    pub const fn connectable(&self) -> bool {
        self.connected_mode() || self.rdma_cm()
    }

    /// True if the node takes a connection from each of a sender's workers
    /// ([`HwAddr::FLAG_CONN_PER_WORKER`]).
    #[must_use]
    pub const fn takes_conn_per_worker(&self) -> bool {
        self.flags & Self::FLAG_CONN_PER_WORKER != 0
    }

    /// True for multicast and broadcast addresses: the QPN is [`HwAddr::MULTICAST_QPN`].
    /// (Linux's transmit path tests the first GID byte for `0xff` instead; the addresses it
    /// builds satisfy both.)
    #[must_use]
    pub const fn is_multicast(&self) -> bool {
        self.qpn.get() == Self::MULTICAST_QPN.get()
    }

    /// Decodes the address at the start of `buf`.
    ///
    /// # Errors
    ///
    /// [`IpoibError::Truncated`] if `buf` is shorter than 20
    /// bytes.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        head::<{ Self::LEN }>(buf)
            .ok_or(IpoibError::Truncated)
            .map(Self::from_bytes)
    }

    /// Decodes exactly 20 bytes.
    #[must_use]
    pub const fn from_bytes(b: &[u8; Self::LEN]) -> Self {
        Self {
            flags: b[0],
            qpn: QpNum::new(u32::from_be_bytes([0, b[1], b[2], b[3]])),
            gid: Gid([
                b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15],
                b[16], b[17], b[18], b[19],
            ]),
        }
    }

    /// Encodes the 20 bytes.
    #[must_use]
    pub const fn to_bytes(&self) -> [u8; Self::LEN] {
        let q = self.qpn.get().to_be_bytes();
        let g = &self.gid.0;
        [
            self.flags, q[1], q[2], q[3], g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8],
            g[9], g[10], g[11], g[12], g[13], g[14], g[15],
        ]
    }

    /// Writes the address into the first 20 bytes of `buf`.
    ///
    /// # Panics
    ///
    /// If `buf` is shorter than 20 bytes.
    #[track_caller]
    pub fn emit(&self, buf: &mut [u8]) {
        emit_head(buf, &self.to_bytes());
    }
}

impl From<[u8; 20]> for HwAddr {
    fn from(b: [u8; 20]) -> Self {
        Self::from_bytes(&b)
    }
}

impl From<HwAddr> for [u8; HwAddr::LEN] {
    fn from(a: HwAddr) -> Self {
        a.to_bytes()
    }
}

/// Prints the 20 bytes as lowercase two-digit hex separated by colons, as `ip link` does.
impl fmt::Display for HwAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.to_bytes().iter().enumerate() {
            if i != 0 {
                f.write_str(":")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for HwAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HwAddr({self})")
    }
}

/// The string is not 20 colon-separated hex bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[error("invalid IPoIB hardware address (expected 20 colon-separated hex bytes)")]
pub struct ParseHwAddrError;

/// Parses the format of [`Display`](fmt::Display) (and of `ip link`): exactly 20 groups of
/// one or two hex digits (either case) separated by `:`, without surrounding whitespace.
impl FromStr for HwAddr {
    type Err = ParseHwAddrError;

    fn from_str(s: &str) -> core::result::Result<Self, Self::Err> {
        let mut out = [0u8; Self::LEN];
        let mut groups = s.split(':');
        for byte in &mut out {
            let g = groups.next().ok_or(ParseHwAddrError)?;
            if g.is_empty() || g.len() > 2 || !g.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(ParseHwAddrError);
            }
            *byte = u8::from_str_radix(g, 16).map_err(|_| ParseHwAddrError)?;
        }
        if groups.next().is_some() {
            return Err(ParseHwAddrError);
        }
        Ok(Self::from_bytes(&out))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::wire::ipoib::IpoibError;
    use proptest::prelude::*;

    const BROADCAST_BYTES: [u8; 20] = [
        0x00, 0xff, 0xff, 0xff, 0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0xff, 0xff, 0xff, 0xff,
    ];

    pub(crate) fn arb_hwaddr() -> impl Strategy<Value = HwAddr> {
        (any::<u8>(), 0u32..=0x00FF_FFFF, any::<[u8; 16]>())
            .prop_map(|(f, q, g)| HwAddr::new(f, QpNum::new(q), Gid(g)))
    }

    #[test]
    fn broadcast_bytes() {
        assert_eq!(HwAddr::BROADCAST.to_bytes(), BROADCAST_BYTES);
        assert_eq!(HwAddr::from_bytes(&BROADCAST_BYTES), HwAddr::BROADCAST);
        assert!(HwAddr::BROADCAST.is_multicast());
        assert!(!HwAddr::BROADCAST.connected_mode());
        assert_eq!(
            HwAddr::BROADCAST.to_string(),
            "00:ff:ff:ff:ff:12:40:1b:ff:ff:00:00:00:00:00:00:ff:ff:ff:ff"
        );
    }

    #[test]
    fn linux_ip_link_address() {
        // `ip link show ib0` on a ConnectX-3 in connected mode, QPN 0x48.
        let s = "80:00:00:48:fe:80:00:00:00:00:00:00:00:02:c9:03:00:0a:bc:de";
        let a: HwAddr = s.parse().unwrap();
        assert!(a.connected_mode());
        assert!(!a.is_multicast());
        assert_eq!(a.flags, 0x80);
        assert_eq!(a.qpn, QpNum::new(0x48));
        assert_eq!(a.gid.to_string(), "fe80::2:c903:a:bcde");
        assert_eq!(a.to_string(), s);
        assert_eq!(
            "80:0:0:48:FE:80:0:0:0:0:0:0:0:2:C9:3:0:A:BC:DE".parse::<HwAddr>(),
            Ok(a)
        );
    }

    #[test]
    fn rdma_cm_flag_is_bit_5_beside_connected_mode() {
        // A daemon on the kernel's CM over RoCE: connected mode and the rdma_cm service.
        let s = "a0:00:00:11:00:00:00:00:00:00:00:00:00:00:ff:ff:c6:12:00:02";
        let a: HwAddr = s.parse().unwrap();
        assert_eq!(HwAddr::FLAG_RDMA_CM, 0x20);
        assert!(a.rdma_cm() && a.connected_mode());
        // Cleared 0x80 (the kernel-CM daemon on InfiniBand): still reached at rdma_cm.
        let ib = HwAddr { flags: 0x20, ..a };
        assert!(ib.rdma_cm() && !ib.connected_mode() && ib.connectable());
        assert!(!HwAddr { flags: 0x80, ..a }.rdma_cm());
        assert!(!HwAddr::BROADCAST.rdma_cm());
    }

    #[test]
    fn from_str_rejects_malformed() {
        let good = "80:00:00:48:fe:80:00:00:00:00:00:00:00:02:c9:03:00:0a:bc:de";
        for bad in [
            "",
            "80:00:00:48:fe:80:00:00:00:00:00:00:00:02:c9:03:00:0a:bc",
            "80:00:00:48:fe:80:00:00:00:00:00:00:00:02:c9:03:00:0a:bc:de:00",
            "80:00:00:48:fe:80:00:00:00:00:00:00:00:02:c9:03:00:0a:bc:",
            "80:00:00:48:fe:80:00:00:00:00:00:00:00:02:c9:03:00:0a:bc:dex",
            "80:00:00:48:fe:80:00:00:00:00:00:00:00:02:c9:03:00:0a:bc:+d",
            "80:00:00:48:fe:80:00:00:00:00:00:00:00:02:c9:03:00:0a:bc:123",
            "80-00-00-48-fe-80-00-00-00-00-00-00-00-02-c9-03-00-0a-bc-de",
            " 80:00:00:48:fe:80:00:00:00:00:00:00:00:02:c9:03:00:0a:bc:de",
            "é0:00:00:48:fe:80:00:00:00:00:00:00:00:02:c9:03:00:0a:bc:de",
        ] {
            assert_eq!(bad.parse::<HwAddr>(), Err(ParseHwAddrError), "{bad:?}");
        }
        assert!(good.parse::<HwAddr>().is_ok());
    }

    #[test]
    fn parse_truncated() {
        assert_eq!(HwAddr::parse(&[0u8; 19]), Err(IpoibError::Truncated));
    }

    proptest! {
        #[test]
        fn bytes_round_trip(a in arb_hwaddr()) {
            prop_assert_eq!(HwAddr::from_bytes(&a.to_bytes()), a);
            let mut buf = [0u8; 24];
            a.emit(&mut buf);
            prop_assert_eq!(HwAddr::parse(&buf)?, a);
            prop_assert_eq!(a.connected_mode(), a.flags & 0x80 != 0);
            prop_assert_eq!(a.rdma_cm(), a.flags & 0x20 != 0);
            prop_assert_eq!(a.connectable(), a.flags & 0xA0 != 0);
        }

        #[test]
        fn string_round_trip(a in arb_hwaddr()) {
            let s = a.to_string();
            prop_assert_eq!(s.len(), 59);
            prop_assert_eq!(s.parse::<HwAddr>(), Ok(a));
        }

        #[test]
        fn bytes_from_any(b in any::<[u8; 20]>()) {
            prop_assert_eq!(HwAddr::from_bytes(&b).to_bytes(), b);
        }

        #[test]
        fn from_str_never_panics(s in ".{0,80}") {
            if let Ok(a) = s.parse::<HwAddr>() {
                prop_assert_eq!(a.to_string().parse::<HwAddr>(), Ok(a));
            }
        }

        #[test]
        fn from_str_hexish_never_panics(s in "[0-9a-fA-F:]{0,70}") {
            if let Ok(a) = s.parse::<HwAddr>() {
                prop_assert_eq!(a.to_string().to_lowercase(), a.to_string());
            }
        }
    }
}
