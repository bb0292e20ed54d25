//! Tests of the CM codec: round trips, fixed vectors at the table offsets, error cases, the
//! IPoIB-CM helpers, and (when tshark is installed) a Wireshark decode of emitted MADs.

use super::*;
use crate::wire::{Gid, PathMtu, Psn, QpNum};
use core::net::Ipv4Addr;
use proptest::prelude::*;

// ------------------------------------------------------------------------------------------
// Strategies

fn arb_bytes<const N: usize>() -> impl Strategy<Value = [u8; N]> {
    prop::collection::vec(any::<u8>(), N).prop_map(|v| <[u8; N]>::try_from(v).unwrap())
}

fn arb_qpn() -> impl Strategy<Value = QpNum> {
    (0u32..1 << 24).prop_map(QpNum::new)
}

fn arb_psn() -> impl Strategy<Value = Psn> {
    (0u32..1 << 24).prop_map(Psn::new)
}

fn arb_gid() -> impl Strategy<Value = Gid> {
    any::<[u8; 16]>().prop_map(Gid)
}

fn arb_target() -> impl Strategy<Value = TargetMsg> {
    prop_oneof![
        Just(TargetMsg::Req),
        Just(TargetMsg::Rep),
        Just(TargetMsg::Other)
    ]
}

fn arb_path_mtu() -> impl Strategy<Value = Option<PathMtu>> {
    (0u8..16).prop_map(PathMtu::from_enum)
}

fn arb_path() -> impl Strategy<Value = CmPath> {
    (
        (any::<u16>(), any::<u16>(), arb_gid(), arb_gid()),
        (
            0u32..1 << 20,
            0u8..64,
            any::<u8>(),
            any::<u8>(),
            0u8..16,
            any::<bool>(),
            0u8..32,
        ),
    )
        .prop_map(
            |(
                (local_lid, remote_lid, local_gid, remote_gid),
                (flow_label, packet_rate, traffic_class, hop_limit, sl, subnet_local, ack),
            )| CmPath {
                local_lid,
                remote_lid,
                local_gid,
                remote_gid,
                flow_label,
                packet_rate,
                traffic_class,
                hop_limit,
                sl,
                subnet_local,
                local_ack_timeout: ack,
            },
        )
}

fn arb_req() -> impl Strategy<Value = Req> {
    let ids = (
        any::<u32>(),
        0u32..1 << 24,
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
        arb_qpn(),
        any::<u8>(),
        0u32..1 << 24,
        any::<u8>(),
        0u32..1 << 24,
    );
    let flags = (
        (0u8..32, 0u8..4, any::<bool>(), arb_psn(), 0u8..32, 0u8..8),
        (
            any::<u16>(),
            arb_path_mtu(),
            any::<bool>(),
            0u8..8,
            0u8..16,
            any::<bool>(),
            0u8..8,
        ),
    );
    let rest = (arb_path(), arb_path(), any::<bool>(), arb_bytes::<92>());
    (ids, flags, rest).prop_map(
        |(
            (lcid, vendor, sid, guid, qkey, qpn, rr, leecn, idepth, reecn),
            ((rcmt, tst, e2e, psn, lcmt, retry), (pkey, mtu, rdc, rnr, maxcm, srq, ext)),
            (primary, alternate, sap, pd),
        )| Req {
            local_comm_id: lcid,
            vendor_id: vendor,
            service_id: sid,
            local_ca_guid: guid,
            local_qkey: qkey,
            local_qpn: qpn,
            responder_resources: rr,
            local_eecn: leecn,
            initiator_depth: idepth,
            remote_eecn: reecn,
            remote_cm_response_timeout: rcmt,
            transport_service_type: tst,
            e2e_flow_control: e2e,
            starting_psn: psn,
            local_cm_response_timeout: lcmt,
            retry_count: retry,
            pkey,
            path_mtu: mtu,
            rdc_exists: rdc,
            rnr_retry_count: rnr,
            max_cm_retries: maxcm,
            srq,
            extended_transport_type: ext,
            primary_path: primary,
            alternate_path: alternate,
            sap_supported: sap,
            private_data: pd,
        },
    )
}

fn arb_rep() -> impl Strategy<Value = Rep> {
    (
        (
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            arb_qpn(),
            0u32..1 << 24,
            0u32..1 << 24,
            arb_psn(),
        ),
        (
            any::<u8>(),
            any::<u8>(),
            0u8..32,
            0u8..4,
            any::<bool>(),
            0u8..8,
            any::<bool>(),
            any::<u64>(),
        ),
        arb_bytes::<196>(),
    )
        .prop_map(
            |(
                (lcid, rcid, qkey, qpn, vendor, eecn, psn),
                (rr, id, tad, fo, e2e, rnr, srq, guid),
                pd,
            )| {
                Rep {
                    local_comm_id: lcid,
                    remote_comm_id: rcid,
                    local_qkey: qkey,
                    local_qpn: qpn,
                    vendor_id: vendor,
                    local_eecn: eecn,
                    starting_psn: psn,
                    responder_resources: rr,
                    initiator_depth: id,
                    target_ack_delay: tad,
                    failover_accepted: fo,
                    e2e_flow_control: e2e,
                    rnr_retry_count: rnr,
                    srq,
                    local_ca_guid: guid,
                    private_data: pd,
                }
            },
        )
}

fn arb_rtu() -> impl Strategy<Value = Rtu> {
    (any::<u32>(), any::<u32>(), arb_bytes::<224>()).prop_map(|(l, r, pd)| Rtu {
        local_comm_id: l,
        remote_comm_id: r,
        private_data: pd,
    })
}

