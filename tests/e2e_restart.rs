//! Restarting peers and forged restart signals, against running daemons in namespaces made by
//! `scripts/lab.sh` (removed by the test; without root it is skipped):
//!
//! - node 2 is SIGKILLed and started again five times while both nodes ping each other from
//!   the moment the restarted daemon answers `status`: no ping may be lost, and node 1 counts
//!   each restart (`peer_restarts`);
//! - a third namespace forges REQs (from node 2's own address and port, and from another port)
//!   and ARP replies (from node 2's address, another port) that announce a restart of node 2
//!   with a new UD QPN and CA GUID: node 1 keeps its TX connection (same QPN, no new
//!   establishment), its neighbour entry and its RX connection, and pings carry on.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Command;
use std::time::{Duration, Instant};

use common::lab::{ping_received as received, provider_of as provider, Lab};
use ipoib_cm::verbs::{Gid, PathMtu, Psn, QpNum};
use ipoib_cm::wire::bth::{Bth, Opcode};
use ipoib_cm::wire::cm::{ipoib_service_id, CmMad, CmMessage, CmPath, IpoibCmData, Req};
use ipoib_cm::wire::ext::Deth;
use ipoib_cm::wire::icrc::IpHeaderInfo;
use ipoib_cm::wire::ipoib::{
    ArpOp, HwAddr, IpoibArp, IpoibHeader, ETHERTYPE_ARP, IPOIB_CM_BUF_SIZE,
};
use ipoib_cm::wire::roce::RoceRepr;

const ROLE: &str = "IPOIB_CM_RESTART_SPOOFER";

#[test]
fn five_sigkill_restarts_lose_no_ping_after_ready() {
    let Some(lab) = Lab::up("e2ert", 2, &[]) else {
        return;
    };
    lab.ping_ok(1, "198.19.0.2", &[]);
    lab.ping_ok(2, "198.19.0.1", &[]);
    const PINGS: u32 = 10;
    let mut lost = Vec::new();
    for cycle in 0..5 {
        assert!(lab.sh(&["kill", "2"]).status.success());
        std::thread::sleep(Duration::from_millis(300));
        let start = lab.sh(&["start", "2"]);
        assert!(
            start.status.success(),
            "restart {cycle}: {}",
            String::from_utf8_lossy(&start.stderr)
        );
        // Ready (it answers status): both ways at once from now on.
        let to2 = lab.start_ping(1, "198.19.0.2", PINGS);
        let to1 = lab.start_ping(2, "198.19.0.1", PINGS);
        let (got2, got1) = (received(to2), received(to1));
        lost.push((PINGS - got2, PINGS - got1));
    }
    let total: u32 = lost.iter().map(|(a, b)| a + b).sum();
    let s1 = lab.status(1);
    println!(
        "restarts: pings lost after ready per cycle (1->2, 2->1) {lost:?}, {total} of {} in all; \
         node 1 peer_restarts {} tx_failed {} rx_stale_reaped {}",
        5 * 2 * PINGS,
        provider(&s1, "peer_restarts"),
        s1["counters"]["tx_failed"],
        s1["counters"]["rx_stale_reaped"],
    );
    assert_eq!(
        total, 0,
        "pings lost after the restarted daemon was ready: {lost:?}"
    );
    assert!(provider(&s1, "peer_restarts") >= 5, "{}", s1["provider"]);
    // The old incarnations' connections are gone: one TX and one RX connection to node 2.
    let live_rx = s1["rx"]
        .as_array()
        .map_or(0, |r| r.iter().filter(|c| c["state"] == "live").count());
    assert_eq!(live_rx, 1, "{}", s1["rx"]);
    assert_eq!(s1["tx"].as_array().map_or(0, Vec::len), 1, "{}", s1["tx"]);
}

/// Node 1's view of its connection to node 2: (TX QPN, TX establishments, node 2's hardware
/// address in the neighbour table, the QPN of the live RX connection).
fn view(s: &serde_json::Value) -> (u64, u64, serde_json::Value, u64) {
    let tx = s["tx"][0]["qpn"].as_u64().expect("tx qpn");
    let est = s["counters"]["tx_established"]
        .as_u64()
        .expect("tx_established");
    let hw = s["neighbours"]
        .as_array()
        .and_then(|n| n.iter().find(|e| e["ip"] == "198.19.0.2"))
        .map(|e| e["hwaddr"].clone())
        .expect("neighbour 198.19.0.2");
    let rx = s["rx"]
        .as_array()
        .and_then(|r| r.iter().find(|c| c["state"] == "live"))
        .and_then(|c| c["qpn"].as_u64())
        .expect("live rx");
    (tx, est, hw, rx)
}

