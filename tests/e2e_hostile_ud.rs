//! A rogue host on the underlay against running daemons (issue 26, points 1-3): a namespace
//! of its own on the lab's bridge, 198.18.0.99, nothing spoofed at the UDP layer, sending
//! RoCEv2 UD datagrams with a correct ICRC to node 1's UD QP.
//!
//! - injection: IP packets with a real peer's source and with random sources of the /64 reach
//!   no host, and make node 1 resolve nothing and send nothing;
//! - reflection and amplification: solicitations whose link-layer option names node 2, and
//!   duplicate address detection probes with 20 extra `--peer`s on node 1, draw no datagram
//!   towards anyone but the rogue (at most one per datagram in);
//! - poisoning: an unsolicited advertisement binds nothing, and a rogue that claims node 3's
//!   address first, and again every 5 ms, holds it for seconds, not for good.
//!
//! Each prints its figures; the issue's closing note has them before and after. The labs are
//! made and removed by the tests; without root they are skipped.

mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::lab::Lab;
use ipoib_cm::verbs::{Gid, QpNum};
use ipoib_cm::wire::bth::{Bth, Opcode};
use ipoib_cm::wire::ext::Deth;
use ipoib_cm::wire::icrc::IpHeaderInfo;
use ipoib_cm::wire::ipoib::{
    ArpOp, HwAddr, IpoibArp, IpoibHeader, NeighborAdvertisement, NeighborSolicitation,
    ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6,
};
use ipoib_cm::wire::roce::RoceRepr;

const ROLE: &str = "IPOIB_CM_UD_ROGUE";
const ROGUE_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 99);
const ROGUE_QPN: u32 = 0x99;
const MULTICAST_QPN: u32 = 0xFF_FFFF;

/// The rogue's namespace on a lab's bridge, removed on drop.
struct Rogue {
    ns: String,
}

impl Rogue {
    fn attach(lab: &Lab) -> Self {
        let ns = format!("{}r", lab.prefix);
        let br = format!("{}br", lab.prefix);
        let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        let steps: [&[&str]; 6] = [
            &["netns", "add", &ns],
            &[
                "link", "add", "eth0", "netns", &ns, "mtu", "9000", "type", "veth", "peer", "name",
                "vrogue", "mtu", "9000", "netns", &br,
            ],
            &["-n", &br, "link", "set", "vrogue", "master", "br0", "up"],
            &["-n", &ns, "link", "set", "lo", "up"],
            &["-n", &ns, "addr", "add", "198.18.0.99/24", "dev", "eth0"],
            &["-n", &ns, "link", "set", "eth0", "up"],
        ];
        let rogue = Self { ns: ns.clone() };
        for s in steps {
            let out = Command::new("ip").args(s).output().expect("ip");
            assert!(out.status.success(), "ip {s:?}: {out:?}");
        }
        rogue
    }

    /// Runs this test binary's rogue helper in the namespace with `role`, at most `limit`.
    fn spawn(&self, role: &str) -> std::process::Child {
        let exe = std::env::current_exe().expect("test binary");
        Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(exe)
            .args(["--exact", "ud_rogue_child", "--ignored", "--nocapture"])
            .env(ROLE, role)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("rogue")
    }

    fn run(&self, role: &str, limit: Duration) -> String {
        let child = self.spawn(role);
        finish(child, limit)
    }
}

impl Drop for Rogue {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}

