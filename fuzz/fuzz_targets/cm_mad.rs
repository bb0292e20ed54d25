//! `CmMad::parse` on arbitrary bytes.
//!
//! The error (or success) must be the one a reference check of the raw header gives, in wire
//! order (length of the header, base version, class, class version, method, attribute, length
//! of the MAD); bytes past the 256th must not matter. When the MAD parses, `emit` must give
//! 256 bytes that parse back to the same value, emitting again must give the same bytes, the
//! emitted header must equal the received one but for the reserved bytes, and the comm ids the
//! message reports must be the ones at their fixed offsets. The IPoIB-CM helpers (service ID,
//! private data) round-trip on the parsed fields.
#![no_main]

use ipoib_cm::verbs::QpNum;
use ipoib_cm::wire::cm::{
    cm_timeout_ms, ibta_timeout, ipoib_service_id, parse_ipoib_service_id, AttrId, CmError, CmMad,
    CmMessage, IpoibCmData, MadHeader, ServiceIdFlavor, TargetMsg, ATTR_CLASS_PORT_INFO,
    CM_CLASS_VERSION, CM_MGMT_CLASS, MAD_BASE_VERSION, MAD_HEADER_LEN, MAD_LEN, METHOD_SEND,
};
use libfuzzer_sys::fuzz_target;

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// What `CmMad::parse` must answer, from the raw bytes alone.
fn expected(data: &[u8]) -> Result<AttrId, CmError> {
    if data.len() < MAD_HEADER_LEN {
        return Err(CmError::Truncated);
    }
    if data[0] != MAD_BASE_VERSION {
        return Err(CmError::BadBaseVersion(data[0]));
    }
    if data[1] != CM_MGMT_CLASS {
        return Err(CmError::NotCm(data[1]));
    }
    if data[2] != CM_CLASS_VERSION {
        return Err(CmError::BadClassVersion(data[2]));
    }
    if data[3] != METHOD_SEND {
        return Err(CmError::BadMethod(data[3]));
    }
    let attr = be16(&data[16..18]);
    let a = match attr {
        0x0010..=0x001A => AttrId::from_u16(attr).expect("CM attribute"),
        ATTR_CLASS_PORT_INFO => return Err(CmError::UnsupportedAttribute(attr)),
        _ => return Err(CmError::UnknownAttribute(attr)),
    };
    if data.len() < MAD_LEN {
        return Err(CmError::Truncated);
    }
    match a {
        AttrId::SidrReq | AttrId::SidrRep | AttrId::Lap | AttrId::Apr => {
            Err(CmError::UnsupportedAttribute(attr))
        }
        a => Ok(a),
    }
}

