//! The fixed-size header codecs (`Bth`, `Reth`, `Aeth`, `Deth`, `ImmDt`), PSN arithmetic, the
//! RNR timer table and the ICRC helpers, on arbitrary bytes: parse → `to_bytes` must give the
//! input back (up to reserved bits), `from_bytes(to_bytes(h)) == h`, and `emit` writes exactly
//! `to_bytes`.
#![no_main]

use std::cmp::Ordering;
use std::net::Ipv4Addr;
use std::time::Duration;

use ipoib_cm::wire::{
    append_icrc, compute_icrc, read_icrc, rnr_timer_code_at_least,
    rnr_timer_duration, verify_icrc, Aeth, Bth, Deth, ImmDt, IpHeaderInfo, NakCode, Reth, Syndrome,
    Psn, WireError, PSN_MASK, QPN_MASK,
};
use libfuzzer_sys::fuzz_target;

fn be32(b: &[u8]) -> u32 {
    let mut w = [0u8; 4];
    for (d, s) in w.iter_mut().zip(b) {
        *d = *s;
    }
    u32::from_be_bytes(w)
}

fn check_bth(data: &[u8]) {
    let Ok(b) = Bth::parse(data) else {
        assert!(data.len() < Bth::HEADER_LEN);
        return;
    };
    assert!(data.len() >= Bth::HEADER_LEN);
    assert!(b.pad_count <= 3 && b.tver <= 15);
    assert!(b.dest_qp <= QPN_MASK && b.psn <= PSN_MASK);
    assert_eq!(b.check_tver().is_ok(), b.tver == 0);
    let bytes = b.to_bytes();
    let mut expect: [u8; 12] = data[..12].try_into().unwrap();
    expect[4] &= 0xC0; // FECN, BECN; resv6a is not represented
    expect[8] &= 0x80; // AckReq; resv7 is not represented
    assert_eq!(bytes, expect);
    assert_eq!(Bth::from_bytes(&bytes), b);
    let mut buf = [0xAAu8; 13];
    b.emit(&mut buf);
    assert_eq!(&buf[..12], &bytes);
    assert_eq!(buf[12], 0xAA, "emit wrote past the header");

    // Opcode table consistency.
    let op = b.opcode;
    if op.is_supported() && op.0 != 0x81 {
        let ext = 16 * usize::from(op.has_reth())
            + 4 * usize::from(op.has_aeth())
            + 8 * usize::from(op.has_deth())
            + 4 * usize::from(op.has_immediate());
        assert_eq!(op.ext_header_len(), ext, "{op}");
        let kinds = [op.is_first(), op.is_middle(), op.is_last(), op.is_only()];
        assert!(kinds.iter().filter(|k| **k).count() <= 1, "{op}");
    }
    if !op.is_known() {
        assert_eq!(op.ext_header_len(), 0);
        assert!(!op.has_payload() && !op.is_supported());
    }

    // PSN arithmetic on the parsed PSN and the next bytes as an offset.
    let n = be32(data.get(12..16).unwrap_or_default());
    let a = Psn::new(b.psn);
    assert_eq!(a.get(), b.psn);
    let c = a.add(n);
    assert!(c.get() <= PSN_MASK);
    let d = c.diff(a);
    assert!((-(1 << 23)..(1 << 23)).contains(&d));
    assert_eq!(a.add(d as u32), c);
    assert_eq!(c.sub(n), a);
    assert_eq!(d & 0x00FF_FFFF, (n & PSN_MASK) as i32 & 0x00FF_FFFF);
    let ord = c.cmp_window(a);
    assert_eq!(ord, d.cmp(&0));
    if d != -(1 << 23) {
        assert_eq!(a.cmp_window(c), ord.reverse());
        assert_eq!(a.diff(c), -d);
    }
    assert_eq!(a.cmp_window(a), Ordering::Equal);
}

fn check_reth(data: &[u8]) {
    match Reth::parse(data) {
        Ok(r) => {
            assert_eq!(&r.to_bytes()[..], &data[..16]);
            assert_eq!(Reth::from_bytes(&r.to_bytes()), r);
            let mut buf = [0u8; 16];
            r.emit(&mut buf);
            assert_eq!(buf, r.to_bytes());
        }
        Err(e) => assert!(data.len() < 16 && e == WireError::Truncated),
    }
}

