use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use super::*;

fn v4(a: [u8; 4]) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(a))
}

/// The header `cma_format_hdr` writes for 198.18.0.1:49374 connecting to 198.18.0.2, byte by
/// byte from the layout: version 0, `0x40`, the port big-endian, each IPv4 address after twelve
/// zero bytes.
const V4_HDR: [u8; CMA_HDR_LEN] = [
    0x00, 0x40, 0xC0, 0xDE, //
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 198, 18, 0, 1, //
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 198, 18, 0, 2,
];

#[test]
fn ipv4_header_bytes() {
    let h = CmaHdr {
        src_port: 0xC0DE,
        src: v4([198, 18, 0, 1]),
        dst: v4([198, 18, 0, 2]),
    };
    assert_eq!(h.to_bytes(), Ok(V4_HDR));
    assert_eq!(CmaHdr::from_bytes(&V4_HDR), Ok(h));
    assert_eq!(h.ip_version(), 4);
}

#[test]
fn ipv4_address_is_not_v4_mapped() {
    // Bytes 14..16 of each address stay zero: `union cma_ip_addr` is not `::ffff:a.b.c.d`.
    let b = CmaHdr {
        src_port: 1,
        src: v4([10, 0, 0, 1]),
        dst: v4([10, 0, 0, 2]),
    }
    .to_bytes()
    .unwrap_or([0xAA; CMA_HDR_LEN]);
    assert_eq!(&b[4..16], &[0u8; 12]);
    assert_eq!(&b[20..32], &[0u8; 12]);
}

#[test]
fn ipv4_pad_bytes_are_not_checked() {
    // The kernel reads only `ip4.addr`; a sender writing `::ffff:` in front still parses.
    let mut b = V4_HDR;
    b[14] = 0xFF;
    b[15] = 0xFF;
    b[30] = 0xFF;
    b[31] = 0xFF;
    let h = CmaHdr::from_bytes(&b).map(|h| (h.src, h.dst));
    assert_eq!(h, Ok((v4([198, 18, 0, 1]), v4([198, 18, 0, 2]))));
}

#[test]
fn ipv6_header_bytes() {
    let src: Ipv6Addr = "2001:db8::1".parse().unwrap_or(Ipv6Addr::UNSPECIFIED);
    let dst: Ipv6Addr = "2001:db8::2".parse().unwrap_or(Ipv6Addr::UNSPECIFIED);
    let h = CmaHdr {
        src_port: 7471,
        src: IpAddr::V6(src),
        dst: IpAddr::V6(dst),
    };
    let mut want = [0u8; CMA_HDR_LEN];
    want[1] = 0x60;
    want[2..4].copy_from_slice(&[0x1D, 0x2F]);
    want[4..8].copy_from_slice(&[0x20, 0x01, 0x0D, 0xB8]);
    want[19] = 1;
    want[20..24].copy_from_slice(&[0x20, 0x01, 0x0D, 0xB8]);
    want[35] = 2;
    assert_eq!(h.to_bytes(), Ok(want));
    assert_eq!(CmaHdr::from_bytes(&want), Ok(h));
    assert_eq!(h.ip_version(), 6);
}

#[test]
fn refused_headers() {
    let mut b = V4_HDR;
    b[0] = 1;
    assert_eq!(CmaHdr::from_bytes(&b), Err(CmaError::BadVersion(1)));
    for nibble in [0u8, 5, 0xF] {
        let mut b = V4_HDR;
        b[1] = nibble << 4;
        assert_eq!(CmaHdr::from_bytes(&b), Err(CmaError::BadIpVersion(nibble)));
    }
    // The low nibble is reserved and ignored.
    let mut b = V4_HDR;
    b[1] = 0x4F;
    assert!(CmaHdr::from_bytes(&b).is_ok());
    assert_eq!(CmaHdr::parse(&V4_HDR[..35]), Err(CmaError::Truncated));
    assert_eq!(CmaHdr::parse(&[]), Err(CmaError::Truncated));
    // A REQ without a header: the 92 zero bytes of IPoIB-less private data parse as version 0
    // with IP version 0.
    assert_eq!(CmaHdr::parse(&[0u8; 92]), Err(CmaError::BadIpVersion(0)));
    let mixed = CmaHdr {
        src_port: 0,
        src: v4([1, 2, 3, 4]),
        dst: IpAddr::V6(Ipv6Addr::LOCALHOST),
    };
    assert_eq!(mixed.to_bytes(), Err(CmaError::MixedFamilies));
}

