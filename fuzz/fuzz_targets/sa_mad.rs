//! `SaMad::parse` on arbitrary bytes, then the SA client fed the same bytes as responses.
//!
//! The error (or success) must be the one a reference check of the raw header gives (length,
//! base version, class, class version, method); when the MAD parses, `emit` gives back the
//! input but for the reserved header bytes, and the records re-encode to the input's bytes
//! with only reserved bits cleared. Then a client with a query, a join and a leave
//! outstanding takes the input (its TID pointed at each request in turn) and must neither
//! panic nor hold more than its caps.
#![no_main]

use std::time::{Duration, Instant};

use ipoib_cm::sa::{GroupOptions, SaClient, SaConfig, SmAddress};
use ipoib_cm::wire::cm::MAD_LEN;
use ipoib_cm::wire::sa::{
    McMemberRecord, PathRecord, SaError, SaMad, SaMethod, SA_CLASS_VERSION, SA_HEADER_LEN,
    SA_MGMT_CLASS,
};
use ipoib_cm::wire::Gid;
use libfuzzer_sys::fuzz_target;

fn expected(data: &[u8]) -> Result<(), SaError> {
    if data.len() < MAD_LEN {
        return Err(SaError::Truncated);
    }
    if data[0] != 1 {
        return Err(SaError::BadBaseVersion(data[0]));
    }
    if data[1] != SA_MGMT_CLASS {
        return Err(SaError::NotSa(data[1]));
    }
    if data[2] != SA_CLASS_VERSION {
        return Err(SaError::BadClassVersion(data[2]));
    }
    if SaMethod::from_u8(data[3]).is_none() {
        return Err(SaError::UnknownMethod(data[3]));
    }
    Ok(())
}

/// Reserved bits of a PathRecord: bits 30..28 of byte 44 and bytes 58..64.
fn path_reserved_cleared(b: &[u8]) -> [u8; 64] {
    let mut r: [u8; 64] = b[..64].try_into().unwrap();
    r[44] &= 0x8F;
    r[58..].fill(0);
    r
}

/// Reserved bits of an MCMemberRecord: byte 49's low seven bits and bytes 50..52.
fn mcmember_reserved_cleared(b: &[u8]) -> [u8; 52] {
    let mut r: [u8; 52] = b[..52].try_into().unwrap();
    r[49] &= 0x80;
    r[50..].fill(0);
    r
}

fuzz_target!(|data: &[u8]| {
    let parsed = SaMad::parse(data);
    match (expected(data), &parsed) {
        (Ok(()), Ok(_)) => {}
        (Err(e), Err(g)) => assert_eq!(*g, e),
        (e, g) => panic!("expected {e:?}, parse gave {g:?}"),
    }
    if let Ok(m) = parsed {
        let out = m.emit();
        assert_eq!(&out[..18], &data[..18]);
        assert_eq!(&out[18..20], &[0, 0]);
        assert_eq!(&out[20..46], &data[20..46]);
        assert_eq!(&out[46..48], &[0, 0]);
        assert_eq!(&out[48..], &data[48..MAD_LEN]);
        let rec = &data[SA_HEADER_LEN..];
        let p = m.path_record();
        assert_eq!(p.to_bytes(), path_reserved_cleared(rec));
        assert_eq!(PathRecord::from_bytes(&p.to_bytes()), p);
        let r = m.mcmember_record();
        assert_eq!(r.to_bytes(), mcmember_reserved_cleared(rec));
        assert_eq!(McMemberRecord::from_bytes(&r.to_bytes()), r);
    }

    // The client: a path query, a join and a leave outstanding, then the input as each
    // one's answer in turn.
    let t0 = Instant::now();
    let mut cfg = SaConfig::new(Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]), 0xFFFF);
    cfg.max_paths = 2;
    cfg.max_negative = 2;
    cfg.max_outstanding = 4;
    let mut c = SaClient::new(cfg, SmAddress { lid: 1, sl: 0 });
    let bcast = c.broadcast_mgid();
    c.path(t0, Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]));
    c.join(t0, bcast, GroupOptions::default());
    c.join(t0, Gid([0xff; 16]), GroupOptions { create: true, ..GroupOptions::default() });
    let mut tids = Vec::new();
    while let Some(o) = c.pop_transmit() {
        tids.push(u64::from_be_bytes(o.mad[8..16].try_into().unwrap()));
    }
    let mut buf = data.to_vec();
    for (i, tid) in tids.iter().enumerate() {
        if buf.len() >= 16 {
            buf[8..16].copy_from_slice(&(tid | (u64::from(data.len() as u8) << 40)).to_be_bytes());
        }
        let t = t0 + Duration::from_millis(i as u64 * 300);
        c.handle_mad(t, &buf);
        c.poll_timeout(t);
        c.path(t, Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3 + i as u8]));
        if i == 1 {
            c.leave(t, bcast);
        }
    }
    // Run every timer out; the client must end with nothing outstanding but retries.
    let mut t = t0;
    for _ in 0..64 {
        let Some(d) = c.next_deadline() else { break };
        t = t.max(d);
        c.poll_timeout(t);
        while c.pop_transmit().is_some() {}
        while c.pop_event().is_some() {}
    }
    let n = c.counters();
    assert!(n.sent >= 1);
    assert!(n.answered <= tids.len() as u64);
});
