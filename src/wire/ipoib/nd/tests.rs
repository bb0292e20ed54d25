use super::*;
use crate::wire::ipoib::hwaddr::tests::arb_hwaddr;
use proptest::prelude::*;

/// An NS for fe80::2:c903:b:1234 from fe80::2:c903:a:bcde, laid out and checksummed by a
/// separate script (Python `struct`, RFC 1071 sum).
const NS_VECTOR: [u8; 88] = [
    0x60, 0x00, 0x00, 0x00, 0x00, 0x30, 0x3a, 0xff, 0xfe, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x02, 0xc9, 0x03, 0x00, 0x0a, 0xbc, 0xde, 0xff, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x01, 0xff, 0x0b, 0x12, 0x34, 0x87, 0x00, 0x04, 0x61, 0x00, 0x00, 0x00, 0x00,
    0xfe, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0xc9, 0x03, 0x00, 0x0b, 0x12, 0x34,
    0x01, 0x03, 0x00, 0x00, 0x80, 0x00, 0x00, 0x48, 0xfe, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x02, 0xc9, 0x03, 0x00, 0x0a, 0xbc, 0xde,
];

fn our_hw() -> HwAddr {
    "80:00:00:48:fe:80:00:00:00:00:00:00:00:02:c9:03:00:0a:bc:de"
        .parse()
        .unwrap()
}

