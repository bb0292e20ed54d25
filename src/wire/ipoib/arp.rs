//! ARP over IPoIB (RFC 4391 §8; Linux `arp.c` with `ARPHRD_INFINIBAND`).
//!
//! The packet is the ordinary RFC 826 ARP with 20-byte hardware addresses:
//!
//! | Offset | Size | Field | Value |
//! |---|---|---|---|
//! | 0 | 2 | hardware type | 32 ([`ARP_HTYPE_INFINIBAND`]) |
//! | 2 | 2 | protocol type | `0x0800` |
//! | 4 | 1 | hardware address length | 20 |
//! | 5 | 1 | protocol address length | 4 |
//! | 6 | 2 | operation | 1 request, 2 reply |
//! | 8 | 20 | sender hardware address | [`HwAddr`] |
//! | 28 | 4 | sender IPv4 address | |
//! | 32 | 20 | target hardware address | [`HwAddr`] (zero in requests) |
//! | 52 | 4 | target IPv4 address | |
//!
//! It follows the [`IpoibHeader`](super::IpoibHeader) with EtherType
//! [`ETHERTYPE_ARP`](super::ETHERTYPE_ARP). Requests go to the broadcast group, replies go
//! unicast over UD (never over a CM connection).

use std::net::Ipv4Addr;

use super::{HwAddr, IpoibError, Result};
use crate::wire::field::{emit_head, head, Bytes};

/// ARP hardware type of InfiniBand (`ARPHRD_INFINIBAND`).
pub const ARP_HTYPE_INFINIBAND: u16 = 32;

/// ARP protocol type of IPv4.
pub const ARP_PTYPE_IPV4: u16 = 0x0800;

/// The ARP operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArpOp {
    /// 1: who has `target_ip`?
    Request,
    /// 2: `sender_ip` is at `sender_hw`.
    Reply,
}

impl ArpOp {
    /// The operation code on the wire.
    #[must_use]
    pub const fn code(self) -> u16 {
        match self {
            Self::Request => 1,
            Self::Reply => 2,
        }
    }

    /// The operation for a code.
    ///
    /// # Errors
    ///
    /// [`IpoibError::BadArpOp`] for any code other than 1 and 2 (RARP and InARP are not
    /// handled).
    pub const fn from_code(code: u16) -> Result<Self> {
        match code {
            1 => Ok(Self::Request),
            2 => Ok(Self::Reply),
            c => Err(IpoibError::BadArpOp(c)),
        }
    }
}

/// An ARP request or reply with IPoIB hardware addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpoibArp {
    /// Request or reply.
    pub op: ArpOp,
    /// The sender's hardware address.
    pub sender_hw: HwAddr,
    /// The sender's IPv4 address.
    pub sender_ip: Ipv4Addr,
    /// The target's hardware address (all zero in a request).
    pub target_hw: HwAddr,
    /// The target's IPv4 address.
    pub target_ip: Ipv4Addr,
}

/// The all-zero hardware address requests carry as `target_hw`.
const ZERO_HW: HwAddr = HwAddr::from_bytes(&[0; HwAddr::LEN]);

impl IpoibArp {
    /// Size on the wire: 8 + 20 + 4 + 20 + 4.
    pub const LEN: usize = 56;

    /// A request from `sender_hw`/`sender_ip` asking for `target_ip` (target hardware
    /// address zero).
    #[must_use]
    pub const fn request(sender_hw: HwAddr, sender_ip: Ipv4Addr, target_ip: Ipv4Addr) -> Self {
        Self {
            op: ArpOp::Request,
            sender_hw,
            sender_ip,
            target_hw: ZERO_HW,
            target_ip,
        }
    }

    /// The reply to `self` (a request) saying that `target_ip` is at `our_hw`: sender and
    /// target swapped.
    #[must_use]
    pub const fn reply_to(&self, our_hw: HwAddr) -> Self {
        Self {
            op: ArpOp::Reply,
            sender_hw: our_hw,
            sender_ip: self.target_ip,
            target_hw: self.sender_hw,
            target_ip: self.sender_ip,
        }
    }