/// Waits for the rogue at most `limit` (then kills it); its output, which must say it is done.
fn finish(child: std::process::Child, limit: Duration) -> String {
    let out = common::child::output_within(child, limit);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("ROGUE DONE"),
        "rogue: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// A counter of node `k`'s status, endpoint's or provider's.
fn counter(s: &serde_json::Value, name: &str) -> u64 {
    s["provider"][name]
        .as_u64()
        .or_else(|| s["counters"][name].as_u64())
        .unwrap_or(0)
}

fn hwaddr(s: &serde_json::Value) -> HwAddr {
    s["interface"]["hwaddr"]
        .as_str()
        .and_then(|h| h.parse().ok())
        .expect("hwaddr")
}

fn entries(s: &serde_json::Value) -> u64 {
    s["neighbour_table"]["total"].as_u64().unwrap_or(0)
}

/// The rogue's figure `name=N` from its output.
fn figure(text: &str, name: &str) -> u64 {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
        .unwrap_or(0)
}

/// Point 1: 10 UDP packets with node 2's source (5 to node 1's UD QPN, 5 to the broadcast
/// group) and 3,000 ICMPv6 echo requests from random sources of the /64. Before: all
/// delivered (and answered), the answers resolved ~3,000 addresses.
#[test]
fn injected_ip_reaches_no_host_and_makes_the_node_resolve_nothing() {
    let Some(lab) = Lab::up("e2eud1", 2, &[]) else {
        return;
    };
    let rogue = Rogue::attach(&lab);
    lab.ping_ok(1, "198.19.0.2", &[]);
    lab.ping_ok(1, "2001:db8:19::2", &[]);
    let before = lab.status(1);
    let peer_before = lab.status(2);
    let hw1 = hwaddr(&before);
    let text = rogue.run(
        &format!("inject {}", hw1.qpn.get()),
        Duration::from_secs(30),
    );
    std::thread::sleep(Duration::from_secs(3));
    let after = lab.status(1);
    let peer_after = lab.status(2);
    let d = |name: &str| counter(&after, name) - counter(&before, name);
    let delivered = d("rx_packets");
    let sent = d("tx_packets");
    let to_peer = counter(&peer_after, "rx_datagrams") - counter(&peer_before, "rx_datagrams");
    let new_entries = entries(&after).saturating_sub(entries(&before));
    println!(
        "injection: rogue sent {}; node 1 delivered {delivered}, sent {sent} datagrams ({to_peer} \
         reached node 2), {new_entries} new neighbour entries; drops: spoofed {} unbound {} \
         unknown sender {}",
        figure(&text, "sent"),
        d("rx_ud_spoofed_drops"),
        d("rx_ud_unbound_drops"),
        d("rx_ud_unknown_sender_drops"),
    );
    assert_eq!(delivered, 0, "injected packets delivered");
    assert!(new_entries <= 2, "{new_entries} new entries");
    assert!(sent <= 10, "node 1 sent {sent} datagrams");
    assert_eq!(d("rx_ud_spoofed_drops"), 10);
    assert_eq!(d("rx_ud_unbound_drops"), 3000);
    lab.ping_ok(1, "198.19.0.2", &[]);
}

/// Point 2: 20 solicitations for node 1 whose link-layer option names node 2, then 200
/// duplicate address detection probes, with 20 extra (absent) `--peer`s on node 1. Before:
/// node 2 got 20 advertisements, and each probe drew a multicast advertisement copied to
/// every peer (about 4,400 datagrams).
#[test]
fn nd_answers_are_not_reflected_nor_amplified() {
    let Some(lab) = Lab::up("e2eud2", 2, &[]) else {
        return;
    };
    let rogue = Rogue::attach(&lab);
    for i in 0..20 {
        let addr = format!("198.18.0.{}", 150 + i);
        let sock = lab.socket(1);
        let out = lab.exec(
            1,
            &[
                common::lab::BIN,
                "peer",
                "add",
                &addr,
                "--control-socket",
                sock.to_str().unwrap_or_default(),
            ],
            Duration::from_secs(10),
        );
        assert!(out.status.success(), "peer add: {out:?}");
    }
    lab.ping_ok(1, "2001:db8:19::2", &[]);
    std::thread::sleep(Duration::from_millis(300));
    let before = lab.status(1);
    let peer_before = lab.status(2);
    let hw1 = hwaddr(&before);
    let hw2 = hwaddr(&peer_before);
    let role = format!(
        "reflect {} {} {}",
        hw1.qpn.get(),
        hw2.qpn.get(),
        hw2.gid.to_ip()
    );
    let text = rogue.run(&role, Duration::from_secs(30));
    let after = lab.status(1);
    let peer_after = lab.status(2);
    let d = |name: &str| counter(&after, name) - counter(&before, name);
    let sent = d("tx_packets");
    let to_peer = counter(&peer_after, "rx_datagrams") - counter(&peer_before, "rx_datagrams");
    let rogue_got = figure(&text, "received");
    let datagrams_in = figure(&text, "sent");
    let towards_others = sent.saturating_sub(rogue_got);
    println!(
        "reflection: rogue sent {datagrams_in}, received {rogue_got}; node 1 sent {sent} \
         datagrams, {towards_others} towards others ({} per datagram in), {to_peer} reached \
         node 2; unvouched {} budget drops {}",
        towards_others as f64 / datagrams_in.max(1) as f64,
        d("neigh_unvouched_drops"),
        d("neigh_answer_budget_drops"),
    );
    assert_eq!(datagrams_in, 220);
    // The host's own multicast (MLD, router solicitations) crosses the fan-out too: a few.
    assert!(to_peer <= 5, "node 2 got {to_peer} datagrams");
    assert!(
        towards_others * 2 <= datagrams_in,
        "{towards_others} datagrams towards others for {datagrams_in} in"
    );
    assert!(rogue_got <= 200, "rogue got {rogue_got}");
    assert_eq!(d("neigh_unvouched_drops"), 20);
}

/// Point 3: an unsolicited advertisement (S=1) for node 3's IPv6 address binds nothing; a
/// rogue that claims node 3's IPv4 address before node 1 knows it, and again every 5 ms,
/// while node 1 pings it 10 times a second for 20 s. Before: the advertisement bound the
/// address to the rogue, and every ping was lost (the rogue took the address back within
/// 5 ms of each connection failure).
#[test]
fn a_rogue_claim_costs_seconds_not_the_address() {
    let Some(lab) = Lab::up("e2eud3", 3, &[]) else {
        return;
    };
    let rogue = Rogue::attach(&lab);
    let before = lab.status(1);
    let hw1 = hwaddr(&before);
    rogue.run(
        &format!("advertise {}", hw1.qpn.get()),
        Duration::from_secs(10),
    );
    std::thread::sleep(Duration::from_millis(200));
    let v6_bound = lab.status(1)["neighbours"]
        .as_array()
        .is_some_and(|a| a.iter().any(|e| e["ip"] == "2001:db8:19::3"));
    let child = rogue.spawn(&format!("claim {} 22", hw1.qpn.get()));
    std::thread::sleep(Duration::from_millis(500));
    let start = epoch_secs();
    let ping = lab.exec(
        1,
        &[
            "ping",
            "-n",
            "-D",
            "-i",
            "0.1",
            "-c",
            "200",
            "-W",
            "1",
            "198.19.0.3",
        ],
        Duration::from_secs(40),
    );
    let text = finish(child, Duration::from_secs(10));
    let out = String::from_utf8_lossy(&ping.stdout);
    let replies: Vec<f64> = out
        .lines()
        .filter(|l| l.contains(" time="))
        .filter_map(|l| l.strip_prefix('[')?.split_once(']')?.0.parse().ok())
        .collect();
    let first = replies.first().map(|t| t - start);
    let after = lab.status(1);
    let d = |name: &str| counter(&after, name) - counter(&before, name);
    println!(
        "poisoning: rogue sent {} claims; pings {}/200, first reply after {first:?} s; \
         unsolicited drops {}, conflicts {}, probes {}, bindings failed {}, v6 bound {v6_bound}",
        figure(&text, "sent"),
        replies.len(),
        d("neigh_unsolicited_drops"),
        d("neigh_conflicts"),
        d("neigh_probes"),
        d("neigh_bindings_failed"),
    );
    assert!(
        !v6_bound,
        "the unsolicited advertisement bound 2001:db8:19::3"
    );
    assert!(replies.len() >= 120, "{} replies of 200", replies.len());
    assert!(
        first.is_some_and(|f| f < 8.0),
        "first reply after {first:?} s"
    );
    lab.ping_ok(3, "198.19.0.1", &[]);
}

fn epoch_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A RoCEv2 UD SEND from the rogue to `dst_qpn` at node 1 (`psn` tells multicast copies apart).
fn ud_datagram(dst_qpn: u32, psn: u32, ethertype: u16, body: &[u8]) -> Vec<u8> {
    let mut payload = IpoibHeader::new(ethertype).to_bytes().to_vec();
    payload.extend_from_slice(body);
    let mut r = RoceRepr::new(Bth::new(Opcode::UD_SEND_ONLY, dst_qpn, psn & 0xFF_FFFF));
    r.deth = Some(Deth {
        qkey: 0x0B1B,
        src_qp: ROGUE_QPN,
    });
    let ip = IpHeaderInfo::V4 {
        src: ROGUE_IP,
        dst: Ipv4Addr::new(198, 18, 0, 1),
        identification: 0,
        dont_fragment: true,
    };
    let mut out = Vec::new();
    r.emit(&payload, &ip, 4791, 4791, &mut out);
    out
}

fn rogue_hw() -> HwAddr {
    HwAddr::new(0x80, QpNum::new(ROGUE_QPN), Gid::from(ROGUE_IP))
}

fn v6(last: u16) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, 0x19, 0, 0, 0, 0, last)
}

