//! `RocePacket::parse` on arbitrary bytes. When a datagram parses, its structure must be
//! self-consistent, and re-emitting it with `RoceRepr::emit` must give a datagram that parses
//! back to the same headers and payload (with the pad count `emit` recomputes), whose ICRC
//! verifies, and which emits to the same bytes again.
#![no_main]

use std::net::Ipv4Addr;

use ipoib_cm::wire::{
    compute_icrc, read_icrc, IpHeaderInfo, RocePacket, WireError, ICRC_LEN, ROCEV2_UDP_PORT,
};
use libfuzzer_sys::fuzz_target;

const SPORT: u16 = 49152;

fn ip() -> IpHeaderInfo {
    IpHeaderInfo::V4 {
        src: Ipv4Addr::new(198, 18, 0, 1),
        dst: Ipv4Addr::new(198, 18, 0, 2),
        identification: 0,
        dont_fragment: true,
    }
}

fuzz_target!(|data: &[u8]| {
    let ip = ip();
    let parsed = RocePacket::parse(data);
    // parse_verified agrees with parse: same error, or the same packet, or BadIcrc.
    match (
        parsed,
        RocePacket::parse_verified(data, &ip, SPORT, ROCEV2_UDP_PORT),
    ) {
        (Err(a), Err(b)) => assert_eq!(a, b),
        (Ok(a), Ok(b)) => assert_eq!(a, b),
        (Ok(_), Err(e)) => assert_eq!(e, WireError::BadIcrc),
        (Err(e), Ok(p)) => panic!("parse failed with {e:?} but parse_verified gave {p:?}"),
    }
    let Ok(pkt) = parsed else { return };

    // Structural invariants of a successful parse.
    let repr = pkt.repr();
    let op = pkt.bth.opcode;
    assert_eq!(repr.check(), Ok(()), "parsed repr inconsistent: {repr:?}");
    assert!(op.is_known() && op.is_supported());
    assert!(
        op.has_payload() || pkt.payload.is_empty(),
        "payload on {op}"
    );
    let hlen = repr.header_len();
    let pad = usize::from(pkt.bth.pad_count);
    assert!(pad <= 3);
    assert_eq!(data.len(), hlen + pkt.payload.len() + pad + ICRC_LEN);
    assert_eq!(&data[hlen..hlen + pkt.payload.len()], pkt.payload);
    assert_eq!(read_icrc(data), Some(pkt.icrc));
    assert!(pkt.bth.dest_qp <= 0x00FF_FFFF && pkt.bth.psn <= 0x00FF_FFFF);

    // Re-emit and re-parse.
    let mut out = Vec::new();
    repr.emit(pkt.payload, &ip, SPORT, ROCEV2_UDP_PORT, &mut out);
    assert_eq!(out.len(), repr.datagram_len(pkt.payload.len()));
    assert_eq!(out.len() % 4, 0, "emitted datagram not 4-byte aligned");
    let again = RocePacket::parse_verified(&out, &ip, SPORT, ROCEV2_UDP_PORT)
        .unwrap_or_else(|e| panic!("re-emitted {repr:?} does not parse: {e:?}"));
    let mut expect = repr;
    expect.bth.pad_count = (pkt.payload.len().wrapping_neg() & 3) as u8;
    assert_eq!(again.repr(), expect);
    assert_eq!(again.payload, pkt.payload);
    assert_eq!(
        again.icrc,
        compute_icrc(&ip, SPORT, ROCEV2_UDP_PORT, &out[..out.len() - 4])
    );
    // Pad bytes are zero on emit.
    assert!(out[hlen + pkt.payload.len()..out.len() - ICRC_LEN]
        .iter()
        .all(|&b| b == 0));
    // Headers as emitted equal the received ones except for the reserved bits and the pad
    // count: BTH byte 1 bits 5:4, byte 4 bits 5:0, byte 8 bits 6:0.
    let mut masked_in = data[..12].to_vec();
    let mut masked_out = out[..12].to_vec();
    for m in [&mut masked_in, &mut masked_out] {
        m[1] &= !0x30;
        m[4] &= 0xC0;
        m[8] &= 0x80;
    }
    assert_eq!(masked_in, masked_out, "BTH bytes changed on re-emit");

    // Emitting is idempotent.
    let mut twice = Vec::new();
    again
        .repr()
        .emit(again.payload, &ip, SPORT, ROCEV2_UDP_PORT, &mut twice);
    assert_eq!(twice, out);
});
