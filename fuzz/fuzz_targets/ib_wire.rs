//! The native InfiniBand codecs and the software provider's InfiniBand receive path, on
//! arbitrary bytes: `parse_ib` (LRH, GRH, VCRC, ICRC), SMPs and their attributes (NodeInfo,
//! PortInfo, P_Key blocks), beacons, and a soft engine with an InfiniBand port (LID 4, a UD
//! QP attached to MLID 0xC000) handed the bytes as a datagram.
//!
//! Invariants: no panic; a packet `parse_ib` takes has the length its LRH says and a transport
//! part that ends in its ICRC; an SMP that parses emits back to one that parses the same; a
//! beacon that parses parses the same from its own bytes; PortInfo's fields round-trip through
//! `to_bytes`; the engine counts every datagram and transmits only beacons and packets that
//! `parse_ib` takes.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Mutex;
use std::time::Instant;

use ipoib_cm::soft::ib::Beacon;
use ipoib_cm::soft::{IbPortAttr, SoftConfig, SoftLink, SoftVerbs};
use ipoib_cm::verbs::setup::open_ud_qp;
use ipoib_cm::verbs::{CqId, Gid, Lid, PathMtu, QKey, QpType, Sl, Verbs, WrId};
use ipoib_cm::wire::ib::parse_ib;
use ipoib_cm::wire::smp::{NodeInfo, PkeyBlock, PortInfo, Smp};
use libfuzzer_sys::fuzz_target;

/// An engine with an active IB port and an attached UD QP, made once.
fn engine() -> &'static Mutex<(SoftVerbs, Instant, CqId)> {
    static E: std::sync::OnceLock<Mutex<(SoftVerbs, Instant, CqId)>> = std::sync::OnceLock::new();
    E.get_or_init(|| {
        let mut cfg = SoftConfig::new(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)));
        cfg.link = SoftLink::Infiniband;
        cfg.port_mtu = PathMtu::Mtu4096;
        let mut v = SoftVerbs::new(cfg);
        let now = Instant::now();
        let mut gid = [0u8; 16];
        gid[..2].copy_from_slice(&[0xfe, 0x80]);
        gid[15] = 4;
        v.set_ib_port(
            now,
            IbPortAttr {
                active: true,
                lid: Lid(4),
                lmc: 1,
                sm_lid: Lid(1),
                sm_sl: Sl::ZERO,
                gid: Gid(gid),
                pkeys: vec![0xFFFF, 0x0002],
                mtu: PathMtu::Mtu2048,
            },
        );
        let pd = v.alloc_pd().unwrap();
        let cq = v.create_cq(64).unwrap();
        let pool = v.create_pool(pd, 4200, 32).unwrap();
        let qp = open_ud_qp(
            &mut v,
            pd,
            QpType::Ud,
            cq,
            pool,
            QKey(0x0B1B),
            0,
            32,
            0,
            WrId(1),
        )
        .unwrap()
        .qp;
        let mut mgid = [0u8; 16];
        mgid[..4].copy_from_slice(&[0xff, 0x12, 0x40, 0x1b]);
        v.attach_mcast(qp, Gid(mgid), 0xC000).unwrap();
        Mutex::new((v, now, cq))
    })
}

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = parse_ib(data) {
        assert_eq!(f.lrh.pkt_len_bytes() + 2, data.len());
        assert!(f.transport.len() >= 16);
        let _ = ipoib_cm::wire::RocePacket::parse(f.transport);
    }
    if let Ok(s) = Smp::parse(data) {
        let again = Smp::parse(&s.emit()).expect("an emitted SMP parses");
        assert_eq!(again, s);
        let p = PortInfo::from_bytes(&s.data);
        assert_eq!(PortInfo::from_bytes(&p.to_bytes()), p);
        let n = NodeInfo::from_bytes(&s.data);
        assert_eq!(NodeInfo::from_bytes(&n.to_bytes()), n);
        let k = PkeyBlock::from_bytes(&s.data);
        assert_eq!(PkeyBlock::from_bytes(&k.to_bytes()), k);
    }
    if let Some(b) = Beacon::parse(data) {
        assert_eq!(Beacon::parse(&b.to_bytes()), Some(b));
    }
    let mut e = engine().lock().unwrap_or_else(|p| p.into_inner());
    let (v, now, cq) = &mut *e;
    let before = v.stats().rx_datagrams;
    let src = SocketAddr::from(([198, 18, 0, 2], 4791));
    v.handle_datagram(*now, src, IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)), data);
    assert_eq!(v.stats().rx_datagrams, before + 1);
    let mut wcs = Vec::new();
    v.poll_cq(*cq, &mut wcs, 64);
    for w in wcs {
        if let Some(b) = w.buf {
            let _ = v.post_recv(w.qp, WrId(1), b);
        }
    }
    let mut out = Vec::new();
    for _ in 0..8 {
        if v.poll_transmit(*now, &mut out).is_none() {
            break;
        }
        assert!(Beacon::parse(&out).is_some() || parse_ib(&out).is_ok());
    }
});