fn udp4(src: Ipv4Addr, dst: Ipv4Addr) -> Vec<u8> {
    let mut out = Vec::new();
    etherparse::PacketBuilder::ipv4(src.octets(), dst.octets(), 64)
        .udp(5353, 7777)
        .write(&mut out, b"injected")
        .expect("udp");
    out
}

fn echo6(src: Ipv6Addr, dst: Ipv6Addr, seq: u16) -> Vec<u8> {
    let mut out = Vec::new();
    etherparse::PacketBuilder::ipv6(src.octets(), dst.octets(), 64)
        .icmpv6_echo_request(0x99, seq)
        .write(&mut out, b"injected")
        .expect("echo");
    out
}

/// Datagrams that arrive at the rogue's socket within `d`.
fn drain(sock: &UdpSocket, d: Duration) -> u64 {
    let end = Instant::now() + d;
    let mut buf = [0u8; 9000];
    let mut n = 0;
    let _ = sock.set_read_timeout(Some(Duration::from_millis(20)));
    while Instant::now() < end {
        if sock.recv_from(&mut buf).is_ok() {
            n += 1;
        }
    }
    n
}

/// Not a test on its own: the rogue, run in its namespace by the tests above.
#[test]
#[ignore = "helper, run inside a namespace by the tests of this file"]
fn ud_rogue_child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let args: Vec<&str> = role.split_whitespace().collect();
    let qpn = |i: usize| -> u32 { args.get(i).and_then(|a| a.parse().ok()).expect("qpn") };
    let sock = UdpSocket::bind(SocketAddr::new(IpAddr::V4(ROGUE_IP), 4791)).expect("bind");
    let to = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)), 4791);
    let mut sent = 0u64;
    let mut send = |d: Vec<u8>| {
        let _ = sock.send_to(&d, to);
        sent += 1;
    };
    let mut received = 0;
    match args.first().copied() {
        Some("inject") => {
            let ud = qpn(1);
            let p = udp4(Ipv4Addr::new(198, 19, 0, 2), Ipv4Addr::new(198, 19, 0, 1));
            for i in 0..5 {
                send(ud_datagram(ud, i, ETHERTYPE_IPV4, &p));
                send(ud_datagram(MULTICAST_QPN, 1000 + i, ETHERTYPE_IPV4, &p));
            }
            let mut seed = 0x2545_f491_4f6c_dd1du64;
            for i in 0..3000u16 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let w = |s: u32| (seed >> s) as u16;
                let src = Ipv6Addr::new(0x2001, 0xdb8, 0x19, 0, w(0), w(16), w(32), w(48) | 0x100);
                send(ud_datagram(ud, 0, ETHERTYPE_IPV6, &echo6(src, v6(1), i)));
                if i % 16 == 15 {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
        Some("reflect") => {
            let (ud, peer_qpn) = (qpn(1), qpn(2));
            let peer_gid = args
                .get(3)
                .and_then(|a| a.parse::<IpAddr>().ok())
                .map(Gid::from_ip)
                .expect("peer gid");
            let peer = HwAddr::new(0x80, QpNum::new(peer_qpn), peer_gid);
            for i in 0..20u16 {
                let mut ns = NeighborSolicitation::new(v6(0x900 + i), peer, v6(1));
                ns.dst = v6(1);
                send(ud_datagram(ud, 0, ETHERTYPE_IPV6, &ns.to_packet()));
            }
            let dad = NeighborSolicitation::new(Ipv6Addr::UNSPECIFIED, rogue_hw(), v6(1));
            for i in 0..200u32 {
                send(ud_datagram(
                    MULTICAST_QPN,
                    5000 + i,
                    ETHERTYPE_IPV6,
                    &dad.to_packet(),
                ));
                if i % 20 == 19 {
                    received += drain(&sock, Duration::from_millis(50));
                }
            }
            received += drain(&sock, Duration::from_secs(2));
        }
        Some("advertise") => {
            let ud = qpn(1);
            let na = NeighborAdvertisement {
                src: v6(3),
                dst: v6(1),
                target: v6(3),
                router: false,
                solicited: true,
                override_flag: true,
                target_hw: Some(rogue_hw()),
            };
            for _ in 0..3 {
                send(ud_datagram(ud, 0, ETHERTYPE_IPV6, &na.to_packet()));
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Some("claim") => {
            let ud = qpn(1);
            let secs: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(20);
            let claim = IpoibArp {
                op: ArpOp::Request,
                sender_hw: rogue_hw(),
                sender_ip: Ipv4Addr::new(198, 19, 0, 3),
                target_hw: HwAddr::new(0, QpNum::new(0), Gid::from(Ipv4Addr::UNSPECIFIED)),
                target_ip: Ipv4Addr::new(198, 19, 0, 1),
            };
            let claim = ud_datagram(ud, 0, ETHERTYPE_ARP, &claim.to_bytes());
            let end = Instant::now() + Duration::from_secs(secs);
            while Instant::now() < end {
                send(claim.clone());
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        other => panic!("no such role {other:?}"),
    }
    println!("sent={sent} received={received}");
    println!("ROGUE DONE");
}