#[test]
fn forged_restarts_from_a_third_namespace_change_nothing() {
    let Some(lab) = Lab::up("e2ers", 3, &[]) else {
        return;
    };
    assert!(lab.sh(&["stop", "3"]).status.success());
    lab.ping_ok(1, "198.19.0.2", &[]);
    lab.ping_ok(2, "198.19.0.1", &[]);
    let before = lab.status(1);
    let hw1: HwAddr = before["interface"]["hwaddr"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("hwaddr");
    let seen = view(&before);
    let pings = lab.start_ping(1, "198.19.0.2", 40);
    std::thread::sleep(Duration::from_millis(300));
    let exe = std::env::current_exe().expect("test binary");
    let out = Command::new("ip")
        .args(["netns", "exec", &format!("{}3", lab.prefix)])
        .arg(exe)
        .args(["--exact", "spoofer_child", "--ignored", "--nocapture"])
        .env(ROLE, hw1.qpn.get().to_string())
        .output()
        .expect("spoofer");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("SPOOFER DONE"),
        "spoofer: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = received(pings);
    std::thread::sleep(Duration::from_millis(300));
    let after = lab.status(1);
    println!(
        "forged restarts: pings {got}/40; node 1 before {seen:?} after {:?}; neigh_foreign_port {} \
         peer_restarts {} REQs accepted {} -> {}",
        view(&after),
        provider(&after, "neigh_foreign_port"),
        provider(&after, "peer_restarts"),
        before["counters"]["rx_accepted"],
        after["counters"]["rx_accepted"],
    );
    assert_eq!(
        view(&after),
        seen,
        "a forged restart changed node 1's connection"
    );
    assert_eq!(provider(&after, "peer_restarts"), 0);
    assert!(
        provider(&after, "neigh_foreign_port") >= 1,
        "{}",
        after["provider"]
    );
    assert_eq!(got, 40, "pings lost during the forgeries");
    lab.ping_ok(2, "198.19.0.1", &[]);
}

/// A RoCEv2 datagram to node 1 that claims to come from node 2 (198.18.0.2) at UDP source
/// port `sport`, inside an IPv4 header for a raw socket.
fn forged(repr: &RoceRepr, payload: &[u8], sport: u16) -> Vec<u8> {
    let (src, dst) = (Ipv4Addr::new(198, 18, 0, 2), Ipv4Addr::new(198, 18, 0, 1));
    let ip = IpHeaderInfo::V4 {
        src,
        dst,
        identification: 0,
        dont_fragment: true,
    };
    let mut roce = Vec::new();
    repr.emit(payload, &ip, sport, 4791, &mut roce);
    let udp_len = 8 + roce.len();
    let total = 20 + udp_len;
    let mut p = Vec::with_capacity(total);
    p.extend_from_slice(&[0x45, 0]);
    p.extend_from_slice(&u16::try_from(total).unwrap().to_be_bytes());
    p.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(&sport.to_be_bytes());
    p.extend_from_slice(&4791u16.to_be_bytes());
    p.extend_from_slice(&u16::try_from(udp_len).unwrap().to_be_bytes());
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(&roce);
    p
}

fn ud(qpn: u32, qkey: u32, src_qp: u32) -> RoceRepr {
    let mut r = RoceRepr::new(Bth::new(Opcode::UD_SEND_ONLY, qpn, 0));
    r.deth = Some(Deth { qkey, src_qp });
    r
}

/// Not a test on its own: run in the third namespace by the test above.
#[test]
#[ignore = "helper, run inside a namespace by forged_restarts_from_a_third_namespace_change_nothing"]
fn spoofer_child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let ud_qpn: u32 = role.trim().parse().expect("node 1's UD QPN");
    let sock = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::RAW,
        Some(socket2::Protocol::from(libc::IPPROTO_RAW)),
    )
    .expect("raw socket");
    let to = socket2::SockAddr::from(SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)), 0));
    let node1 = Gid::from(Ipv4Addr::new(198, 18, 0, 1));
    let node2 = Gid::from(Ipv4Addr::new(198, 18, 0, 2));
    let new_ud_qpn = QpNum::new(0x00AB_C123);
    let mut datagrams = Vec::new();
    for i in 0..3u32 {
        // A REQ announcing a new incarnation of node 2 (new CA GUID, new UD QPN).
        let mut private = [0u8; Req::PRIVATE_DATA_LEN];
        private[..8].copy_from_slice(
            &IpoibCmData {
                qpn: new_ud_qpn,
                mtu: IPOIB_CM_BUF_SIZE,
            }
            .to_bytes(),
        );
        let req = Req {
            local_comm_id: 0x5EED_0000 + i,
            service_id: ipoib_service_id(QpNum::new(ud_qpn), true),
            local_ca_guid: 0xBAD0_0000_0000_0001 + u64::from(i),
            local_qpn: QpNum::new(0x00CD_E000 + i),
            remote_cm_response_timeout: 16,
            transport_service_type: Req::TRANSPORT_RC,
            starting_psn: Psn::new(0x1234),
            local_cm_response_timeout: 16,
            retry_count: 7,
            pkey: 0xFFFF,
            path_mtu: Some(PathMtu::Mtu1024),
            rnr_retry_count: 7,
            max_cm_retries: 2,
            primary_path: CmPath {
                local_gid: node2,
                remote_gid: node1,
                local_ack_timeout: 14,
                hop_limit: 64,
                ..CmPath::default()
            },
            private_data: private,
            ..Req::default()
        };
        let mad = CmMad::new(u64::from(0x5EED_0000 + i), CmMessage::Req(req)).emit();
        // From node 2's own address and port, and from another port.
        for sport in [4791, 50_000] {
            datagrams.push(forged(&ud(1, 0x8001_0000, 1), &mad, sport));
        }
        // An ARP reply: "198.19.0.2 is at node 2's GID with a new UD QPN".
        let arp = IpoibArp {
            op: ArpOp::Reply,
            sender_hw: HwAddr::new(0x80, new_ud_qpn, node2),
            sender_ip: Ipv4Addr::new(198, 19, 0, 2),
            target_hw: HwAddr::new(0x80, QpNum::new(ud_qpn), node1),
            target_ip: Ipv4Addr::new(198, 19, 0, 1),
        };
        let mut payload = IpoibHeader::new(ETHERTYPE_ARP).to_bytes().to_vec();
        payload.extend_from_slice(&arp.to_bytes());
        datagrams.push(forged(
            &ud(ud_qpn, 0x0B1B, new_ud_qpn.get()),
            &payload,
            50_000,
        ));
    }
    let start = Instant::now();
    for d in &datagrams {
        sock.send_to(d, &to).expect("send");
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "sent {} forged datagrams in {:?}",
        datagrams.len(),
        start.elapsed()
    );
    println!("SPOOFER DONE");
}