fn arb_drep() -> impl Strategy<Value = Drep> {
    (any::<u32>(), any::<u32>(), arb_bytes::<224>()).prop_map(|(l, r, pd)| Drep {
        local_comm_id: l,
        remote_comm_id: r,
        private_data: pd,
    })
}

fn arb_dreq() -> impl Strategy<Value = Dreq> {
    (any::<u32>(), any::<u32>(), arb_qpn(), arb_bytes::<220>()).prop_map(|(l, r, q, pd)| Dreq {
        local_comm_id: l,
        remote_comm_id: r,
        remote_qpn: q,
        private_data: pd,
    })
}

fn arb_rej() -> impl Strategy<Value = Rej> {
    (
        any::<u32>(),
        any::<u32>(),
        arb_target(),
        0u8..128,
        any::<u16>().prop_map(RejReason::from_code),
        arb_bytes::<72>(),
        arb_bytes::<148>(),
    )
        .prop_map(|(l, r, m, len, reason, ari, pd)| Rej {
            local_comm_id: l,
            remote_comm_id: r,
            msg_rejected: m,
            reject_info_len: len,
            reason,
            ari,
            private_data: pd,
        })
}

fn arb_mra() -> impl Strategy<Value = Mra> {
    (
        any::<u32>(),
        any::<u32>(),
        arb_target(),
        0u8..32,
        arb_bytes::<222>(),
    )
        .prop_map(|(l, r, m, t, pd)| Mra {
            local_comm_id: l,
            remote_comm_id: r,
            msg_mraed: m,
            service_timeout: t,
            private_data: pd,
        })
}

fn arb_msg() -> impl Strategy<Value = CmMessage> {
    prop_oneof![
        arb_req().prop_map(CmMessage::Req),
        arb_mra().prop_map(CmMessage::Mra),
        arb_rej().prop_map(CmMessage::Rej),
        arb_rep().prop_map(CmMessage::Rep),
        arb_rtu().prop_map(CmMessage::Rtu),
        arb_dreq().prop_map(CmMessage::Dreq),
        arb_drep().prop_map(CmMessage::Drep),
    ]
}

fn arb_mad() -> impl Strategy<Value = CmMad> {
    (
        arb_msg(),
        any::<u64>(),
        any::<u16>(),
        any::<u16>(),
        any::<u32>(),
    )
        .prop_map(|(msg, tid, status, cs, am)| {
            let mut mad = CmMad::new(tid, msg);
            mad.header.status = status;
            mad.header.class_specific = cs;
            mad.header.attr_mod = am;
            mad
        })
}

/// A 256-byte buffer with a valid CM header for `attr` and the given body.
fn with_header(attr: u16, body: &[u8; MAD_DATA_LEN]) -> [u8; MAD_LEN] {
    let mut b = [0u8; MAD_LEN];
    b[..MAD_HEADER_LEN].copy_from_slice(
        &MadHeader {
            attr_id: attr,
            ..MadHeader::cm(AttrId::Req, 7)
        }
        .to_bytes(),
    );
    b[MAD_HEADER_LEN..].copy_from_slice(body);
    b
}

proptest! {
    #[test]
    fn req_round_trip(m in arb_req()) {
        prop_assert_eq!(Req::from_bytes(&m.to_bytes()), m);
    }

    #[test]
    fn rep_round_trip(m in arb_rep()) {
        prop_assert_eq!(Rep::from_bytes(&m.to_bytes()), m);
    }

    #[test]
    fn rtu_round_trip(m in arb_rtu()) {
        prop_assert_eq!(Rtu::from_bytes(&m.to_bytes()), m);
    }

    #[test]
    fn dreq_round_trip(m in arb_dreq()) {
        prop_assert_eq!(Dreq::from_bytes(&m.to_bytes()), m);
    }

    #[test]
    fn drep_round_trip(m in arb_drep()) {
        prop_assert_eq!(Drep::from_bytes(&m.to_bytes()), m);
    }

    #[test]
    fn rej_round_trip(m in arb_rej()) {
        prop_assert_eq!(Rej::from_bytes(&m.to_bytes()), m);
    }

    #[test]
    fn mra_round_trip(m in arb_mra()) {
        prop_assert_eq!(Mra::from_bytes(&m.to_bytes()), m);
    }

    #[test]
    fn path_round_trip(p in arb_path()) {
        prop_assert_eq!(CmPath::from_bytes(&p.to_bytes()), p);
    }

    #[test]
    fn mad_round_trip(mad in arb_mad(), trailing in prop::collection::vec(any::<u8>(), 0..64)) {
        let bytes = mad.emit();
        prop_assert_eq!(CmMad::parse(&bytes)?, mad);
        // Trailing bytes after the 256-byte MAD are ignored.
        let mut long = bytes.to_vec();
        long.extend_from_slice(&trailing);
        prop_assert_eq!(CmMad::parse(&long)?, mad);
        // Anything shorter than the MAD is truncated.
        prop_assert_eq!(CmMad::parse(&bytes[..MAD_LEN - 1]), Err(CmError::Truncated));
    }

    #[test]
    fn mad_header_round_trip(
        b in any::<[u8; 4]>(), status in any::<u16>(), cs in any::<u16>(),
        tid in any::<u64>(), attr in any::<u16>(), am in any::<u32>(),
    ) {
        let h = MadHeader {
            base_version: b[0], mgmt_class: b[1], class_version: b[2], method: b[3],
            status, class_specific: cs, transaction_id: tid, attr_id: attr, attr_mod: am,
        };
        prop_assert_eq!(MadHeader::parse(&h.to_bytes())?, h);
        let mut buf = [0xEEu8; 30];
        h.emit(&mut buf);
        prop_assert_eq!(&buf[18..20], &[0, 0]);
        prop_assert_eq!(buf[24], 0xEE);
        prop_assert_eq!(MadHeader::from_bytes(buf.first_chunk().unwrap()), h);
    }

    /// Arbitrary bytes never panic the parser; whatever parses re-encodes to something that
    /// parses to the same value.
    #[test]
    fn parse_never_panics(b in prop::collection::vec(any::<u8>(), 0..400)) {
        if let Ok(mad) = CmMad::parse(&b) {
            prop_assert_eq!(CmMad::parse(&mad.emit())?, mad);
        }
    }

    /// Any body behind a valid header parses, and parse∘emit is idempotent on it; with the
    /// reserved bits cleared by one round trip, emit reproduces the bytes.
    #[test]
    fn any_body_parses(attr in 0x10u16..=0x16, body in arb_bytes::<MAD_DATA_LEN>()) {
        let mad = CmMad::parse(&with_header(attr, &body))?;
        prop_assert_eq!(mad.header.attr_id, attr);
        let once = mad.emit();
        let again = CmMad::parse(&once)?;
        prop_assert_eq!(again, mad);
        prop_assert_eq!(again.emit(), once);
    }

    #[test]
    fn rej_reason_codes_round_trip(code in any::<u16>()) {
        prop_assert_eq!(RejReason::from_code(code).code(), code);
    }

    #[test]
    fn service_id_round_trip(qpn in arb_qpn(), linux in any::<bool>()) {
        let sid = ipoib_service_id(qpn, linux);
        let flavor = if linux { ServiceIdFlavor::Linux } else { ServiceIdFlavor::Rfc4755 };
        prop_assert_eq!(parse_ipoib_service_id(sid), Some((qpn, flavor)));
        prop_assert_eq!(sid & !0xFF_FFFF, flavor.prefix());
    }

    #[test]
    fn ipoib_cm_data_round_trip(qpn in arb_qpn(), mtu in any::<u32>()) {
        let d = IpoibCmData { qpn, mtu };
        let mut pd = [0xAAu8; Req::PRIVATE_DATA_LEN];
        d.encode(&mut pd)?;
        prop_assert_eq!(pd[8], 0xAA);
        prop_assert_eq!(IpoibCmData::decode(&pd)?, d);
    }
}

