//! The neighbour-table flood against a running daemon (issue 16, point 1): a rogue on the
//! underlay sends IPoIB ARP requests and IPv6 Neighbor Solicitations to node 1, each claiming
//! another sender IP and each with its own sender UD QPN. Out-of-prefix senders must not be
//! learned, the table must stay within its global and per-source caps, `status` must stay
//! small, and a ping stream between two real nodes must not stall while the flood's entries
//! expire (`--neigh-timeout 5s`).
//!
//! The lab (three namespaces by `scripts/lab.sh`, node 3's daemon stopped so its namespace is
//! the rogue, which takes extra underlay addresses as further sources) is created and removed
//! by the test; without root it is skipped.

mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::lab::Lab;
use ipoib_cm::verbs::{Gid, QpNum};
use ipoib_cm::wire::bth::{Bth, Opcode};
use ipoib_cm::wire::ext::Deth;
use ipoib_cm::wire::icrc::IpHeaderInfo;
use ipoib_cm::wire::ipoib::{
    ArpOp, HwAddr, IpoibArp, IpoibHeader, NeighborSolicitation, ETHERTYPE_ARP, ETHERTYPE_IPV6,
};
use ipoib_cm::wire::roce::RoceRepr;

const PREFIX: &str = "e2ehn";
const ROLE: &str = "IPOIB_CM_NEIGH_ROGUE";
/// ARP requests from the rogue's own address, each for another out-of-prefix sender IP.
const OUT_OF_PREFIX: u32 = 20_000;
/// Extra underlay addresses of the rogue (198.18.0.100 on), each a further source GID.
const SOURCES: u8 = 80;
/// Neighbor Solicitations per extra source, each for another in-prefix sender address.
const NS_PER_SOURCE: u16 = 24;
/// The `neigh_max` the daemon runs with here (below the flood's in-prefix senders, so that
/// the table fills) and the per-source cap (the default).
const NEIGH_MAX: u64 = 1024;
const PER_SOURCE_MAX: usize = 16;

/// The ping stream's figures: sent, received, and the longest RTT in ms of the replies to
/// pings sent before and after `split` (seconds since the epoch; `ping -D` stamps each reply
/// with its arrival).
fn ping_figures(out: &str, split: f64) -> (u64, u64, f64, f64) {
    let mut sent = 0;
    let mut received = 0;
    let (mut before, mut after) = (0f64, 0f64);
    for line in out.lines() {
        if let Some((tx, rest)) = line.split_once(" packets transmitted, ") {
            sent = tx.trim().parse().unwrap_or(0);
            received = rest
                .split_whitespace()
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
        }
        let stamp = line
            .strip_prefix('[')
            .and_then(|l| l.split_once(']'))
            .and_then(|(t, _)| t.parse::<f64>().ok());
        let rtt = line
            .split_once(" time=")
            .and_then(|(_, t)| t.split_whitespace().next()?.parse::<f64>().ok());
        if let (Some(at), Some(ms)) = (stamp, rtt) {
            if at - ms / 1000.0 < split {
                before = before.max(ms);
            } else {
                after = after.max(ms);
            }
        }
    }
    (sent, received, before, after)
}