fn ip(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

/// RFC 1071 over an explicit pseudo-header buffer, written independently of
/// [`icmpv6_checksum`]: true if the packet's ICMPv6 checksum is right.
fn independent_checksum_ok(packet: &[u8]) -> bool {
    let plen = usize::from(u16::from_be_bytes([packet[4], packet[5]]));
    let icmp = &packet[40..40 + plen];
    let mut data = Vec::new();
    data.extend_from_slice(&packet[8..40]);
    data.extend_from_slice(&(plen as u32).to_be_bytes());
    data.extend_from_slice(&[0, 0, 0, packet[6]]);
    data.extend_from_slice(icmp);
    if data.len() % 2 == 1 {
        data.push(0);
    }
    let mut sum: u32 = data
        .chunks(2)
        .map(|w| (u32::from(w[0]) << 8) | u32::from(w[1]))
        .sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum == 0xffff
}

#[test]
fn ns_fixed_vector() {
    let ns = NeighborSolicitation::new(
        ip("fe80::2:c903:a:bcde"),
        our_hw(),
        ip("fe80::2:c903:b:1234"),
    );
    assert_eq!(ns.dst, ip("ff02::1:ff0b:1234"));
    let p = ns.to_packet();
    assert_eq!(p, NS_VECTOR);
    assert_eq!(p[7], 255, "hop limit");
    assert_eq!(&p[42..44], &[0x04, 0x61], "checksum");
    assert!(independent_checksum_ok(&p));
    assert!(icmpv6_checksum_valid(ns.src, ns.dst, &p[40..]));
    assert_eq!(NeighborSolicitation::parse(&p), Ok(ns));
    let m = NdMessage::parse(&p).unwrap();
    assert_eq!(m.kind, NdType::NeighborSolicitation);
    assert_eq!(m.target(), Some(ns.target));
    assert_eq!(nd_source_ll_addr(m.icmp), Ok(Some(our_hw())));
    assert_eq!(nd_target_ll_addr(m.icmp), Ok(None));
}

#[test]
fn dad_ns_has_no_source_option() {
    let ns = NeighborSolicitation::new(Ipv6Addr::UNSPECIFIED, our_hw(), ip("fd00::7"));
    assert_eq!(ns.source_hw, None);
    let p = ns.to_packet();
    assert_eq!(p.len(), 40 + 24);
    assert!(independent_checksum_ok(&p));
    assert_eq!(NeighborSolicitation::parse(&p), Ok(ns));
    let na = NeighborAdvertisement::answer(&ns, our_hw());
    assert_eq!(na.dst, ip("ff02::1"));
    assert!(!na.solicited);
}

#[test]
fn na_answer() {
    let peer: HwAddr = "80:00:00:99:fe:80:00:00:00:00:00:00:00:02:c9:03:00:0b:12:34"
        .parse()
        .unwrap();
    let ns = NeighborSolicitation::new(ip("fe80::2:c903:a:bcde"), our_hw(), ip("fe80::1"));
    let na = NeighborAdvertisement::answer(&ns, peer);
    assert_eq!(na.src, ip("fe80::1"));
    assert_eq!(na.dst, ns.src);
    assert_eq!(na.target, ip("fe80::1"));
    assert!(na.solicited && na.override_flag && !na.router);
    let p = na.to_packet();
    assert_eq!(p.len(), 40 + 24 + 24);
    assert_eq!(p[40], 136);
    assert_eq!(p[44], 0x60, "S and O flags");
    assert_eq!(&p[64..68], &[2, 3, 0, 0]);
    assert_eq!(&p[68..88], &peer.to_bytes());
    assert!(independent_checksum_ok(&p));
    assert_eq!(NeighborAdvertisement::parse(&p), Ok(na));
    assert_eq!(
        NeighborSolicitation::parse(&p),
        Err(IpoibError::WrongNdType(136))
    );
    assert_eq!(
        NeighborAdvertisement::parse(&NS_VECTOR),
        Err(IpoibError::WrongNdType(135))
    );
}

#[test]
fn options_in_other_messages() {
    let hw = our_hw().to_bytes();
    // RA: 16 fixed bytes, a 32-byte prefix information option, then the SLLA.
    let mut ra = vec![134, 0, 0, 0, 64, 0, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0];
    ra.extend_from_slice(&[3, 4]);
    ra.extend_from_slice(&[0; 30]);
    ra.extend_from_slice(&[1, 3, 0, 0]);
    ra.extend_from_slice(&hw);
    assert_eq!(nd_source_ll_addr(&ra), Ok(Some(our_hw())));
    assert_eq!(nd_target_ll_addr(&ra), Ok(None));
    // RS with nothing but the SLLA.
    let mut rs = vec![133, 0, 0, 0, 0, 0, 0, 0, 1, 3, 0, 0];
    rs.extend_from_slice(&hw);
    assert_eq!(nd_source_ll_addr(&rs), Ok(Some(our_hw())));
    // Redirect: 40 fixed bytes, then the TLLA.
    let mut redirect = vec![137, 0, 0, 0, 0, 0, 0, 0];
    redirect.extend_from_slice(&[0xfe; 32]);
    redirect.extend_from_slice(&[2, 3, 0, 0]);
    redirect.extend_from_slice(&hw);
    assert_eq!(nd_target_ll_addr(&redirect), Ok(Some(our_hw())));
    // Duplicate options: the first wins.
    let mut dup = rs.clone();
    dup.extend_from_slice(&[1, 3, 0, 0]);
    dup.extend_from_slice(&HwAddr::BROADCAST.to_bytes());
    assert_eq!(nd_source_ll_addr(&dup), Ok(Some(our_hw())));
}

#[test]
fn option_errors() {
    let rs = |opts: &[u8]| {
        let mut m = vec![133, 0, 0, 0, 0, 0, 0, 0];
        m.extend_from_slice(opts);
        nd_source_ll_addr(&m)
    };
    assert_eq!(rs(&[]), Ok(None));
    assert_eq!(rs(&[1, 0, 0, 0, 0, 0, 0, 0]), Err(IpoibError::BadNdOption));
    assert_eq!(rs(&[1]), Err(IpoibError::BadNdOption));
    assert_eq!(rs(&[1, 3, 0, 0]), Err(IpoibError::BadNdOption));
    // An Ethernet-sized SLLA.
    assert_eq!(
        rs(&[1, 1, 0x02, 0, 0, 0, 0, 1]),
        Err(IpoibError::BadLlOptionLen(1))
    );
    // An Ethernet-sized TLLA does not matter when looking for the SLLA.
    assert_eq!(rs(&[2, 1, 0x02, 0, 0, 0, 0, 1]), Ok(None));
    assert_eq!(
        nd_source_ll_addr(&[128, 0, 0, 0, 0, 0, 0, 0]),
        Err(IpoibError::NotNd(128))
    );
    assert_eq!(
        nd_source_ll_addr(&[133, 1, 0, 0, 0, 0, 0, 0]),
        Err(IpoibError::BadNdCode(1))
    );
    assert_eq!(
        nd_source_ll_addr(&[135, 0, 0, 0, 0, 0, 0, 0]),
        Err(IpoibError::Truncated)
    );
    assert_eq!(nd_source_ll_addr(&[133]), Err(IpoibError::Truncated));
}

#[test]
fn packet_errors() {
    let with = |off: usize, v: u8| {
        let mut p = NS_VECTOR;
        p[off] = v;
        NdMessage::parse(&p).map(|m| m.kind)
    };
    assert_eq!(with(7, 64), Err(IpoibError::BadHopLimit(64)));
    assert_eq!(with(6, 17), Err(IpoibError::NotIcmpv6(17)));
    assert_eq!(with(0, 0x45), Err(IpoibError::BadIpVersion(4)));
    assert_eq!(with(87, 0xdf), Err(IpoibError::BadChecksum));
    assert_eq!(with(43, 0x62), Err(IpoibError::BadChecksum));
    assert_eq!(with(5, 0x31), Err(IpoibError::Truncated));
    assert_eq!(
        NdMessage::parse(&NS_VECTOR[..87]),
        Err(IpoibError::Truncated)
    );
    assert_eq!(
        NdMessage::parse(&NS_VECTOR[..39]),
        Err(IpoibError::Truncated)
    );
    // Trailing bytes after the payload length are ignored.
    let mut long = NS_VECTOR.to_vec();
    long.extend_from_slice(&[0xAA; 5]);
    assert_eq!(
        NeighborSolicitation::parse(&long),
        NeighborSolicitation::parse(&NS_VECTOR)
    );
}

/// A Neighbor Solicitation for 2001:db8::2 from 2001:db8::1 with an IPoIB source
/// link-layer option, as the Linux kernel checksummed it (sent on a raw ICMPv6 socket,
/// which always fills the checksum, and read back from another).
const KERNEL_NS_ICMP: [u8; 48] = [
    0x87, 0x00, 0xe9, 0xa9, 0x00, 0x00, 0x00, 0x00, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x01, 0x03, 0x00, 0x00, 0x80, 0x00, 0x00, 0x48,
    0xfe, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0xc9, 0x03, 0x00, 0x0a, 0xbc, 0xde,
];

#[test]
fn checksum_matches_the_kernel() {
    let (src, dst) = (ip("2001:db8::1"), ip("2001:db8::2"));
    assert!(icmpv6_checksum_valid(src, dst, &KERNEL_NS_ICMP));
    let mut zeroed = KERNEL_NS_ICMP;
    zeroed[2..4].fill(0);
    assert_eq!(icmpv6_checksum(src, dst, &zeroed), 0xe9a9);
    assert!(!icmpv6_checksum_valid(
        src,
        ip("2001:db8::3"),
        &KERNEL_NS_ICMP
    ));
    let mut p = vec![0x60, 0, 0, 0, 0, 48, IPPROTO_ICMPV6, ND_HOP_LIMIT];
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(&KERNEL_NS_ICMP);
    assert!(independent_checksum_ok(&p));
    let ns = NeighborSolicitation::parse(&p).unwrap();
    assert_eq!(ns.target, dst);
    assert_eq!(ns.source_hw, Some(our_hw()));
    assert_eq!(ns.to_packet(), p, "emit reproduces the kernel's bytes");
}

#[test]
fn checksum_of_odd_length() {
    let (a, b) = (ip("fe80::1"), ip("fe80::2"));
    let mut m = vec![128, 0, 0, 0, 0, 1, 0, 1, 0xab];
    let c = icmpv6_checksum(a, b, &m).to_be_bytes();
    m[2..4].copy_from_slice(&c);
    assert!(icmpv6_checksum_valid(a, b, &m));
    let mut p = vec![0x60, 0, 0, 0, 0, 9, 58, 255];
    p.extend_from_slice(&a.octets());
    p.extend_from_slice(&b.octets());
    p.extend_from_slice(&m);
    assert!(independent_checksum_ok(&p));
}

#[test]
fn solicited_node() {
    assert_eq!(
        solicited_node_multicast(ip("2001:db8::1:2:3:4567:89ab")),
        ip("ff02::1:ff67:89ab")
    );
}

fn arb_v6() -> impl Strategy<Value = Ipv6Addr> {
    any::<[u8; 16]>().prop_map(Ipv6Addr::from)
}

proptest! {
    #[test]
    fn ns_round_trip(
        src in arb_v6(),
        dst in arb_v6(),
        target in arb_v6(),
        source_hw in proptest::option::of(arb_hwaddr()),
    ) {
        let ns = NeighborSolicitation { src, dst, target, source_hw };
        let p = ns.to_packet();
        prop_assert!(independent_checksum_ok(&p));
        prop_assert_eq!(NeighborSolicitation::parse(&p)?, ns);
    }

    #[test]
    fn na_round_trip(
        src in arb_v6(),
        dst in arb_v6(),
        target in arb_v6(),
        flags in any::<[bool; 3]>(),
        target_hw in proptest::option::of(arb_hwaddr()),
    ) {
        let na = NeighborAdvertisement {
            src, dst, target,
            router: flags[0], solicited: flags[1], override_flag: flags[2],
            target_hw,
        };
        let mut p = vec![0xEE; 3];
        na.emit(&mut p);
        prop_assert!(independent_checksum_ok(&p));
        prop_assert_eq!(NeighborAdvertisement::parse(&p)?, na);
    }

    #[test]
    fn checksum_agrees(src in arb_v6(), dst in arb_v6(), mut m in proptest::collection::vec(any::<u8>(), 4..100)) {
        m[2] = 0;
        m[3] = 0;
        let c = icmpv6_checksum(src, dst, &m).to_be_bytes();
        m[2..4].copy_from_slice(&c);
        prop_assert!(icmpv6_checksum_valid(src, dst, &m));
        let mut p = vec![0x60, 0, 0, 0];
        p.extend_from_slice(&(m.len() as u16).to_be_bytes());
        p.extend_from_slice(&[58, 255]);
        p.extend_from_slice(&src.octets());
        p.extend_from_slice(&dst.octets());
        p.extend_from_slice(&m);
        prop_assert!(independent_checksum_ok(&p));
    }

    #[test]
    fn options_never_panic(t in 133u8..=137, body in proptest::collection::vec(any::<u8>(), 0..120)) {
        let mut m = vec![t, 0];
        m.extend_from_slice(&body);
        let _ = nd_ll_option(&m, LlOption::Source);
        let _ = nd_ll_option(&m, LlOption::Target);
    }

    #[test]
    fn packet_parsers_never_panic(b in proptest::collection::vec(any::<u8>(), 0..160)) {
        let _ = NdMessage::parse(&b).map(|m| m.target());
        let _ = NeighborSolicitation::parse(&b);
        let _ = NeighborAdvertisement::parse(&b);
        let _ = nd_ll_option(&b, LlOption::Source);
    }

    #[test]
    fn mutated_packets_never_panic(i in 0usize..88, v in any::<u8>(), cut in 0usize..=88) {
        let mut p = NS_VECTOR.to_vec();
        p[i] = v;
        p.truncate(cut);
        let _ = NeighborSolicitation::parse(&p);
        let _ = NeighborAdvertisement::parse(&p);
    }
}