#[test]
fn req_private_data_puts_user_data_after_the_header() {
    let h = CmaHdr::from_bytes(&V4_HDR).unwrap_or(CmaHdr {
        src_port: 0,
        src: v4([0; 4]),
        dst: v4([0; 4]),
    });
    let pd = h.req_private_data(b"hello").unwrap_or_default();
    assert_eq!(pd.len(), CMA_HDR_LEN + 5);
    assert_eq!(&pd[..CMA_HDR_LEN], &V4_HDR);
    assert_eq!(&pd[CMA_HDR_LEN..], b"hello");
    let (back, user) = CmaHdr::parse(&pd).unwrap_or((h, &[]));
    assert_eq!((back, user), (h, &b"hello"[..]));
    // User data beyond the REQ's 56 bytes is cut.
    let pd = h.req_private_data(&[7u8; 100]).unwrap_or_default();
    assert_eq!(pd.len(), 92);
}

#[test]
fn listener_matching() {
    let h = CmaHdr::from_bytes(&V4_HDR).unwrap_or(CmaHdr {
        src_port: 0,
        src: v4([0; 4]),
        dst: v4([0; 4]),
    });
    assert!(h.matches_listener(v4([198, 18, 0, 2])));
    assert!(!h.matches_listener(v4([198, 18, 0, 3])));
    assert!(h.matches_listener(v4([0; 4])));
    assert!(h.matches_listener(IpAddr::V6(Ipv6Addr::UNSPECIFIED)));
    assert!(!h.matches_listener("2001:db8::2".parse().unwrap_or(v4([0; 4]))));
}

#[test]
fn port_space_service_ids() {
    assert_eq!(PortSpace::Tcp.service_id(7471), 0x0000_0000_0106_1D2F);
    assert_eq!(PortSpace::Ib.service_id(1), 0x0000_0000_013F_0001);
    assert_eq!(PortSpace::Udp.service_id(0xFFFF), 0x0000_0000_0111_FFFF);
    assert_eq!(
        PortSpace::parse_service_id(0x0106_4853),
        Some((PortSpace::Tcp, 18515))
    );
    assert_eq!(PortSpace::parse_service_id(0x0107_4853), None);
    assert_eq!(PortSpace::parse_service_id(0x1000_0000_0106_4853), None);
    // IPoIB's service ID is in no port space (`cma_select_ib_ps` refuses it).
    assert_eq!(PortSpace::parse_service_id(0x1000_0000_0000_0048), None);
    for ps in [PortSpace::Tcp, PortSpace::Udp, PortSpace::Ib] {
        assert_eq!(PortSpace::from_code(ps.code()), Some(ps));
    }
}

fn any_hdr() -> impl Strategy<Value = CmaHdr> {
    prop_oneof![
        (any::<u16>(), any::<[u8; 4]>(), any::<[u8; 4]>()).prop_map(|(p, s, d)| CmaHdr {
            src_port: p,
            src: v4(s),
            dst: v4(d),
        }),
        (any::<u16>(), any::<[u8; 16]>(), any::<[u8; 16]>()).prop_map(|(p, s, d)| CmaHdr {
            src_port: p,
            src: IpAddr::V6(Ipv6Addr::from(s)),
            dst: IpAddr::V6(Ipv6Addr::from(d)),
        }),
    ]
}

proptest! {
    #[test]
    fn round_trip(h in any_hdr(), user in proptest::collection::vec(any::<u8>(), 0..=56)) {
        let pd = h.req_private_data(&user);
        prop_assert!(pd.is_ok());
        let pd = pd.unwrap_or_default();
        prop_assert_eq!(CmaHdr::parse(&pd), Ok((h, &user[..])));
    }

    #[test]
    fn parse_never_panics(buf in proptest::collection::vec(any::<u8>(), 0..128)) {
        if let Ok((h, user)) = CmaHdr::parse(&buf) {
            prop_assert_eq!(user.len(), buf.len() - CMA_HDR_LEN);
            // What parses re-encodes to the same bytes but for the ignored ones (the low
            // nibble of byte 1 and an IPv4 address's pad).
            let b = h.to_bytes();
            prop_assert!(b.is_ok());
            prop_assert_eq!(CmaHdr::from_bytes(&b.unwrap_or([0; CMA_HDR_LEN])), Ok(h));
        }
    }
}