fn epoch_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn rss_kib(lab: &Lab, k: usize) -> u64 {
    let pid = std::fs::read_to_string(lab.state.join(format!("node{k}.pid"))).unwrap_or_default();
    std::fs::read_to_string(format!("/proc/{}/status", pid.trim()))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Entries in node 1's table: the summary's total (or, from a daemon without it, the list).
fn total_entries(s: &serde_json::Value) -> u64 {
    s["neighbour_table"]["total"]
        .as_u64()
        .unwrap_or_else(|| s["neighbours"].as_array().map_or(0, |a| a.len() as u64))
}

#[test]
fn neighbour_flood_is_bounded_and_expiry_does_not_stall() {
    let neigh_max = NEIGH_MAX.to_string();
    let Some(lab) = Lab::up(
        PREFIX,
        3,
        &["--neigh-timeout", "5s", "--neigh-max", &neigh_max],
    ) else {
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
    let rss_before = rss_kib(&lab, 1);

    let add = format!(
        "for i in $(seq 100 {}); do ip addr add 198.18.0.$i/24 dev eth0; done",
        99 + u32::from(SOURCES)
    );
    let out = lab.exec(3, &["sh", "-c", &add], Duration::from_secs(30));
    assert!(out.status.success(), "{out:?}");

    // The stream across the flood and the expiry of what it left: 20 s at 100 per second.
    let pinger = Command::new("ip")
        .args(["netns", "exec", &format!("{PREFIX}1")])
        .args(["ping", "-n", "-D", "-i", "0.01", "-w", "20", "-W", "1"])
        .arg("198.19.0.2")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ping");

    let exe = std::env::current_exe().expect("test binary");
    let mut rogue = Command::new("ip");
    rogue
        .args(["netns", "exec", &format!("{PREFIX}3")])
        .arg(exe)
        .args(["--exact", "neigh_rogue_child", "--ignored", "--nocapture"])
        .env(ROLE, hw1.qpn.get().to_string());
    let out = common::lab::run_within(rogue, Duration::from_secs(120));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("ROGUE DONE"),
        "rogue: {text}"
    );
    let flood_over = epoch_secs();
    print!(
        "{}",
        text.lines()
            .filter(|l| l.starts_with("sent"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    println!();
    std::thread::sleep(Duration::from_millis(300));

    // The status right after the flood (a daemon frozen by the expiry does not answer).
    let asked = Instant::now();
    let answer = lab.sh(&["status", "1"]);
    let status_took = asked.elapsed();
    let rss_full = rss_kib(&lab, 1);
    let full: serde_json::Value = if answer.status.success() {
        serde_json::from_slice(&answer.stdout).expect("status JSON")
    } else {
        serde_json::Value::Null
    };
    let ping = pinger.wait_with_output().expect("ping output");
    let (sent, received, flood_max_ms, max_ms) =
        ping_figures(&String::from_utf8_lossy(&ping.stdout), flood_over);
    let json_len = answer.stdout.len();
    let p = &full["provider"];
    let n = |k: &str| p[k].as_u64().unwrap_or(0);
    let total = total_entries(&full);
    let shown = full["neighbours"].as_array().cloned().unwrap_or_default();
    println!(
        "flood: {total} entries ({} shown, {json_len} bytes of JSON, status took {status_took:?}), \
         RSS {rss_before} -> {rss_full} KiB; neigh_out_of_prefix {} neigh_table_full {} \
         neigh_source_full {} neigh_evicted {} rx_ud_dropped {}; \
         ping {received}/{sent}, max RTT {flood_max_ms} ms during the flood, \
         {max_ms} ms after it (across the expiry)",
        shown.len(),
        n("neigh_out_of_prefix"),
        n("neigh_table_full"),
        n("neigh_source_full"),
        n("neigh_evicted"),
        n("rx_ud_dropped"),
    );
    assert!(
        answer.status.success(),
        "status did not answer after the flood ({status_took:?})"
    );
    assert!(total <= NEIGH_MAX + 4, "{total} entries");
    assert!(shown.len() <= 256, "{} entries in the status", shown.len());
    assert!(
        !shown
            .iter()
            .any(|e| e["ip"].as_str().is_some_and(|ip| ip.starts_with("10."))),
        "out-of-prefix senders learned"
    );
    assert!(n("neigh_out_of_prefix") >= 1000, "{p}");
    assert!(n("neigh_source_full") >= 1, "{p}");
    assert!(n("neigh_table_full") >= 1, "{p}");
    let mut per_gid = std::collections::HashMap::<String, usize>::new();
    for e in &shown {
        if let Some(gid) = e["hwaddr"].as_str().and_then(|h| h.get(12..)) {
            *per_gid.entry(gid.to_owned()).or_default() += 1;
        }
    }
    assert!(
        per_gid.values().all(|&c| c <= PER_SOURCE_MAX),
        "{per_gid:?}"
    );
    // The real peer is still there.
    assert!(
        shown.iter().any(|e| e["ip"] == "198.19.0.2") || total > 256,
        "198.19.0.2 gone"
    );

    let after = lab.status(1);
    println!(
        "after expiry: {} entries, RSS {} KiB",
        total_entries(&after),
        rss_kib(&lab, 1),
    );
    assert!(sent >= 500, "ping sent {sent}");
    assert!(received * 10 >= sent * 9, "ping {received}/{sent}");
    assert!(max_ms < 100.0, "ping max RTT {max_ms} ms across the expiry");
    assert!(total_entries(&after) <= 8, "{}", after["neighbours"]);
    lab.ping_ok(1, "198.19.0.2", &[]);
    lab.ping_ok(2, "198.19.0.1", &[]);
}

/// Builds a RoCEv2 UD SEND from `src` to node 1's UD QP.
fn ud_datagram(src: Ipv4Addr, ud_qpn: u32, payload: &[u8]) -> Vec<u8> {
    let mut r = RoceRepr::new(Bth::new(Opcode::UD_SEND_ONLY, ud_qpn, 0));
    r.deth = Some(Deth {
        qkey: 0x0B1B,
        src_qp: 0x99,
    });
    let ip = IpHeaderInfo::V4 {
        src,
        dst: Ipv4Addr::new(198, 18, 0, 1),
        identification: 0,
        dont_fragment: true,
    };
    let mut out = Vec::new();
    r.emit(payload, &ip, 4791, 4791, &mut out);
    out
}

fn ipoib(ethertype: u16, body: &[u8]) -> Vec<u8> {
    let mut p = IpoibHeader::new(ethertype).to_bytes().to_vec();
    p.extend_from_slice(body);
    p
}

/// Not a test on its own: run in the rogue namespace by the test above.
#[test]
#[ignore = "helper, run inside a namespace by neighbour_flood_is_bounded_and_expiry_does_not_stall"]
fn neigh_rogue_child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let ud_qpn: u32 = role.trim().parse().expect("ud qpn");
    let to = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)), 4791);
    let mut qpn = 0x1000u32;
    let mut next_qpn = || {
        qpn += 1;
        QpNum::new(qpn)
    };
    let bind = |a: Ipv4Addr| {
        ipoib_cm::soft::transport::UdpTransport::bind(SocketAddr::new(IpAddr::V4(a), 4791))
            .expect("bind")
    };
    // (socket index, datagram), interleaved so that every source is busy throughout.
    let own = Ipv4Addr::new(198, 18, 0, 3);
    let mut socks = vec![bind(own)];
    let mut datagrams: Vec<(usize, Vec<u8>)> = Vec::new();
    let arp = |sender: Ipv4Addr, hw: HwAddr| {
        let a = IpoibArp {
            op: ArpOp::Request,
            sender_hw: hw,
            sender_ip: sender,
            target_hw: HwAddr::new(0, QpNum::new(0), Gid::from(Ipv4Addr::UNSPECIFIED)),
            target_ip: Ipv4Addr::new(198, 19, 0, 1),
        };
        ipoib(ETHERTYPE_ARP, &a.to_bytes())
    };
    for i in 0..OUT_OF_PREFIX {
        let [_, b, c, d] = (i + 1).to_be_bytes();
        let hw = HwAddr::new(0x80, next_qpn(), Gid::from(own));
        let body = arp(Ipv4Addr::new(10, b, c, d), hw);
        datagrams.push((0, ud_datagram(own, ud_qpn, &body)));
    }
    // In-prefix ARP from the one source: more than its per-source share.
    for d in 10..=250u8 {
        let hw = HwAddr::new(0x80, next_qpn(), Gid::from(own));
        let body = arp(Ipv4Addr::new(198, 19, 0, d), hw);
        let at = usize::from(d) * 60;
        datagrams.insert(
            at.min(datagrams.len()),
            (0, ud_datagram(own, ud_qpn, &body)),
        );
    }
    // In-prefix Neighbor Solicitations from many sources: more than the whole table.
    let mut ns = Vec::new();
    for s in 0..SOURCES {
        let src = Ipv4Addr::new(198, 18, 0, 100 + s);
        socks.push(bind(src));
        for j in 0..NS_PER_SOURCE {
            let hw = HwAddr::new(0x80, next_qpn(), Gid::from(src));
            let ip = Ipv6Addr::new(0x2001, 0xdb8, 0x19, 0, 0, 0, 0x100 + u16::from(s), 1 + j);
            let target = Ipv6Addr::new(0x2001, 0xdb8, 0x19, 0, 0, 0, 0, 1);
            let mut packet = NeighborSolicitation::new(ip, hw, target);
            packet.dst = target;
            let body = ipoib(ETHERTYPE_IPV6, &packet.to_packet());
            ns.push((socks.len() - 1, ud_datagram(src, ud_qpn, &body)));
        }
    }
    // Spread the solicitations through the ARP flood.
    let every = datagrams.len() / ns.len().max(1);
    for (k, d) in ns.into_iter().enumerate() {
        let at = (k * (every + 1)).min(datagrams.len());
        datagrams.insert(at, d);
    }
    let start = Instant::now();
    for chunk in datagrams.chunks(16) {
        for (s, d) in chunk {
            let _ = socks[*s].send_to(d, to);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    println!(
        "sent {} datagrams from {} sources in {:?}",
        datagrams.len(),
        socks.len(),
        start.elapsed()
    );
    println!("ROGUE DONE");
}