fn check_message(data: &[u8], m: &CmMad) {
    let msg = &m.msg;
    assert_eq!(m.header.attr_id, msg.attr_id().to_u16());
    assert_eq!(msg.local_comm_id(), be32(&data[24..28]));
    match msg {
        CmMessage::Req(_) => assert_eq!(msg.remote_comm_id(), None),
        _ => assert_eq!(msg.remote_comm_id(), Some(be32(&data[28..32]))),
    }
    match msg {
        CmMessage::Req(r) => {
            assert!(r.local_qpn.get() <= 0xFF_FFFF && r.starting_psn.get() <= 0xFF_FFFF);
            assert!(r.remote_cm_response_timeout <= 31 && r.local_cm_response_timeout <= 31);
            assert!(r.retry_count <= 7 && r.rnr_retry_count <= 7 && r.max_cm_retries <= 15);
            assert!(r.transport_service_type <= 3);
            assert_eq!(
                r.path_mtu.map(|p| p.to_enum()),
                match data[74] >> 4 {
                    v @ 1..=5 => Some(v),
                    _ => None,
                }
            );
            // The IPoIB-CM service ID and private data helpers round-trip.
            if let Some((qpn, flavor)) = parse_ipoib_service_id(r.service_id) {
                assert_eq!(
                    ipoib_service_id(qpn, flavor == ServiceIdFlavor::Linux),
                    r.service_id
                );
                assert_eq!(r.service_id & !0xFF_FFFF, flavor.prefix());
            }
            let d = IpoibCmData::decode(&r.private_data).expect("92 bytes hold 8");
            let mut out = [0u8; 8];
            d.encode(&mut out).expect("8 bytes");
            // The QPN is 24 bits in a 32-bit field: the top byte is not kept.
            assert_eq!(out[0], 0);
            assert_eq!(out[1..], r.private_data[1..8]);
            assert_eq!(IpoibCmData::from_bytes(&out), d);
            assert_eq!(d.qpn, QpNum::new(be32(&r.private_data[..4])));
        }
        CmMessage::Rep(r) => {
            assert!(r.target_ack_delay <= 31 && r.failover_accepted <= 3);
            assert!(r.rnr_retry_count <= 7 && r.vendor_id <= 0xFF_FFFF);
            let d = IpoibCmData::decode(&r.private_data).expect("196 bytes hold 8");
            assert_eq!(d.to_bytes()[1..], r.private_data[1..8]);
        }
        CmMessage::Mra(r) => {
            assert!(r.service_timeout <= 31);
            assert_eq!(r.msg_mraed, TargetMsg::from_bits(data[32] >> 6));
        }
        CmMessage::Rej(r) => {
            assert!(r.reject_info_len <= 127);
            assert_eq!(r.reason.code(), be16(&data[34..36]));
        }
        CmMessage::Dreq(r) => assert_eq!(r.remote_qpn.get(), be32(&data[32..36]) >> 8),
        CmMessage::Rtu(_) | CmMessage::Drep(_) => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let parsed = CmMad::parse(data);
    match (expected(data), &parsed) {
        (Ok(a), Ok(m)) => assert_eq!(m.msg.attr_id(), a),
        (Err(e), Err(g)) => assert_eq!(*g, e),
        (e, g) => panic!("expected {e:?}, parse gave {g:?}"),
    }
    // The header decoder on its own never checks anything.
    match MadHeader::parse(data) {
        Ok(h) => {
            assert!(data.len() >= MAD_HEADER_LEN);
            let mut b = h.to_bytes();
            assert_eq!(&b[..18], &data[..18]);
            assert_eq!(&b[20..24], &data[20..24]);
            assert_eq!(&b[18..20], &[0, 0], "reserved header bytes not zero");
            b[18..20].copy_from_slice(&data[18..20]);
            assert_eq!(MadHeader::from_bytes(&b), h);
        }
        Err(e) => assert!(data.len() < MAD_HEADER_LEN && e == CmError::Truncated),
    }
    // Time conversions of the five-bit exponents.
    if let Some(&t) = data.first() {
        let ms = cm_timeout_ms(t);
        assert!(ms.is_power_of_two() && ms <= 1 << 23);
        assert_eq!(ms, cm_timeout_ms(t.min(31)));
        let exact = ibta_timeout(t);
        assert!(exact <= ibta_timeout(31));
        // Linux's approximation is within a factor of two of the exact value (above t = 8).
        if (9..=31).contains(&t) {
            let exact_ms = exact.as_secs_f64() * 1e3;
            let ratio = exact_ms / ms as f64;
            assert!(
                (1.04..1.05).contains(&ratio),
                "t {t}: {exact_ms} ms vs {ms} ms"
            );
        }
    }

    let Ok(m) = parsed else { return };
    assert!(data.len() >= MAD_LEN);
    // Bytes past the MAD are ignored.
    assert_eq!(CmMad::parse(&data[..MAD_LEN]), Ok(m));
    check_message(data, &m);

    let out = m.emit();
    assert_eq!(out.len(), MAD_LEN);
    let again =
        CmMad::parse(&out).unwrap_or_else(|e| panic!("emitted {m:?} does not parse: {e:?}"));
    assert_eq!(again, m, "parse(emit(m)) != m");
    assert_eq!(again.emit(), out, "emit is not stable");
    // The header goes out as it came in, but for the reserved bytes.
    assert_eq!(&out[..18], &data[..18]);
    assert_eq!(&out[18..20], &[0, 0]);
    assert_eq!(&out[20..24], &data[20..24]);
    // The message bytes differ from the input only where the input had reserved bits or
    // undefined enumeration values; re-encoding the message alone gives the same bytes.
    assert_eq!(&out[MAD_HEADER_LEN..], &m.msg.to_bytes()[..]);
    // A fresh MAD around the same message differs only in the header fields `new` zeroes.
    let fresh = CmMad::new(m.header.transaction_id, m.msg).emit();
    assert_eq!(&fresh[MAD_HEADER_LEN..], &out[MAD_HEADER_LEN..]);
    assert_eq!(&fresh[8..18], &out[8..18]);
});
