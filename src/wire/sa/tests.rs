use super::*;
use crate::wire::ipoib::mcast::{broadcast_mgid, mgid_for_ipv6};
use crate::wire::Gid;
use proptest::prelude::*;

fn gid(s: &str) -> Gid {
    Gid(s.parse::<std::net::Ipv6Addr>().unwrap().octets())
}

#[test]
fn header_layout() {
    let h = SaHeader::request(
        SaMethod::Get,
        ATTR_PATH_RECORD,
        0x0102_0304_0506_0708,
        PathRecordMask::IPOIB_QUERY,
    );
    let b = h.to_bytes();
    assert_eq!(&b[..4], &[1, 0x03, 2, 0x01]);
    assert_eq!(&b[4..8], &[0, 0, 0, 0]);
    assert_eq!(&b[8..16], &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(&b[16..18], &[0x00, 0x35]);
    assert_eq!(&b[24..56 - 8], &[0u8; 24][..], "RMPP, SM_Key, offset zero");
    // DGID (2), SGID (3), TClass (10), Reversible (11), NumbPath (12), P_Key (13).
    assert_eq!(
        u64::from_be_bytes(b[48..56].try_into().unwrap()),
        0b11_1100_0000_1100
    );
    assert_eq!(SaHeader::from_bytes(&b), h);
}

#[test]
fn path_record_layout() {
    let p = PathRecord {
        service_id: 0x1122_3344_5566_7788,
        dgid: gid("fe80::2"),
        sgid: gid("fe80::1"),
        dlid: 0x0004,
        slid: 0x0003,
        raw_traffic: true,
        flow_label: 0xA_BCDE,
        hop_limit: 0x40,
        tclass: 0x12,
        reversible: true,
        numb_path: 0x7F,
        pkey: 0xFFFF,
        qos_class: 0xABC,
        sl: 0x5,
        mtu: Selected::new(Selector::Exactly, 4),
        rate: Selected::new(Selector::Largest, 3),
        packet_life_time: Selected::new(Selector::LessThan, 18),
        preference: 0x9,
    };
    let b = p.to_bytes();
    assert_eq!(&b[..8], &[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]);
    assert_eq!(b[8], 0xfe);
    assert_eq!(b[23], 2);
    assert_eq!(b[39], 1);
    assert_eq!(&b[40..44], &[0, 4, 0, 3]);
    assert_eq!(&b[44..48], &[0x8A, 0xBC, 0xDE, 0x40]);
    assert_eq!(
        &b[48..58],
        &[0x12, 0xFF, 0xFF, 0xFF, 0xAB, 0xC5, 0x84, 0xC3, 0x52, 0x09]
    );
    assert_eq!(&b[58..], &[0u8; 6]);
    assert_eq!(PathRecord::from_bytes(&b), p);
    assert_eq!(p.mtu(), Some(crate::wire::PathMtu::Mtu2048));
}

#[test]
fn mcmember_record_layout() {
    let m = McMemberRecord {
        mgid: broadcast_mgid(0xFFFF),
        port_gid: gid("fe80::2:c903:a:bcde"),
        qkey: 0x0B1B,
        mlid: 0xC000,
        mtu: Selected::new(Selector::Exactly, 4),
        tclass: 0x00,
        pkey: 0xFFFF,
        rate: Selected::new(Selector::Exactly, 3),
        packet_life_time: Selected::new(Selector::Exactly, 18),
        sl: 0xF,
        flow_label: 0xF_FFFF,
        hop_limit: 0x01,
        scope: 2,
        join_state: JoinState::FULL_MEMBER,
        proxy_join: true,
    };
    let b = m.to_bytes();
    assert_eq!(
        &b[..16],
        &[0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]
    );
    assert_eq!(&b[32..38], &[0, 0, 0x0B, 0x1B, 0xC0, 0x00]);
    assert_eq!(&b[38..44], &[0x84, 0x00, 0xFF, 0xFF, 0x83, 0x92]);
    assert_eq!(&b[44..48], &[0xFF, 0xFF, 0xFF, 0x01]);
    assert_eq!(&b[48..52], &[0x21, 0x80, 0, 0]);
    assert_eq!(McMemberRecord::from_bytes(&b), m);
}

#[test]
fn ipoib_mgids_carry_the_pkey() {
    assert_eq!(
        broadcast_mgid(0x8001).to_string(),
        "ff12:401b:8001::ffff:ffff"
    );
    let all_nodes = mgid_for_ipv6("ff02::1".parse().unwrap(), 0x8001);
    assert_eq!(all_nodes.to_string(), "ff12:601b:8001::1");
    let solicited = mgid_for_ipv6("ff02::1:ff00:1234".parse().unwrap(), 0xFFFF);
    assert_eq!(solicited.to_string(), "ff12:601b:ffff::1:ff00:1234");
}

#[test]
fn parse_checks_header_in_order() {
    let ok = SaMad::new(
        SaHeader::request(SaMethod::Set, ATTR_MCMEMBER_RECORD, 7, 0),
        &[0u8; 52],
    )
    .emit();
    assert!(SaMad::parse(&ok).is_ok());
    assert_eq!(SaMad::parse(&ok[..255]), Err(SaError::Truncated));
    let mut b = ok;
    b[0] = 2;
    b[1] = 0x07;
    assert_eq!(SaMad::parse(&b), Err(SaError::BadBaseVersion(2)));
    b[0] = 1;
    assert_eq!(SaMad::parse(&b), Err(SaError::NotSa(0x07)));
    b[1] = 3;
    b[2] = 1;
    assert_eq!(SaMad::parse(&b), Err(SaError::BadClassVersion(1)));
    b[2] = 2;
    b[3] = 0x7F;
    assert_eq!(SaMad::parse(&b), Err(SaError::UnknownMethod(0x7F)));
}

#[test]
fn status_codes() {
    assert!(SaStatus(0x0300).is_no_records());
    assert_eq!(SaStatus(0x0600).sa_code(), 6);
    assert!(SaStatus(0x0001).is_busy());
    assert!(SaStatus::OK.is_ok());
    for m in [0x01, 0x02, 0x81, 0x06, 0x86, 0x12, 0x92, 0x15, 0x95] {
        let method = SaMethod::from_u8(m).unwrap();
        assert_eq!(method as u8, m);
        assert_eq!(method.is_response(), m & 0x80 != 0);
    }
}

/// The answer opensm 3.3.23 gave (through ibsim's `net.2sw2path4hca`) to a PathRecord Get
/// from Hca2 (LID 4) for its own GID: captured with `ipoib-cm sa path --dump`.
#[test]
fn captured_opensm_path_record() {
    let b = hex(CAPTURED_PATH_RESP);
    let m = SaMad::parse(&b).unwrap();
    assert_eq!(m.header.method(), Some(SaMethod::GetResp));
    assert_eq!(m.header.mad.attr_id, ATTR_PATH_RECORD);
    assert!(m.header.status().is_ok());
    let p = m.path_record();
    assert_eq!(p.dlid, CAPTURED_PATH_LID);
    assert_eq!(p.slid, CAPTURED_PATH_LID);
    assert_eq!(p.pkey, 0xFFFF);
    assert_eq!(p.mtu(), Some(crate::wire::PathMtu::Mtu2048));
    assert_eq!(p.sgid, p.dgid);
    assert_eq!(&m.emit()[..], &b[..], "emit(parse(b)) == b");
}

/// The answer opensm gave to the broadcast group's join from Hca2.
#[test]
fn captured_opensm_join_response() {
    let b = hex(CAPTURED_JOIN_RESP);
    let m = SaMad::parse(&b).unwrap();
    assert_eq!(m.header.method(), Some(SaMethod::GetResp));
    assert_eq!(m.header.mad.attr_id, ATTR_MCMEMBER_RECORD);
    assert!(m.header.status().is_ok());
    let r = m.mcmember_record();
    assert_eq!(r.mgid, broadcast_mgid(0xFFFF));
    assert_eq!(r.mlid, 0xC000);
    assert_eq!(r.qkey, 0x0B1B);
    assert_eq!(r.pkey, 0xFFFF);
    assert_eq!(r.join_state, JoinState::FULL_MEMBER);
    assert_eq!(r.mtu(), Some(crate::wire::PathMtu::Mtu2048));
    assert_eq!(&m.emit()[..], &b[..]);
}

/// The answer opensm gave to the leave (SubnAdmDelete) that followed.
#[test]
fn captured_opensm_leave_response() {
    let b = hex(CAPTURED_LEAVE_RESP);
    let m = SaMad::parse(&b).unwrap();
    assert_eq!(m.header.method(), Some(SaMethod::DeleteResp));
    assert!(m.header.status().is_ok());
    assert_eq!(m.header.comp_mask, McMemberRecordMask::JOIN_EXISTING);
    let r = m.mcmember_record();
    assert_eq!(r.mgid, broadcast_mgid(0xFFFF));
    assert_eq!(r.port_gid, gid("fe80::10:4"));
    // The DeleteResp carries the membership that is left: none.
    assert_eq!(r.join_state, JoinState(0));
    assert_eq!(&m.emit()[..], &b[..]);
}

pub(crate) fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|c| u8::from_str_radix(std::str::from_utf8(c).unwrap(), 16).unwrap())
        .collect()
}