fn check_aeth(data: &[u8]) {
    match Aeth::parse(data) {
        Ok(a) => {
            assert!(matches!(data[0] & 0xE0, 0x00 | 0x20 | 0x60));
            assert_eq!(&a.to_bytes()[..], &data[..4], "AETH does not round-trip");
            assert_eq!(Aeth::from_bytes(&a.to_bytes()), Ok(a));
            assert_eq!(Syndrome::from_byte(a.syndrome.to_byte()), Ok(a.syndrome));
            assert!(a.msn <= 0x00FF_FFFF);
            let mut buf = [0u8; 4];
            a.emit(&mut buf);
            assert_eq!(buf, a.to_bytes());
        }
        Err(WireError::Truncated) => assert!(data.len() < 4),
        Err(WireError::BadSyndrome(s)) => {
            assert_eq!(s, data[0]);
            assert!(!matches!(s & 0xE0, 0x00 | 0x20 | 0x60));
        }
        Err(e) => panic!("unexpected AETH error {e:?}"),
    }
    // Constructors mask and round-trip.
    if let Some(&s) = data.first() {
        let msn = be32(data.get(1..5).unwrap_or_default());
        let code = NakCode::from_code(s);
        assert_eq!(NakCode::from_code(code.code()), code);
        for a in [
            Aeth::ack(msn),
            Aeth::rnr_nak(s & 0x1F, msn),
            Aeth::nak(code, msn),
        ] {
            assert_eq!(Aeth::from_bytes(&a.to_bytes()), Ok(a));
        }
    }
}

fn check_deth(data: &[u8]) {
    match Deth::parse(data) {
        Ok(d) => {
            let mut expect: [u8; 8] = data[..8].try_into().unwrap();
            expect[4] = 0; // reserved
            assert_eq!(d.to_bytes(), expect);
            assert_eq!(Deth::from_bytes(&d.to_bytes()), d);
            assert!(d.src_qp <= QPN_MASK);
            let mut buf = [0u8; 8];
            d.emit(&mut buf);
            assert_eq!(buf, d.to_bytes());
        }
        Err(e) => assert!(data.len() < 8 && e == WireError::Truncated),
    }
}

fn check_imm(data: &[u8]) {
    match ImmDt::parse(data) {
        Ok(i) => {
            assert_eq!(&i.to_bytes()[..], &data[..4]);
            assert_eq!(ImmDt::from_bytes(&i.to_bytes()), i);
        }
        Err(e) => assert!(data.len() < 4 && e == WireError::Truncated),
    }
}

fn check_rnr(data: &[u8]) {
    let code = data.first().copied().unwrap_or(0);
    let d = rnr_timer_duration(code);
    assert_eq!(d, rnr_timer_duration(code & 0x1F));
    let c = rnr_timer_code_at_least(d);
    assert_eq!(rnr_timer_duration(c), d, "code {code}");
    let want = Duration::from_nanos(u64::from(be32(data.get(1..5).unwrap_or_default())));
    let c = rnr_timer_code_at_least(want);
    assert!(c <= 31);
    if want <= Duration::from_micros(655_360) {
        assert!(rnr_timer_duration(c) >= want, "{want:?} -> code {c}");
    }
}

fn check_icrc(data: &[u8]) {
    let ip = IpHeaderInfo::V4 {
        src: Ipv4Addr::new(10, 0, 0, 1),
        dst: Ipv4Addr::new(10, 0, 0, 2),
        identification: 7,
        dont_fragment: false,
    };
    let mut buf = data.to_vec();
    append_icrc(&ip, 1234, 4791, &mut buf);
    assert_eq!(buf.len(), data.len() + 4);
    assert_eq!(read_icrc(&buf), Some(compute_icrc(&ip, 1234, 4791, data)));
    assert!(verify_icrc(&ip, 1234, 4791, &buf));
    assert!(!verify_icrc(&ip, 1234, 4792, &buf));
    // BTH byte 4 (FECN, BECN, resv6a) is masked out of the ICRC.
    if buf.len() > 4 + 4 {
        buf[4] ^= 0xFF;
        assert!(verify_icrc(&ip, 1234, 4791, &buf));
    }
}

fuzz_target!(|data: &[u8]| {
    check_bth(data);
    check_reth(data);
    check_aeth(data);
    check_deth(data);
    check_imm(data);
    check_rnr(data);
    if data.len() <= 256 {
        check_icrc(data);
    }
    // The same codecs at the offset a BTH leaves them.
    if let Some(rest) = data.get(Bth::HEADER_LEN..) {
        check_reth(rest);
        check_aeth(rest);
        check_deth(rest);
    }
});