// ------------------------------------------------------------------------------------------
// Fixed vectors

const SRC: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const DST: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

/// A REQ as Linux IPoIB-CM sends it on RoCEv2 (`ipoib_cm_send_req` + `cm_format_req`), with
/// retries and timeouts of an rdma_cm-like peer.
fn linux_like_req() -> Req {
    let mut private_data = [0u8; Req::PRIVATE_DATA_LEN];
    IpoibCmData {
        qpn: QpNum::new(0x48),
        mtu: IpoibCmData::LINUX_MTU,
    }
    .encode(&mut private_data)
    .unwrap();
    Req {
        local_comm_id: 0x1234_5678,
        service_id: 0x1000_0000_0000_0011,
        local_ca_guid: 0x0200_00FF_FE00_0001,
        local_qpn: QpNum::new(0x12),
        responder_resources: 4,
        initiator_depth: 4,
        remote_cm_response_timeout: 20,
        transport_service_type: Req::TRANSPORT_RC,
        starting_psn: Psn::new(0x12_3456),
        local_cm_response_timeout: 20,
        retry_count: 7,
        pkey: 0xFFFF,
        path_mtu: Some(PathMtu::Mtu1024),
        rnr_retry_count: 7,
        max_cm_retries: 15,
        srq: true,
        primary_path: CmPath {
            local_lid: 0xFFFF,
            remote_lid: 0xFFFF,
            local_gid: Gid::from(SRC),
            remote_gid: Gid::from(DST),
            packet_rate: 3,
            hop_limit: 64,
            local_ack_timeout: 18,
            ..CmPath::default()
        },
        private_data,
        ..Req::default()
    }
}

#[test]
fn req_fixed_vector() {
    let req = linux_like_req();
    let mad = CmMad::new(0x0000_0001_1234_5678, CmMessage::Req(req));
    let b = mad.emit();

    // MAD header.
    assert_eq!(&b[0..4], &[1, 0x07, 2, 0x03]);
    assert_eq!(&b[4..8], &[0; 4]);
    assert_eq!(&b[8..16], &[0, 0, 0, 1, 0x12, 0x34, 0x56, 0x78]);
    assert_eq!(&b[16..24], &[0x00, 0x10, 0, 0, 0, 0, 0, 0]);
    // REQ.
    assert_eq!(&b[24..28], &[0x12, 0x34, 0x56, 0x78]); // local comm ID
    assert_eq!(&b[28..32], &[0; 4]); // reserved, vendor ID
    assert_eq!(&b[32..40], &[0x10, 0, 0, 0, 0, 0, 0, 0x11]); // service ID
    assert_eq!(&b[40..48], &[0x02, 0, 0, 0xFF, 0xFE, 0, 0, 0x01]); // CA GUID
    assert_eq!(&b[48..56], &[0; 8]); // reserved, Q_Key
    assert_eq!(&b[56..60], &[0x00, 0x00, 0x12, 4]); // QPN, responder resources
    assert_eq!(&b[60..64], &[0, 0, 0, 4]); // local EECN, initiator depth
    assert_eq!(&b[64..68], &[0, 0, 0, 20 << 3]); // remote EECN, remote timeout, RC, no E2E
    assert_eq!(&b[68..72], &[0x12, 0x34, 0x56, 20 << 3 | 7]); // PSN, local timeout, retry
    assert_eq!(&b[72..74], &[0xFF, 0xFF]); // P_Key
    assert_eq!(b[74], 0x37); // MTU enum 3 in the high nibble, RDC 0, RNR retry 7
    assert_eq!(b[74] >> 4, 3);
    assert_eq!(b[75], 0xF8); // max CM retries 15, SRQ, extended type 0
    assert_eq!(&b[76..80], &[0xFF; 4]); // LIDs
    assert_eq!(
        &b[80..96],
        &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 198, 18, 0, 1]
    );
    assert_eq!(
        &b[96..112],
        &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 198, 18, 0, 2]
    );
    assert_eq!(&b[112..116], &[0, 0, 0, 3]); // flow label 0, packet rate 3
    assert_eq!(&b[116..120], &[0, 64, 0, 18 << 3]); // TC, hop limit, SL/subnet local, ACK t/o
    assert!(b[120..164].iter().all(|&x| x == 0)); // no alternate path
    assert_eq!(&b[164..172], &[0, 0, 0, 0x48, 0, 0, 0xFF, 0xF4]); // ipoib_cm_data
    assert!(b[172..].iter().all(|&x| x == 0));

    let back = CmMad::parse(&b).unwrap();
    assert_eq!(back, mad);
    let CmMessage::Req(r) = back.msg else {
        panic!("not a REQ: {back:?}")
    };
    assert!(!r.alternate_path.is_present());
    assert!(r.primary_path.is_present());
    assert_eq!(
        parse_ipoib_service_id(r.service_id),
        Some((QpNum::new(0x11), ServiceIdFlavor::Linux))
    );
    assert_eq!(
        IpoibCmData::decode(&r.private_data).unwrap(),
        IpoibCmData {
            qpn: QpNum::new(0x48),
            mtu: 65524
        }
    );
}