// Responses of opensm 3.3.23 on ibsim's `net.2sw2path4hca` (SM on Hca1, LID 1), to requests
// from Hca2 (LID 4, GID fe80::10:4), as `ipoib-cm sa path|join|leave --dump` printed them
// through umad2sim: 256 bytes each, in hex.
const CAPTURED_PATH_LID: u16 = 4;
const CAPTURED_PATH_RESP: &str = "\
    0103028100000000000100000000000100350000000000000000000000000000\
    000000000000000000000000000800000000000000003c0c0000000000000000\
    fe800000000000000000000000100004fe800000000000000000000000100004\
    00040004000000000080ffff0000848380000000000000000000000000000000\
    0000000000000000000000000000000000000000000000000000000000000000\
    0000000000000000000000000000000000000000000000000000000000000000\
    0000000000000000000000000000000000000000000000000000000000000000\
    0000000000000000000000000000000000000000000000000000000000000000\
";
const CAPTURED_JOIN_RESP: &str = "\
    0103028100000000000100000000000100380000000000000000000000000000\
    000000000000000000000000000700000000000000010083ff12401bffff0000\
    00000000fffffffffe80000000000000000000000010000400000b1bc0008400\
    ffff839200000000210000000000000000000000000000000000000000000000\
    0000000000000000000000000000000000000000000000000000000000000000\
    0000000000000000000000000000000000000000000000000000000000000000\
    0000000000000000000000000000000000000000000000000000000000000000\
    0000000000000000000000000000000000000000000000000000000000000000\
";
const CAPTURED_LEAVE_RESP: &str = "\
    0103029500000000000100000000000100380000000000000000000000000000\
    000000000000000000000000000700000000000000010083ff12401bffff0000\
    00000000fffffffffe8000000000000000000000001000040000000000008000\
    ffff808000000000200000000000000000000000000000000000000000000000\
    0000000000000000000000000000000000000000000000000000000000000000\
    0000000000000000000000000000000000000000000000000000000000000000\
    0000000000000000000000000000000000000000000000000000000000000000\
    0000000000000000000000000000000000000000000000000000000000000000\
";

