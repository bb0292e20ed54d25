//! IP multicast groups → InfiniBand multicast GIDs (RFC 4391 §4; Linux `ip_ib_mc_map` and
//! `ipv6_ib_mc_map`).
//!
//! | Bytes of the MGID | IPv4 | IPv6 |
//! |---|---|---|
//! | 0 | `0xff` | `0xff` |
//! | 1 | `0x10 \| scope` | `0x10 \| scope` |
//! | 2..4 | `40:1b` (IPv4 signature) | `60:1b` (IPv6 signature) |
//! | 4..6 | P_Key | P_Key |
//! | 6..16 | zero, then the low 28 bits of the group in bytes 12..16 | the low 80 bits of the group |
//!
//! The scope is always link-local ([`MGID_SCOPE_LINK_LOCAL`]), as Linux's default broadcast
//! address has it. The P_Key goes in as given: pass it with the full-membership bit `0x8000`
//! set, as Linux does (`priv->pkey`), e.g. `0xffff` for the default partition.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::wire::Gid;

/// The link-local scope nibble of the MGIDs this module builds (`ff12:…`).
pub const MGID_SCOPE_LINK_LOCAL: u8 = 0x2;

/// The first four bytes of an MGID: `ff`, `1<scope>`, then the signature.
const fn prefix(signature: [u8; 2], pkey: u16) -> [u8; 16] {
    let p = pkey.to_be_bytes();
    let mut g = [0u8; 16];
    g[0] = 0xff;
    g[1] = 0x10 | MGID_SCOPE_LINK_LOCAL;
    g[2] = signature[0];
    g[3] = signature[1];
    g[4] = p[0];
    g[5] = p[1];
    g
}

/// The MGID of the IPv4 multicast group `group` in partition `pkey`:
/// `ff12:401b:<pkey>::<low 28 bits of group>`. 224.0.0.1 with P_Key `0xffff` maps to
/// `ff12:401b:ffff::1`.
#[must_use]
pub const fn mgid_for_ipv4(group: Ipv4Addr, pkey: u16) -> Gid {
    let a = group.octets();
    let mut g = prefix([0x40, 0x1b], pkey);
    g[12] = a[0] & 0x0f;
    g[13] = a[1];
    g[14] = a[2];
    g[15] = a[3];
    Gid(g)
}

/// The MGID of the IPv6 multicast group `group` in partition `pkey`:
/// `ff12:601b:<pkey>:<low 80 bits of group>`. `ff02::1` with P_Key `0xffff` maps to
/// `ff12:601b:ffff::1`.
#[must_use]
pub const fn mgid_for_ipv6(group: Ipv6Addr, pkey: u16) -> Gid {
    let a = group.octets();
    let p = prefix([0x60, 0x1b], pkey);
    Gid([
        p[0], p[1], p[2], p[3], p[4], p[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13],
        a[14], a[15],
    ])
}

/// The MGID of the IPv4 broadcast group of partition `pkey`: `ff12:401b:<pkey>::ffff:ffff`
/// (the GID of [`HwAddr::BROADCAST`](super::HwAddr::BROADCAST) for `0xffff`). Every IPoIB
/// interface joins it; ARP requests go to it.
#[must_use]
pub const fn broadcast_mgid(pkey: u16) -> Gid {
    let mut g = prefix([0x40, 0x1b], pkey);
    g[12] = 0xff;
    g[13] = 0xff;
    g[14] = 0xff;
    g[15] = 0xff;
    Gid(g)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn linux_values() {
        assert_eq!(
            mgid_for_ipv4(Ipv4Addr::new(224, 0, 0, 1), 0xffff).to_string(),
            "ff12:401b:ffff::1"
        );
        assert_eq!(
            mgid_for_ipv6("ff02::1".parse().unwrap(), 0xffff).to_string(),
            "ff12:601b:ffff::1"
        );
        assert_eq!(
            broadcast_mgid(0xffff).to_string(),
            "ff12:401b:ffff::ffff:ffff"
        );
        assert_eq!(
            broadcast_mgid(0x8001).to_string(),
            "ff12:401b:8001::ffff:ffff"
        );
        // Only the low 28 bits of the group survive (239.x aliases 224.x).
        assert_eq!(
            mgid_for_ipv4(Ipv4Addr::new(239, 1, 2, 3), 0xffff).to_string(),
            "ff12:401b:ffff::f01:203"
        );
        // Solicited-node multicast for fe80::2:c903:a:bcde.
        assert_eq!(
            mgid_for_ipv6("ff02::1:ff0a:bcde".parse().unwrap(), 0x8001).to_string(),
            "ff12:601b:8001::1:ff0a:bcde"
        );
        // mDNS over IPv4.
        assert_eq!(
            mgid_for_ipv4(Ipv4Addr::new(224, 0, 0, 251), 0xffff).0,
            [0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xfb]
        );
    }

    proptest! {
        #[test]
        fn ipv4_layout(a in any::<[u8; 4]>(), pkey in any::<u16>()) {
            let g = mgid_for_ipv4(Ipv4Addr::from(a), pkey).0;
            prop_assert_eq!(&g[..4], &[0xff, 0x12, 0x40, 0x1b]);
            prop_assert_eq!(&g[4..6], &pkey.to_be_bytes());
            prop_assert_eq!(&g[6..12], &[0u8; 6]);
            prop_assert_eq!(u32::from_be_bytes([g[12], g[13], g[14], g[15]]), u32::from_be_bytes(a) & 0x0fff_ffff);
        }

        #[test]
        fn ipv6_layout(a in any::<[u8; 16]>(), pkey in any::<u16>()) {
            let g = mgid_for_ipv6(Ipv6Addr::from(a), pkey).0;
            prop_assert_eq!(&g[..4], &[0xff, 0x12, 0x60, 0x1b]);
            prop_assert_eq!(&g[4..6], &pkey.to_be_bytes());
            prop_assert_eq!(&g[6..], &a[6..]);
        }
    }
}