#[test]
fn req_bit_fields() {
    let mut req = Req {
        e2e_flow_control: true,
        transport_service_type: Req::TRANSPORT_EXTENDED,
        rdc_exists: true,
        extended_transport_type: 1,
        vendor_id: 0xAB_CDEF,
        sap_supported: true,
        ..Req::default()
    };
    req.primary_path.flow_label = 0xF_FFFF;
    req.primary_path.sl = 0xF;
    req.primary_path.subnet_local = true;
    req.alternate_path.local_ack_timeout = 0x1F;
    let d = req.to_bytes();
    assert_eq!(&d[4..8], &[0, 0xAB, 0xCD, 0xEF]);
    assert_eq!(d[43], 0b0000_0111);
    assert_eq!(d[50], 0x08);
    assert_eq!(d[51], 0x01);
    assert_eq!(&d[88..92], &[0xFF, 0xFF, 0xF0, 0x00]);
    assert_eq!(d[94], 0xF8);
    assert_eq!(d[139], 0xFC); // alternate ACK timeout 31, SAP supported
    assert_eq!(Req::from_bytes(&d), req);

    // Widths are masked on emit.
    let wide = Req {
        local_cm_response_timeout: 0xFF,
        retry_count: 0xFF,
        ..Req::default()
    };
    let back = Req::from_bytes(&wide.to_bytes());
    assert_eq!(back.local_cm_response_timeout, 0x1F);
    assert_eq!(back.retry_count, 7);

    // Reserved path MTU values decode as None and encode as 0.
    let mut d = Req::default().to_bytes();
    d[50] = 0x70;
    assert_eq!(Req::from_bytes(&d).path_mtu, None);
    assert_eq!(Req::from_bytes(&d).to_bytes()[50], 0);
}