    /// Decodes the packet at the start of `buf`; bytes after the 56 are ignored.
    ///
    /// # Errors
    ///
    /// - [`IpoibError::Truncated`] if `buf` is shorter than 56 bytes.
    /// - [`IpoibError::BadHardwareType`], [`IpoibError::BadProtocolType`],
    ///   [`IpoibError::BadHardwareLen`], [`IpoibError::BadProtocolLen`] if the fixed fields
    ///   are not 32, `0x0800`, 20 and 4.
    /// - [`IpoibError::BadArpOp`] if the operation is neither request nor reply.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        Self::from_bytes(head::<{ Self::LEN }>(buf).ok_or(IpoibError::Truncated)?)
    }

    /// Decodes exactly 56 bytes; see [`IpoibArp::parse`].
    ///
    /// # Errors
    ///
    /// As [`IpoibArp::parse`], except `Truncated`.
    pub fn from_bytes(b: &[u8; Self::LEN]) -> Result<Self> {
        let htype = b.be16::<0>();
        if htype != ARP_HTYPE_INFINIBAND {
            return Err(IpoibError::BadHardwareType(htype));
        }
        let ptype = b.be16::<2>();
        if ptype != ARP_PTYPE_IPV4 {
            return Err(IpoibError::BadProtocolType(ptype));
        }
        let [hlen, plen] = b.bytes::<4, 2>();
        if usize::from(hlen) != HwAddr::LEN {
            return Err(IpoibError::BadHardwareLen(hlen));
        }
        if plen != 4 {
            return Err(IpoibError::BadProtocolLen(plen));
        }
        let op = ArpOp::from_code(b.be16::<6>())?;
        Ok(Self {
            op,
            sender_hw: HwAddr::from_bytes(&b.bytes::<8, { HwAddr::LEN }>()),
            sender_ip: Ipv4Addr::from(b.bytes::<28, 4>()),
            target_hw: HwAddr::from_bytes(&b.bytes::<32, { HwAddr::LEN }>()),
            target_ip: Ipv4Addr::from(b.bytes::<52, 4>()),
        })
    }

    /// Encodes the 56 bytes.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b.put_be16::<0>(ARP_HTYPE_INFINIBAND);
        b.put_be16::<2>(ARP_PTYPE_IPV4);
        b.put_bytes::<4, 2>([HwAddr::LEN as u8, 4]);
        b.put_be16::<6>(self.op.code());
        b.put_bytes::<8, { HwAddr::LEN }>(self.sender_hw.to_bytes());
        b.put_bytes::<28, 4>(self.sender_ip.octets());
        b.put_bytes::<32, { HwAddr::LEN }>(self.target_hw.to_bytes());
        b.put_bytes::<52, 4>(self.target_ip.octets());
        b
    }

    /// Writes the packet into the first 56 bytes of `buf`.
    ///
    /// # Panics
    ///
    /// If `buf` is shorter than 56 bytes.
    #[track_caller]
    pub fn emit(&self, buf: &mut [u8]) {
        emit_head(buf, &self.to_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ipoib::hwaddr::tests::arb_hwaddr;
    use crate::wire::{Gid, QpNum};
    use proptest::prelude::*;

    fn our_hw() -> HwAddr {
        "80:00:00:48:fe:80:00:00:00:00:00:00:00:02:c9:03:00:0a:bc:de"
            .parse()
            .unwrap()
    }

    #[test]
    fn request_fixed_vector() {
        let req = IpoibArp::request(
            our_hw(),
            Ipv4Addr::new(198, 19, 0, 1),
            Ipv4Addr::new(198, 19, 0, 2),
        );
        let b = req.to_bytes();
        assert_eq!(b.len(), 56);
        assert_eq!(&b[0..2], &[0x00, 0x20], "htype 32");
        assert_eq!(&b[2..4], &[0x08, 0x00], "ptype IPv4");
        assert_eq!(b[4], 20, "hlen");
        assert_eq!(b[5], 4, "plen");
        assert_eq!(&b[6..8], &[0x00, 0x01], "op request");
        assert_eq!(
            &b[8..28],
            &[
                0x80, 0x00, 0x00, 0x48, 0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x00, 0x02, 0xc9, 0x03, 0x00,
                0x0a, 0xbc, 0xde
            ],
            "sender hw"
        );
        assert_eq!(&b[28..32], &[198, 19, 0, 1], "sender ip");
        assert_eq!(&b[32..52], &[0u8; 20], "target hw");
        assert_eq!(&b[52..56], &[198, 19, 0, 2], "target ip");
        assert_eq!(IpoibArp::parse(&b), Ok(req));

        let peer = HwAddr::new(0x80, QpNum::new(0x123456), Gid([0xfe; 16]));
        let reply = req.reply_to(peer);
        let rb = reply.to_bytes();
        assert_eq!(&rb[6..8], &[0x00, 0x02]);
        assert_eq!(&rb[8..28], &peer.to_bytes());
        assert_eq!(&rb[28..32], &[198, 19, 0, 2]);
        assert_eq!(&rb[32..52], &our_hw().to_bytes());
        assert_eq!(&rb[52..56], &[198, 19, 0, 1]);
    }

    #[test]
    fn typed_errors() {
        let good = IpoibArp::request(our_hw(), Ipv4Addr::LOCALHOST, Ipv4Addr::BROADCAST).to_bytes();
        let with = |off: usize, v: &[u8]| {
            let mut b = good;
            b[off..off + v.len()].copy_from_slice(v);
            IpoibArp::parse(&b)
        };
        assert_eq!(with(0, &[0, 1]), Err(IpoibError::BadHardwareType(1)));
        assert_eq!(
            with(2, &[0x86, 0xdd]),
            Err(IpoibError::BadProtocolType(0x86dd))
        );
        assert_eq!(with(4, &[6]), Err(IpoibError::BadHardwareLen(6)));
        assert_eq!(with(5, &[16]), Err(IpoibError::BadProtocolLen(16)));
        assert_eq!(with(6, &[0, 3]), Err(IpoibError::BadArpOp(3)));
        assert_eq!(IpoibArp::parse(&good[..55]), Err(IpoibError::Truncated));
        let mut long = good.to_vec();
        long.extend_from_slice(&[0xAA; 8]);
        assert!(IpoibArp::parse(&long).is_ok());
    }

    fn arb_arp() -> impl Strategy<Value = IpoibArp> {
        (
            prop_oneof![Just(ArpOp::Request), Just(ArpOp::Reply)],
            arb_hwaddr(),
            any::<[u8; 4]>(),
            arb_hwaddr(),
            any::<[u8; 4]>(),
        )
            .prop_map(|(op, sender_hw, s, target_hw, t)| IpoibArp {
                op,
                sender_hw,
                sender_ip: Ipv4Addr::from(s),
                target_hw,
                target_ip: Ipv4Addr::from(t),
            })
    }

    proptest! {
        #[test]
        fn round_trip(a in arb_arp()) {
            let mut buf = [0u8; 60];
            a.emit(&mut buf);
            prop_assert_eq!(IpoibArp::parse(&buf)?, a);
        }

        #[test]
        fn parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Ok(a) = IpoibArp::parse(&b) {
                prop_assert_eq!(&a.to_bytes()[..], &b[..56]);
            }
        }

        #[test]
        fn parse_valid_prefix_never_panics(tail in proptest::collection::vec(any::<u8>(), 0..60), op in 0u16..4) {
            let mut b = vec![0, 32, 8, 0, 20, 4];
            b.extend_from_slice(&op.to_be_bytes());
            b.extend_from_slice(&tail);
            match IpoibArp::parse(&b) {
                Ok(a) => prop_assert_eq!(&a.to_bytes()[..], &b[..56]),
                Err(IpoibError::Truncated) => prop_assert!(b.len() < 56),
                Err(e) => prop_assert_eq!(e, IpoibError::BadArpOp(op)),
            }
        }
    }
}