/// The captured responses, for the client's tests: (path, join, leave).
pub(crate) fn captured() -> [Vec<u8>; 3] {
    [
        hex(CAPTURED_PATH_RESP),
        hex(CAPTURED_JOIN_RESP),
        hex(CAPTURED_LEAVE_RESP),
    ]
}

fn arb_selected() -> impl Strategy<Value = Selected> {
    (0u8..4, 0u8..64).prop_map(|(s, v)| Selected::new(Selector::from_bits(s), v))
}

proptest! {
    #[test]
    fn path_record_round_trip(
        sid in any::<u64>(), dgid in any::<[u8; 16]>(), sgid in any::<[u8; 16]>(),
        lids in any::<(u16, u16)>(), raw in any::<bool>(), fl in 0u32..1 << 20, hop in any::<u8>(),
        tc in any::<u8>(), rev in any::<bool>(), np in 0u8..128, pkey in any::<u16>(),
        qos in 0u16..1 << 12, sl in 0u8..16, mtu in arb_selected(), rate in arb_selected(),
        plt in arb_selected(), pref in any::<u8>(),
    ) {
        let p = PathRecord {
            service_id: sid, dgid: Gid(dgid), sgid: Gid(sgid), dlid: lids.0, slid: lids.1,
            raw_traffic: raw, flow_label: fl, hop_limit: hop, tclass: tc, reversible: rev,
            numb_path: np, pkey, qos_class: qos, sl, mtu, rate, packet_life_time: plt,
            preference: pref,
        };
        prop_assert_eq!(PathRecord::from_bytes(&p.to_bytes()), p);
        let mad = SaMad::new(SaHeader::request(SaMethod::GetResp, ATTR_PATH_RECORD, sid, 0), &p.to_bytes());
        prop_assert_eq!(SaMad::parse(&mad.emit()).unwrap().path_record(), p);
    }

    #[test]
    fn mcmember_record_round_trip(
        mgid in any::<[u8; 16]>(), port in any::<[u8; 16]>(), qkey in any::<u32>(),
        mlid in any::<u16>(), mtu in arb_selected(), tc in any::<u8>(), pkey in any::<u16>(),
        rate in arb_selected(), plt in arb_selected(), sl in 0u8..16, fl in 0u32..1 << 20,
        hop in any::<u8>(), scope in 0u8..16, js in 0u8..16, proxy in any::<bool>(),
    ) {
        let m = McMemberRecord {
            mgid: Gid(mgid), port_gid: Gid(port), qkey, mlid, mtu, tclass: tc, pkey, rate,
            packet_life_time: plt, sl, flow_label: fl, hop_limit: hop, scope,
            join_state: JoinState(js), proxy_join: proxy,
        };
        prop_assert_eq!(McMemberRecord::from_bytes(&m.to_bytes()), m);
    }

    #[test]
    fn parse_never_panics_and_re_emits(b in proptest::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(m) = SaMad::parse(&b) {
            let out = m.emit();
            // Only the reserved header bytes 18..20 and 46..48 may differ.
            prop_assert_eq!(&out[..18], &b[..18]);
            prop_assert_eq!(&out[20..46], &b[20..46]);
            prop_assert_eq!(&out[48..], &b[48..256]);
            let _ = m.path_record();
            let _ = m.mcmember_record();
        }
    }
}