/// The first 36 bytes of the private data of a REQ the kernel's rdma_cm sent (`rdma_client -s
/// 192.168.77.1 -p 7471` on rxe, Linux 6.12, captured on the lab's tap): the rest of its 92
/// bytes were zero.
const KERNEL_REQ_HDR: &str =
    "0040c063000000000000000000000000c0a84d02000000000000000000000000c0a84d01";

#[test]
fn parses_the_header_of_a_kernel_req() {
    let bytes: Vec<u8> = (0..KERNEL_REQ_HDR.len())
        .step_by(2)
        .filter_map(|i| u8::from_str_radix(KERNEL_REQ_HDR.get(i..i + 2)?, 16).ok())
        .collect();
    let mut pd = [0u8; 92];
    pd[..CMA_HDR_LEN].copy_from_slice(&bytes);
    let (h, user) = CmaHdr::parse(&pd).unwrap_or((
        CmaHdr {
            src_port: 0,
            src: v4([0; 4]),
            dst: v4([0; 4]),
        },
        &[],
    ));
    assert_eq!(
        h,
        CmaHdr {
            src_port: 0xC063,
            src: v4([192, 168, 77, 2]),
            dst: v4([192, 168, 77, 1]),
        }
    );
    assert_eq!(user, &[0u8; 56][..]);
    assert_eq!(h.to_bytes().map(|b| b.to_vec()), Ok(bytes));
}

/// What rdma_cm checks of a REQ for a listener on 198.18.0.1: the header's version, its IP
/// version and its destination (the check the rc-pingpong server and the endpoint's rdma_cm
/// service share).
#[test]
fn accept_req_checks_the_header_as_rdma_cm_does() {
    let me = v4([198, 18, 0, 1]);
    let other = v4([198, 18, 0, 2]);
    let hdr = |dst| CmaHdr {
        src_port: 40000,
        src: other,
        dst,
    };
    let user = [7u8; 8];
    let pd = hdr(me).req_private_data(&user).unwrap_or_default();
    let mut req = [0u8; 92];
    req[..pd.len()].copy_from_slice(&pd);
    let (got, rest) = CmaHdr::accept_req(&req, me).unwrap_or((hdr(other), &[]));
    assert_eq!(got, hdr(me));
    assert_eq!(rest.len(), CMA_REQ_USER_DATA_MAX);
    assert_eq!(&rest[..8], &user);
    // No header at all: IPoIB-style or empty private data.
    assert_eq!(
        CmaHdr::accept_req(&[0u8; 92], me).map(|r| r.0),
        Err(CmaError::BadIpVersion(0))
    );
    assert_eq!(
        CmaHdr::accept_req(&[], me).map(|r| r.0),
        Err(CmaError::Truncated)
    );
    // Another destination.
    let wrong = hdr(other).req_private_data(&[]).unwrap_or_default();
    assert_eq!(
        CmaHdr::accept_req(&wrong, me).map(|r| r.0),
        Err(CmaError::OtherDestination {
            dst: other,
            listener: me
        })
    );
    // Version 1.
    req[0] = 1;
    assert_eq!(
        CmaHdr::accept_req(&req, me).map(|r| r.0),
        Err(CmaError::BadVersion(1))
    );
    // IPv6 header to an IPv4 listener.
    let six: IpAddr = "2001:db8::1".parse().unwrap_or(me);
    let v6 = CmaHdr {
        src_port: 1,
        src: six,
        dst: six,
    }
    .req_private_data(&[])
    .unwrap_or_default();
    assert!(CmaHdr::accept_req(&v6, me).is_err());
}

#[test]
fn ephemeral_ports_stay_in_linux_default_range() {
    assert_eq!(ephemeral_port(0), 32768);
    assert_eq!(ephemeral_port(u64::from(EPHEMERAL_PORT_COUNT) - 1), 60999);
    assert_eq!(ephemeral_port(u64::from(EPHEMERAL_PORT_COUNT)), 32768);
    assert_eq!(ephemeral_port(u64::MAX), 32768 + (u64::MAX % 28232) as u16);
}