#[test]
fn rep_fixed_vector() {
    let rep = Rep {
        local_comm_id: 0xAABB_CCDD,
        remote_comm_id: 0x1234_5678,
        local_qpn: QpNum::new(0x00AB_CDEF),
        vendor_id: 0x11_2233,
        local_eecn: 0x44_5566,
        starting_psn: Psn::new(0x65_4321),
        responder_resources: 4,
        initiator_depth: 5,
        target_ack_delay: 15,
        failover_accepted: 1,
        e2e_flow_control: true,
        rnr_retry_count: 7,
        srq: true,
        local_ca_guid: 0x0102_0304_0506_0708,
        ..Rep::default()
    };
    let b = CmMad::new(9, CmMessage::Rep(rep)).emit();
    assert_eq!(&b[16..18], &[0x00, 0x13]);
    assert_eq!(
        &b[24..32],
        &[0xAA, 0xBB, 0xCC, 0xDD, 0x12, 0x34, 0x56, 0x78]
    );
    assert_eq!(&b[32..36], &[0; 4]);
    assert_eq!(&b[36..40], &[0xAB, 0xCD, 0xEF, 0x11]); // QPN, vendor ID high
    assert_eq!(&b[40..44], &[0x44, 0x55, 0x66, 0x22]); // EECN, vendor ID middle
    assert_eq!(&b[44..48], &[0x65, 0x43, 0x21, 0x33]); // PSN, vendor ID low
    assert_eq!(&b[48..52], &[4, 5, 15 << 3 | 1 << 1 | 1, 7 << 5 | 1 << 4]);
    assert_eq!(&b[52..60], &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(CmMad::parse(&b).unwrap().msg, CmMessage::Rep(rep));
}

#[test]
fn rej_mra_dreq_fixed_vectors() {
    let mut ari = [0u8; Rej::ARI_LEN];
    ari[0] = 0xA1;
    let rej = Rej {
        local_comm_id: 0,
        remote_comm_id: 0x1234_5678,
        msg_rejected: TargetMsg::Rep,
        reject_info_len: 8,
        reason: RejReason::InvalidServiceId,
        ari,
        private_data: [0x5A; Rej::PRIVATE_DATA_LEN],
    };
    let b = CmMad::new(1, CmMessage::Rej(rej)).emit();
    assert_eq!(&b[16..18], &[0x00, 0x12]);
    assert_eq!(&b[32..36], &[0x40, 8 << 1, 0, 8]);
    assert_eq!(b[36], 0xA1);
    assert_eq!(b[107], 0);
    assert!(b[108..].iter().all(|&x| x == 0x5A));
    assert_eq!(CmMad::parse(&b).unwrap().msg, CmMessage::Rej(rej));

    let mra = Mra {
        local_comm_id: 1,
        remote_comm_id: 2,
        msg_mraed: TargetMsg::Other,
        service_timeout: 24,
        private_data: [0; Mra::PRIVATE_DATA_LEN],
    };
    let b = CmMad::new(1, CmMessage::Mra(mra)).emit();
    assert_eq!(&b[16..18], &[0x00, 0x11]);
    assert_eq!(&b[32..34], &[0x80, 24 << 3]);
    assert_eq!(CmMad::parse(&b).unwrap().msg, CmMessage::Mra(mra));

    let dreq = Dreq {
        local_comm_id: 1,
        remote_comm_id: 2,
        remote_qpn: QpNum::new(0x12_3456),
        private_data: [0x77; Dreq::PRIVATE_DATA_LEN],
    };
    let b = CmMad::new(1, CmMessage::Dreq(dreq)).emit();
    assert_eq!(&b[16..18], &[0x00, 0x15]);
    assert_eq!(&b[32..36], &[0x12, 0x34, 0x56, 0]);
    assert!(b[36..].iter().all(|&x| x == 0x77));

    let rtu = Rtu {
        local_comm_id: 3,
        remote_comm_id: 4,
        private_data: [0x11; Rtu::PRIVATE_DATA_LEN],
    };
    let b = CmMad::new(1, CmMessage::Rtu(rtu)).emit();
    assert_eq!(&b[16..18], &[0x00, 0x14]);
    assert_eq!(&b[24..32], &[0, 0, 0, 3, 0, 0, 0, 4]);
    assert!(b[32..].iter().all(|&x| x == 0x11));
    let drep = Drep {
        local_comm_id: 3,
        remote_comm_id: 4,
        private_data: [0x11; Drep::PRIVATE_DATA_LEN],
    };
    let d = CmMad::new(1, CmMessage::Drep(drep)).emit();
    assert_eq!(&d[16..18], &[0x00, 0x16]);
    assert_eq!(d[18..], b[18..]);
}

#[test]
fn rej_reason_codes() {
    let named = [
        (RejReason::NoQp, 1),
        (RejReason::Timeout, 4),
        (RejReason::InvalidServiceId, 8),
        (RejReason::StaleConn, 10),
        (RejReason::InvalidGid, 12),
        (RejReason::InvalidLid, 13),
        (RejReason::InvalidAltPacketRate, 23),
        (RejReason::PortCmRedirect, 24),
        (RejReason::InvalidMtu, 26),
        (RejReason::ConsumerDefined, 28),
        (RejReason::InvalidClassVersion, 31),
        (RejReason::InvalidFlowLabel, 32),
        (RejReason::InvalidAltFlowLabel, 33),
        (RejReason::VendorOptionNotSupported, 35),
    ];
    for (r, c) in named {
        assert_eq!(r.code(), c);
        assert_eq!(RejReason::from_code(c), r);
    }
    for c in 1..=33 {
        assert!(
            !matches!(RejReason::from_code(c), RejReason::Other(_)),
            "{c}"
        );
    }
    for c in [0, 34, 36, 0xFFFF] {
        assert_eq!(RejReason::from_code(c), RejReason::Other(c));
    }
}

#[test]
fn header_errors() {
    let good = CmMad::new(1, CmMessage::Rtu(Rtu::default())).emit();
    assert!(CmMad::parse(&good).is_ok());
    assert_eq!(CmMad::parse(&[]), Err(CmError::Truncated));
    assert_eq!(CmMad::parse(&good[..23]), Err(CmError::Truncated));
    assert_eq!(CmMad::parse(&good[..24]), Err(CmError::Truncated));
    assert_eq!(CmMad::parse(&good[..255]), Err(CmError::Truncated));

    let with = |i: usize, v: u8| {
        let mut b = good;
        b[i] = v;
        CmMad::parse(&b)
    };
    assert_eq!(with(0, 2), Err(CmError::BadBaseVersion(2)));
    assert_eq!(with(1, 0x81), Err(CmError::NotCm(0x81)));
    assert_eq!(with(2, 1), Err(CmError::BadClassVersion(1)));
    assert_eq!(with(3, 0x01), Err(CmError::BadMethod(0x01)));
    // The header is judged before the length: a short non-CM MAD is NotCm.
    let mut short = good[..40].to_vec();
    short[1] = 0x03;
    assert_eq!(CmMad::parse(&short), Err(CmError::NotCm(0x03)));

    let attr = |id: u16| CmMad::parse(&with_header(id, &[0; MAD_DATA_LEN]));
    for id in [0x17, 0x18, 0x19, 0x1A, ATTR_CLASS_PORT_INFO] {
        assert_eq!(attr(id), Err(CmError::UnsupportedAttribute(id)));
    }
    for id in [0x0000, 0x0002, 0x000F, 0x001B, 0x0020, 0xFF10] {
        assert_eq!(attr(id), Err(CmError::UnknownAttribute(id)));
    }
    for id in 0x10..=0x16 {
        assert_eq!(attr(id).unwrap().header.attr_id, id);
    }
}

#[test]
fn attr_ids() {
    for id in 0x10..=0x1A {
        let a = AttrId::try_from(id).unwrap();
        assert_eq!(u16::from(a), id);
    }
    assert_eq!(AttrId::Apr.to_u16(), 0x1A);
    assert_eq!(AttrId::try_from(1), Err(CmError::UnknownAttribute(1)));
    assert_eq!(AttrId::try_from(0x1B), Err(CmError::UnknownAttribute(0x1B)));
    assert_eq!(CmMessage::Drep(Drep::default()).attr_id(), AttrId::Drep);
}

#[test]
fn emit_canonicalises_the_header() {
    let mut mad = CmMad::new(0xDEAD_BEEF, CmMessage::Dreq(Dreq::default()));
    mad.header.base_version = 9;
    mad.header.mgmt_class = 9;
    mad.header.class_version = 9;
    mad.header.method = 9;
    mad.header.attr_id = 0x10;
    let back = CmMad::parse(&mad.emit()).unwrap();
    assert_eq!(back.header, MadHeader::cm(AttrId::Dreq, 0xDEAD_BEEF));
}

#[test]
fn comm_id_accessors() {
    let req = CmMessage::Req(Req {
        local_comm_id: 5,
        ..Req::default()
    });
    assert_eq!((req.local_comm_id(), req.remote_comm_id()), (5, None));
    let rej = CmMessage::Rej(Rej {
        local_comm_id: 6,
        remote_comm_id: 7,
        ..Rej::default()
    });
    assert_eq!((rej.local_comm_id(), rej.remote_comm_id()), (6, Some(7)));
}

#[test]
fn ipoib_service_ids() {
    assert_eq!(
        ipoib_service_id(QpNum::new(0x11), true),
        0x1000_0000_0000_0011
    );
    assert_eq!(
        ipoib_service_id(QpNum::new(0xAB_CDEF), false),
        0x0100_0000_00AB_CDEF
    );
    assert_eq!(parse_ipoib_service_id(0x0000_0000_0106_1234), None); // rdma_cm TCP port
    assert_eq!(parse_ipoib_service_id(0x1000_0000_0100_0000), None);
    assert_eq!(parse_ipoib_service_id(0x1100_0000_0000_0001), None);
    assert_eq!(
        parse_ipoib_service_id(0x0100_0000_0000_0000),
        Some((QpNum::new(0), ServiceIdFlavor::Rfc4755))
    );
}

#[test]
fn ipoib_cm_data_layout() {
    // The high byte of the QPN is ignored on receive.
    let d = IpoibCmData::decode(&[0xFF, 0x12, 0x34, 0x56, 0x00, 0x00, 0xFF, 0xF4, 0x99]).unwrap();
    assert_eq!(
        d,
        IpoibCmData {
            qpn: QpNum::new(0x12_3456),
            mtu: 65524
        }
    );
    assert_eq!(d.to_bytes(), [0, 0x12, 0x34, 0x56, 0, 0, 0xFF, 0xF4]);
    assert_eq!(IpoibCmData::decode(&[0; 7]), Err(CmError::Truncated));
    assert_eq!(d.encode(&mut [0; 7]), Err(CmError::Truncated));
}

#[test]
fn timeouts() {
    assert_eq!(cm_timeout_ms(0), 1);
    assert_eq!(cm_timeout_ms(8), 1);
    assert_eq!(cm_timeout_ms(9), 2);
    assert_eq!(cm_timeout_ms(20), 4096);
    assert_eq!(cm_timeout_ms(24), 65536);
    assert_eq!(cm_timeout_ms(31), 1 << 23);
    assert_eq!(cm_timeout_ms(255), 1 << 23);

    assert_eq!(ibta_timeout(0), Duration::from_nanos(4096));
    assert_eq!(ibta_timeout(1), Duration::from_nanos(8192));
    assert_eq!(ibta_timeout(14), Duration::from_nanos(67_108_864)); // ≈ 67 ms
    assert_eq!(ibta_timeout(20), Duration::from_nanos(4_294_967_296)); // ≈ 4.3 s
    assert_eq!(ibta_timeout(31), Duration::from_nanos(4096 << 31));
    assert_eq!(ibta_timeout(200), ibta_timeout(31));
    // Linux's approximation stays within a factor of ~1.05 for t > 8.
    for t in 9..=31u8 {
        let exact = ibta_timeout(t).as_secs_f64() * 1e3;
        let approx = cm_timeout_ms(t) as f64;
        assert!(exact / approx > 1.0 && exact / approx < 1.05, "{t}");
    }
}

#[test]
fn local_ack_timeout_is_a_five_bit_exponent() {
    assert_eq!(LocalAckTimeout::new(32), None);
    assert_eq!(LocalAckTimeout::new(31), Some(LocalAckTimeout::MAX));
    assert_eq!(LocalAckTimeout::saturating(200), LocalAckTimeout::MAX);
    assert_eq!(LocalAckTimeout::default(), LocalAckTimeout::INFINITE);
    let t14 = LocalAckTimeout::new(14).unwrap();
    assert_eq!(t14.exponent(), 14);
    assert_eq!(t14.duration(), Duration::from_nanos(67_108_864));
    assert_eq!(t14.retransmit_interval(), Some(t14.duration()));
    assert_eq!(LocalAckTimeout::INFINITE.retransmit_interval(), None);
    assert_eq!(
        LocalAckTimeout::INFINITE.duration(),
        Duration::from_nanos(4096)
    );
    for t in 0..=u8::MAX {
        assert_eq!(
            ibta_timeout(t),
            LocalAckTimeout::saturating(t).duration(),
            "{t}"
        );
    }
}

// ------------------------------------------------------------------------------------------
// Wireshark

mod tshark {
    use super::*;
    use crate::wire::{Bth, Deth, IpHeaderInfo, Opcode, RoceRepr, GSI_QKEY, ROCEV2_UDP_PORT};
    use std::path::Path;
    use std::process::Command;

    const SPORT: u16 = 0xC001;

    /// The MADs to decode, one per frame.
    fn mads() -> Vec<CmMad> {
        let req = linux_like_req();
        let rep = Rep {
            local_comm_id: 0x8765_4321,
            remote_comm_id: req.local_comm_id,
            local_qpn: QpNum::new(0x13),
            starting_psn: Psn::new(0x65_4321),
            responder_resources: 4,
            initiator_depth: 4,
            target_ack_delay: 15,
            rnr_retry_count: 7,
            srq: true,
            local_ca_guid: 0x0200_00FF_FE00_0002,
            private_data: {
                let mut pd = [0; Rep::PRIVATE_DATA_LEN];
                IpoibCmData {
                    qpn: QpNum::new(0x49),
                    mtu: IpoibCmData::LINUX_MTU,
                }
                .encode(&mut pd)
                .unwrap();
                pd
            },
            ..Rep::default()
        };
        let tid = 0x0000_0001_1234_5678;
        vec![
            CmMad::new(tid, CmMessage::Req(req)),
            CmMad::new(tid, CmMessage::Rep(rep)),
            CmMad::new(
                tid,
                CmMessage::Rtu(Rtu {
                    local_comm_id: req.local_comm_id,
                    remote_comm_id: rep.local_comm_id,
                    ..Rtu::default()
                }),
            ),
            CmMad::new(
                tid,
                CmMessage::Rej(Rej {
                    local_comm_id: 0,
                    remote_comm_id: req.local_comm_id,
                    msg_rejected: TargetMsg::Req,
                    reason: RejReason::InvalidServiceId,
                    ..Rej::default()
                }),
            ),
            CmMad::new(
                tid + 1,
                CmMessage::Dreq(Dreq {
                    local_comm_id: req.local_comm_id,
                    remote_comm_id: rep.local_comm_id,
                    remote_qpn: rep.local_qpn,
                    ..Dreq::default()
                }),
            ),
            CmMad::new(
                tid + 1,
                CmMessage::Drep(Drep {
                    local_comm_id: rep.local_comm_id,
                    remote_comm_id: req.local_comm_id,
                    ..Drep::default()
                }),
            ),
            CmMad::new(
                tid,
                CmMessage::Mra(Mra {
                    local_comm_id: rep.local_comm_id,
                    remote_comm_id: req.local_comm_id,
                    msg_mraed: TargetMsg::Req,
                    service_timeout: 24,
                    ..Mra::default()
                }),
            ),
        ]
    }

    /// The one's-complement IPv4 header checksum.
    fn ip_checksum(h: &[u8]) -> u16 {
        let mut sum: u32 = h
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
            .sum();
        while sum > 0xFFFF {
            sum = (sum & 0xFFFF) + (sum >> 16);
        }
        !(sum as u16)
    }

    /// Ethernet + IPv4 + UDP + RoCEv2 UD SEND_ONLY to QP1 carrying `mad`.
    fn frame(mad: &CmMad, psn: u32) -> Vec<u8> {
        let ip = IpHeaderInfo::V4 {
            src: SRC,
            dst: DST,
            identification: 0,
            dont_fragment: true,
        };
        let repr = RoceRepr {
            deth: Some(Deth {
                qkey: GSI_QKEY,
                src_qp: 1,
            }),
            ..RoceRepr::new(Bth::new(Opcode::UD_SEND_ONLY, 1, psn))
        };
        let mut roce = Vec::new();
        repr.emit(&mad.emit(), &ip, SPORT, ROCEV2_UDP_PORT, &mut roce);
        assert_eq!(roce.len(), 12 + 8 + 256 + 4);

        let udp_len = 8 + roce.len() as u16;
        let mut ipv4 = vec![0x45, 0x00];
        ipv4.extend_from_slice(&(20 + udp_len).to_be_bytes());
        ipv4.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
        ipv4.extend_from_slice(&SRC.octets());
        ipv4.extend_from_slice(&DST.octets());
        let csum = ip_checksum(&ipv4);
        ipv4[10..12].copy_from_slice(&csum.to_be_bytes());

        let mut f = vec![0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01, 0x08, 0x00];
        f.extend_from_slice(&ipv4);
        f.extend_from_slice(&SPORT.to_be_bytes());
        f.extend_from_slice(&ROCEV2_UDP_PORT.to_be_bytes());
        f.extend_from_slice(&udp_len.to_be_bytes());
        f.extend_from_slice(&[0, 0]); // UDP checksum: none
        f.extend_from_slice(&roce);
        f
    }

    /// A classic little-endian pcap file, link type 1 (Ethernet).
    fn pcap(frames: &[Vec<u8>]) -> Vec<u8> {
        let mut p = Vec::new();
        p.extend_from_slice(&0xA1B2_C3D4u32.to_le_bytes());
        p.extend_from_slice(&2u16.to_le_bytes());
        p.extend_from_slice(&4u16.to_le_bytes());
        p.extend_from_slice(&0i32.to_le_bytes()); // thiszone
        p.extend_from_slice(&0u32.to_le_bytes()); // sigfigs
        p.extend_from_slice(&65535u32.to_le_bytes()); // snaplen
        p.extend_from_slice(&1u32.to_le_bytes()); // LINKTYPE_ETHERNET
        for (i, f) in frames.iter().enumerate() {
            p.extend_from_slice(&(1_700_000_000 + i as u32).to_le_bytes());
            p.extend_from_slice(&0u32.to_le_bytes());
            p.extend_from_slice(&(f.len() as u32).to_le_bytes());
            p.extend_from_slice(&(f.len() as u32).to_le_bytes());
            p.extend_from_slice(f);
        }
        p
    }

    fn run_tshark(file: &Path, extra: &[&str]) -> String {
        let out = Command::new("tshark")
            .arg("-r")
            .arg(file)
            .args(["--disable-protocol", "rpcordma"])
            .args(extra)
            .output()
            .expect("run tshark");
        assert!(
            out.status.success(),
            "tshark failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// A tshark number: hex with `0x`, or decimal.
    fn num(s: &str) -> Option<u64> {
        let s = s.trim();
        match s.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).ok(),
            None => s.parse().ok(),
        }
    }

    const FIELDS: &[&str] = &[
        "infiniband.bth.opcode",
        "infiniband.bth.destqp",
        "infiniband.deth.srcqp",
        "infiniband.mad.mgmtclass",
        "infiniband.mad.attributeid",
        "infiniband.mad.transactionid",
        "infiniband.cm.req.serviceid",
        "infiniband.cm.req.localqpn",
        "infiniband.cm.req.startpsn",
        "infiniband.cm.req.pppmtu",
        "infiniband.cm.req.maxcmretr",
        "infiniband.cm.req.rnrretrcount",
        "infiniband.cm.req.localresptout",
        "infiniband.cm.req.prim_localgid_ipv4",
        "infiniband.cm.req.prim_remotegid_ipv4",
        "infiniband.cm.rep.localqpn",
        "infiniband.cm.rep.startpsn",
        "infiniband.cm.rtu.remotecommid",
        "infiniband.cm.rej.reason",
        "infiniband.cm.req.remoteqpneecn",
        "infiniband.cm.drsp.localcommid",
    ];

    #[test]
    fn tshark_decodes_emitted_mads() {
        if !Path::new("/usr/bin/tshark").exists() {
            println!("skipped: tshark not installed");
            return;
        }
        let mads = mads();
        let frames: Vec<Vec<u8>> = mads
            .iter()
            .enumerate()
            .map(|(i, m)| frame(m, i as u32))
            .collect();
        let dir = std::env::temp_dir().join(format!("ipoib-cm-wire-cm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("cm.pcap");
        std::fs::write(&file, pcap(&frames)).unwrap();

        let bad = run_tshark(
            &file,
            &["-Y", "_ws.malformed || _ws.expert.severity == error"],
        );
        let mut args = vec!["-T", "fields", "-E", "separator=|"];
        for f in FIELDS {
            args.extend(["-e", f]);
        }
        let out = run_tshark(&file, &args);
        let verbose = run_tshark(&file, &["-V"]);
        std::fs::remove_dir_all(&dir).unwrap();

        println!("{out}");
        assert!(bad.trim().is_empty(), "malformed or error frames:\n{bad}");
        let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split('|').collect()).collect();
        assert_eq!(rows.len(), mads.len(), "{out}");
        let col = |row: &[&str], name: &str| -> Option<u64> {
            let i = FIELDS.iter().position(|f| *f == name).unwrap();
            num(row[i])
        };
        for (row, mad) in rows.iter().zip(&mads) {
            assert_eq!(col(row, "infiniband.bth.opcode"), Some(100), "{row:?}");
            assert_eq!(col(row, "infiniband.bth.destqp"), Some(1), "{row:?}");
            assert_eq!(col(row, "infiniband.deth.srcqp"), Some(1), "{row:?}");
            assert_eq!(col(row, "infiniband.mad.mgmtclass"), Some(7), "{row:?}");
            assert_eq!(
                col(row, "infiniband.mad.attributeid"),
                Some(u64::from(mad.msg.attr_id().to_u16())),
                "{row:?}"
            );
            assert_eq!(
                col(row, "infiniband.mad.transactionid"),
                Some(mad.header.transaction_id),
                "{row:?}"
            );
        }
        let [req, rep, rtu, rej, dreq, drep, _mra] = &rows[..] else {
            panic!("{out}")
        };
        assert_eq!(
            col(req, "infiniband.cm.req.serviceid"),
            Some(0x1000_0000_0000_0011)
        );
        assert_eq!(col(req, "infiniband.cm.req.localqpn"), Some(0x12));
        assert_eq!(col(req, "infiniband.cm.req.startpsn"), Some(0x12_3456));
        assert_eq!(col(req, "infiniband.cm.req.pppmtu"), Some(3));
        assert_eq!(col(req, "infiniband.cm.req.maxcmretr"), Some(15));
        assert_eq!(col(req, "infiniband.cm.req.rnrretrcount"), Some(7));
        assert_eq!(col(req, "infiniband.cm.req.localresptout"), Some(20));
        let field = |row: &[&str], name: &str| {
            row[FIELDS.iter().position(|f| *f == name).unwrap()].to_owned()
        };
        assert_eq!(
            field(req, "infiniband.cm.req.prim_localgid_ipv4"),
            "198.18.0.1"
        );
        assert_eq!(
            field(req, "infiniband.cm.req.prim_remotegid_ipv4"),
            "198.18.0.2"
        );
        assert_eq!(col(rep, "infiniband.cm.rep.localqpn"), Some(0x13));
        assert_eq!(col(rep, "infiniband.cm.rep.startpsn"), Some(0x65_4321));
        assert_eq!(
            col(rtu, "infiniband.cm.rtu.remotecommid"),
            Some(0x8765_4321)
        );
        assert_eq!(col(rej, "infiniband.cm.rej.reason"), Some(8));
        assert_eq!(col(dreq, "infiniband.cm.req.remoteqpneecn"), Some(0x13));
        assert_eq!(
            col(drep, "infiniband.cm.drsp.localcommid"),
            Some(0x8765_4321)
        );
        for label in [
            "ConnectRequest",
            "ConnectReply",
            "ReadyToUse",
            "ConnectReject",
            "DisconnectRequest",
            "DisconnectReply",
            "MsgRcptAck",
        ] {
            assert!(verbose.contains(label), "no {label} in the decode");
        }
    }
}
