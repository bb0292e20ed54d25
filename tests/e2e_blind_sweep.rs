//! What a blind off-path injector can do to a running connection: a rogue node on the
//! underlay (the third namespace of a `scripts/lab.sh` lab, its daemon stopped) spoofs node
//! 2's underlay address and RoCEv2 port (198.18.0.2:4791) towards node 1, with raw IPv4.
//!
//! - `blind_injector_is_absorbed_and_counted` (fast, asserting): the QPNs of two daemons and
//!   of a restarted daemon share nothing (a blind sender cannot derive the receive QPN from
//!   anything it sees, so it would need QPN x PSN = 2^48 guesses); a PSN sweep of RC
//!   SEND_ONLY packets aimed at node 1's receive QP (QPN handed to the rogue: the worst case)
//!   is absorbed and counted while a ping runs through that QP; SEND_MIDDLE packets with a
//!   wrong PSN, opcodes an RC receive QP does not take and forged NAKs do not kill the QP.
//! - `blind_psn_sweep_until_injection` (`--ignored`, a measurement): sweeps PSNs until a
//!   forged datagram reaches a UDP socket behind node 1's TUN (an injection), bounded in time;
//!   prints packets until the first success, the rate, and the extrapolations.
//!
//! Labs are created and removed by the tests; without root they are skipped.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::lab::Lab;
use ipoib_cm::wire::bth::{Bth, Opcode};
use ipoib_cm::wire::ext::{Aeth, Deth, NakCode, Reth, Syndrome};
use ipoib_cm::wire::icrc::IpHeaderInfo;
use ipoib_cm::wire::ipoib::{HwAddr, IpoibHeader};
use ipoib_cm::wire::roce::{RocePacket, RoceRepr};

/// Environment of the rogue child: `MODE RX_QPN TX_QPN LIMIT_PACKETS LIMIT_SECS PPS STOPFILE`.
const ROGUE: &str = "IPOIB_CM_BLIND_ROGUE";
/// Environment of the listener child: the file it writes the first injected index to.
const LISTENER: &str = "IPOIB_CM_BLIND_LISTENER";
/// UDP port behind node 1's TUN that forged datagrams are addressed to.
const TARGET_PORT: u16 = 47_911;
/// The PSN space.
const PSNS: u64 = 1 << 24;

fn counter(s: &serde_json::Value, name: &str) -> u64 {
    s["provider"][name].as_u64().unwrap_or(0)
}

/// Node `s`'s QPNs as status shows them: its UD QPN (from its hardware address), its live
/// receive QPNs and its send QPNs.
fn qpns(s: &serde_json::Value) -> Vec<u64> {
    let hw: HwAddr = s["interface"]["hwaddr"]
        .as_str()
        .and_then(|h| h.parse().ok())
        .expect("hwaddr");
    let mut v = vec![u64::from(hw.qpn.get())];
    for side in ["rx", "tx"] {
        v.extend(
            s[side]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["qpn"].as_u64()),
        );
    }
    v
}

/// The smallest distance between a QPN of `a` and one of `b`.
fn min_distance(a: &[u64], b: &[u64]) -> u64 {
    a.iter()
        .flat_map(|x| b.iter().map(move |y| x.abs_diff(*y)))
        .min()
        .unwrap_or(u64::MAX)
}

/// A ping of `count` echoes every 20 ms from node `from`.
fn start_ping(lab: &Lab, from: usize, to: &str, count: u32) -> Child {
    Command::new("ip")
        .args(["netns", "exec", &format!("{}{from}", lab.prefix)])
        .args([
            "timeout", "120", "ping", "-n", "-i", "0.02", "-W", "2", "-c",
        ])
        .arg(count.to_string())
        .arg(to)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("ping")
}

/// (replies, max RTT in ms, echoes sent) of a finished ping.
fn ping_result(child: Child) -> (u32, f64, u32) {
    let out = child.wait_with_output().expect("ping output");
    let text = String::from_utf8_lossy(&out.stdout);
    let replies = text.lines().filter(|l| l.contains("time=")).count();
    let max = text
        .lines()
        .filter_map(|l| l.split("time=").nth(1))
        .filter_map(|t| t.split_whitespace().next())
        .filter_map(|t| t.parse::<f64>().ok())
        .fold(0.0, f64::max);
    let sent = text
        .split(',')
        .find_map(|part| part.trim().strip_suffix(" packets transmitted"))
        .and_then(|n| n.rsplit('\n').next()?.trim().parse().ok())
        .unwrap_or(0);
    (u32::try_from(replies).unwrap_or(0), max, sent)
}

/// This test binary again, as `child` inside node `k`'s namespace, with `env` set.
fn spawn_child(lab: &Lab, k: usize, child: &str, env: (&str, String)) -> Child {
    let exe = std::env::current_exe().expect("test binary");
    Command::new("ip")
        .args(["netns", "exec", &format!("{}{k}", lab.prefix)])
        .arg(exe)
        .args([
            "--exact",
            child,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(env.0, env.1)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("child")
}

/// Starts the listener in node 1 and waits (bounded) for it to be bound.
fn start_listener(lab: &Lab, hitfile: &Path) -> Child {
    let mut l = spawn_child(
        lab,
        1,
        "listener_child",
        (LISTENER, hitfile.display().to_string()),
    );
    let out = l.stdout.take().expect("listener stdout");
    let mut line = String::new();
    let mut r = BufReader::new(out);
    let _ = r.read_line(&mut line);
    // libtest prints "running 1 test" first.
    for _ in 0..8 {
        if line.contains("LISTENING") {
            break;
        }
        line.clear();
        let _ = r.read_line(&mut line);
    }
    assert!(line.contains("LISTENING"), "listener: {line}");
    std::thread::spawn(move || for _ in r.lines() {});
    l
}

/// Runs the rogue to completion and returns its stdout.
fn run_rogue(lab: &Lab, env: String) -> String {
    let out = spawn_child(lab, 3, "rogue_child", (ROGUE, env))
        .wait_with_output()
        .expect("rogue");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && text.contains("ROGUE DONE"),
        "rogue: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn field(text: &str, key: &str) -> f64 {
    text.split_whitespace()
        .skip_while(|w| *w != key)
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {text}"))
}

/// Packets the kernel dropped for a full input backlog (all CPUs, all namespaces).
fn backlog_drops() -> u64 {
    std::fs::read_to_string("/proc/net/softnet_stat")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter_map(|v| u64::from_str_radix(v, 16).ok())
        .sum()
}

/// UDP datagrams the kernel of node `k` dropped for a full receive buffer.
fn udp_rcvbuf_errors(lab: &Lab, k: usize) -> u64 {
    let out = lab.exec(k, &["cat", "/proc/net/snmp"], Duration::from_secs(5));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut udp = text.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(names), Some(values)) = (udp.next(), udp.next()) else {
        return 0;
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "RcvbufErrors")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

fn lab_with_connection(prefix: &str) -> Option<Lab> {
    let lab = Lab::up(prefix, 3, &[])?;
    assert!(lab.sh(&["stop", "3"]).status.success());
    lab.ping_ok(1, "198.19.0.2", &[]);
    lab.ping_ok(2, "198.19.0.1", &[]);
    Some(lab)
}

#[test]
fn blind_injector_is_absorbed_and_counted() {
    let Some(lab) = lab_with_connection("e2ebs") else {
        return;
    };
    // (b) Nothing a blind sender sees predicts node 1's receive QPN: two daemons' QPNs share
    // nothing, and a restarted daemon's differ from its predecessor's (sequential numbering
    // gave every daemon 0x11, 0x12, ...).
    let (q1, q2_old) = (qpns(&lab.status(1)), qpns(&lab.status(2)));
    assert!(lab.sh(&["kill", "2"]).status.success());
    std::thread::sleep(Duration::from_millis(300));
    assert!(lab.sh(&["start", "2"]).status.success());
    lab.ping_ok(1, "198.19.0.2", &[]);
    lab.ping_ok(2, "198.19.0.1", &[]);
    let q2 = qpns(&lab.status(2));
    println!(
        "qpns: node 1 {q1:x?}, node 2 {q2_old:x?}, node 2 restarted {q2:x?}; closest pair \
         across daemons {}, across the restart {}",
        min_distance(&q1, &q2_old),
        min_distance(&q2_old, &q2),
    );
    assert!(q1.len() >= 3 && q2_old.len() >= 3 && q2.len() >= 3);
    assert!(min_distance(&q1, &q2_old) > 0, "daemons share a QPN");
    assert!(min_distance(&q2_old, &q2) > 0, "a restart reused a QPN");

    let before = lab.status(1);
    let rx_qpn = before["rx"]
        .as_array()
        .and_then(|r| r.iter().find(|c| c["state"] == "live"))
        .and_then(|c| c["qpn"].as_u64())
        .expect("live rx");
    let tx_qpn = before["tx"][0]["qpn"].as_u64().expect("tx qpn");
    let before2 = lab.status(2);
    let drops_before = udp_rcvbuf_errors(&lab, 1);
    let hitfile = lab.state.join("hit");
    let listener = start_listener(&lab, &hitfile);

    // (a) A sweep of 2 s at most through the receive QP that node 2's pings use.
    let pings = start_ping(&lab, 2, "198.19.0.1", 150);
    std::thread::sleep(Duration::from_millis(300));
    let text = run_rogue(
        &lab,
        format!("sweep {rx_qpn} {tx_qpn} 400000 2 0 {}", hitfile.display()),
    );
    let sent = field(&text, "sent") as u64;
    let secs = field(&text, "secs");
    // (c) SEND_MIDDLE with a wrong PSN, opcodes a receive QP does not take, forged NAKs.
    let bad = run_rogue(&lab, format!("bad {rx_qpn} {tx_qpn} 0 0 0 -"));
    let bad_opcodes = field(&bad, "bad_opcodes") as u64;
    let (replies, max_rtt, _) = ping_result(pings);
    std::thread::sleep(Duration::from_millis(300));
    let injected = std::fs::read_to_string(&hitfile).ok();
    let after = lab.status(1);
    let after2 = lab.status(2);
    let d = |name: &str| counter(&after, name) - counter(&before, name);
    let kernel_drops = udp_rcvbuf_errors(&lab, 1) - drops_before;
    let counted = d("rx_duplicate") + d("rx_out_of_sequence");
    println!(
        "sweep: {sent} forged SEND_ONLY in {secs:.2} s = {:.0} pps sent; node 1 rx_datagrams \
         +{} rx_duplicate +{} rx_out_of_sequence +{} rx_bad_state +{} rx_bad_ack +{} (kernel \
         RcvbufErrors +{kernel_drops}); ACKs drawn to node 2 +{} seq NAKs +{}; node 2 \
         rx_bad_ack +{}; injected: {injected:?}; ping 2->1 across it {replies}/150 max RTT \
         {max_rtt:.2} ms",
        sent as f64 / secs,
        d("rx_datagrams"),
        d("rx_duplicate"),
        d("rx_out_of_sequence"),
        d("rx_bad_state"),
        d("rx_bad_ack"),
        d("tx_acks"),
        d("tx_seq_naks"),
        counter(&after2, "rx_bad_ack") - counter(&before2, "rx_bad_ack"),
    );
    let absorbed_pps = counted as f64 / secs;
    println!(
        "extrapolated at {absorbed_pps:.0} pps absorbed: a blind PSN (2^23 on average) {:.0} s, \
         the whole PSN space {:.0} s; QPN unknown too (2^47 on average) {:.1} years",
        (PSNS / 2) as f64 / absorbed_pps,
        PSNS as f64 / absorbed_pps,
        (PSNS * PSNS / 2) as f64 / absorbed_pps / 3.156e7,
    );
    // Every forged packet that reached the receive QP is counted as a duplicate or out of
    // sequence (or, with the odds of the sweep, was the one injection); so are the 64
    // SEND_MIDDLEs of the `bad` run and node 2's own retransmissions (go-back-N of the pings
    // when the loaded machine delays an ACK).
    let retransmits = counter(&after2, "tx_retransmits") - counter(&before2, "tx_retransmits");
    assert!(counted > 0, "{}", after["provider"]);
    assert!(
        counted <= sent + 64 + retransmits,
        "counted {counted} of {sent}, node 2 retransmitted {retransmits}"
    );
    assert!(d("rx_bad_state") >= bad_opcodes, "{}", after["provider"]);
    // The connection is the same one, live, and carries traffic both ways.
    let live = after["rx"]
        .as_array()
        .and_then(|r| r.iter().find(|c| c["state"] == "live"))
        .and_then(|c| c["qpn"].as_u64());
    assert_eq!(live, Some(rx_qpn), "{}", after["rx"]);
    assert_eq!(after["tx"][0]["qpn"].as_u64(), Some(tx_qpn));
    assert_eq!(
        after["counters"]["rx_established"],
        before["counters"]["rx_established"]
    );
    assert!(replies >= 140, "ping across the sweep: {replies}/150");
    lab.ping_ok(1, "198.19.0.2", &[]);
    lab.ping_ok(2, "198.19.0.1", &[]);
    let mut listener = listener;
    let _ = listener.kill();
    let _ = listener.wait();
}

/// The contrast: an on-path attacker (the bridge made a hub, so the rogue sees node 2's
/// frames) reads the PSN off one packet and injects with the next one; a SEND_MIDDLE with
/// the right PSN then puts the receive QP in error.
#[test]
fn on_path_injector_needs_one_packet() {
    let Some(lab) = lab_with_connection("e2ebo") else {
        return;
    };
    let hub = Command::new("ip")
        .args([
            "-n",
            "e2ebobr",
            "link",
            "set",
            "br0",
            "type",
            "bridge",
            "ageing_time",
            "0",
        ])
        .status();
    assert!(hub.is_ok_and(|s| s.success()), "bridge as a hub");
    let before = lab.status(1);
    let rx_qpn = before["rx"][0]["qpn"].as_u64().expect("rx qpn");
    let tx_qpn = before["tx"][0]["qpn"].as_u64().expect("tx qpn");
    let hitfile = lab.state.join("hit");
    let mut listener = start_listener(&lab, &hitfile);
    let pings = start_ping(&lab, 2, "198.19.0.1", 1000);
    let text = run_rogue(&lab, format!("onpath {rx_qpn} {tx_qpn} 0 10 0 -"));
    std::thread::sleep(Duration::from_millis(300));
    let hit = std::fs::read_to_string(&hitfile).ok();
    let after = lab.status(1);
    // Whether (and when) node 2 reconnects after the kill.
    let t = Instant::now();
    let mut reconnected = None;
    while t.elapsed() < Duration::from_secs(15) {
        let s = lab.status(1);
        let live = s["rx"]
            .as_array()
            .and_then(|r| r.iter().find(|c| c["state"] == "live"))
            .and_then(|c| c["qpn"].as_u64());
        if live.is_some_and(|q| q != rx_qpn) {
            reconnected = Some(t.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = Command::new("kill")
        .args(["-INT", &pings.id().to_string()])
        .status();
    let (replies, max_rtt, _) = ping_result(pings);
    println!(
        "on-path: {}; injected datagram reached node 1's socket: {hit:?}; after the \
         SEND_MIDDLE node 1 rx {}; a new RX connection {reconnected:?} after the rogue ended \
         + 300 ms; ping 2->1 {replies} replies, max RTT {max_rtt:.1} ms",
        text.lines()
            .find_map(|l| l.split_once("psn seen").map(|(_, r)| r))
            .unwrap_or(""),
        after["rx"],
    );
    assert_eq!(
        hit.as_deref(),
        Some("0"),
        "one forged packet with the next PSN: {text}"
    );
    // The SEND_MIDDLE put the receive QP in error; node 2 connected again.
    assert!(reconnected.is_some(), "{}", lab.log(1));
    lab.ping_ok(2, "198.19.0.1", &[]);
    let _ = listener.kill();
    let _ = listener.wait();
}

/// A measurement: sweeps PSNs (paced at `IPOIB_CM_SWEEP_PPS`, default 150,000) until a
/// forged datagram reaches node 1's UDP socket or `IPOIB_CM_SWEEP_SECS` (default 200) pass.
#[test]
#[ignore = "measurement: minutes of flooding; run with --ignored --nocapture"]
fn blind_psn_sweep_until_injection() {
    if std::env::var(ROGUE).is_ok() || std::env::var(LISTENER).is_ok() {
        return;
    }
    let Some(lab) = lab_with_connection("e2ebm") else {
        return;
    };
    let pps: u64 = std::env::var("IPOIB_CM_SWEEP_PPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150_000);
    let secs: u64 = std::env::var("IPOIB_CM_SWEEP_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let before = lab.status(1);
    let rx_qpn = before["rx"][0]["qpn"].as_u64().expect("rx qpn");
    let tx_qpn = before["tx"][0]["qpn"].as_u64().expect("tx qpn");
    let hitfile = lab.state.join("hit");
    let mut listener = start_listener(&lab, &hitfile);
    let drops_before = udp_rcvbuf_errors(&lab, 1);
    let backlog_before = backlog_drops();
    let pings = start_ping(
        &lab,
        2,
        "198.19.0.1",
        u32::try_from(secs * 50).unwrap_or(10_000),
    );
    let text = run_rogue(
        &lab,
        format!(
            "sweep {rx_qpn} {tx_qpn} {PSNS} {secs} {pps} {}",
            hitfile.display()
        ),
    );
    // The ping is cut short by killing it once the sweep is over.
    std::thread::sleep(Duration::from_millis(200));
    let ping_pid = pings.id();
    let _ = Command::new("kill")
        .args(["-INT", &ping_pid.to_string()])
        .status();
    let (replies, max_rtt, echoes) = ping_result(pings);
    let after = lab.status(1);
    let d = |name: &str| counter(&after, name) - counter(&before, name);
    let sent = field(&text, "sent");
    let took = field(&text, "secs");
    let hit = std::fs::read_to_string(&hitfile).ok();
    println!(
        "measurement: {sent} sent in {took:.1} s ({:.0} pps, {} sends failed); node 1 \
         rx_datagrams +{} rx_duplicate +{} rx_out_of_sequence +{} kernel RcvbufErrors +{} \
         backlog drops +{}; injection at packet {hit:?}; ping \
         2->1 {replies}/{echoes} replies, max RTT {max_rtt:.2} ms",
        sent / took,
        field(&text, "failed"),
        d("rx_datagrams"),
        d("rx_duplicate"),
        d("rx_out_of_sequence"),
        udp_rcvbuf_errors(&lab, 1) - drops_before,
        backlog_drops() - backlog_before,
    );
    let _ = listener.kill();
    let _ = listener.wait();
}

/// Not a test on its own: in node 1's namespace, reports the first forged datagram that
/// reaches a UDP socket behind the TUN (its sweep index, written to the file named by
/// `IPOIB_CM_BLIND_LISTENER`).
#[test]
#[ignore = "helper, run inside a namespace by the tests above"]
fn listener_child() {
    let Ok(file) = std::env::var(LISTENER) else {
        return;
    };
    let sock = UdpSocket::bind(("198.19.0.1", TARGET_PORT)).expect("bind");
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    println!("LISTENING");
    let start = Instant::now();
    let mut buf = [0u8; 64];
    while start.elapsed() < Duration::from_secs(900) {
        if let Ok((n, _)) = sock.recv_from(&mut buf) {
            if n >= 8 {
                let idx = u64::from_be_bytes(buf[..8].try_into().unwrap_or_default());
                let _ = std::fs::write(&file, idx.to_string());
                println!("HIT {idx}");
                return;
            }
        }
    }
}

/// An IPv4/UDP datagram from 198.19.0.2 to node 1's listener carrying `index`, behind an
/// IPoIB header: what a forged SEND hands to node 1's TUN.
fn ipoib_payload(index: u64) -> Vec<u8> {
    let mut ip = vec![0x45, 0, 0, 36, 0, 0, 0x40, 0, 64, 17, 0, 0];
    ip.extend_from_slice(&[198, 19, 0, 2, 198, 19, 0, 1]);
    let sum = ip
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum::<u32>();
    let sum = (sum & 0xFFFF) + (sum >> 16);
    let sum = !((sum & 0xFFFF) + (sum >> 16)) as u16;
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    ip.extend_from_slice(&40_000u16.to_be_bytes());
    ip.extend_from_slice(&TARGET_PORT.to_be_bytes());
    ip.extend_from_slice(&[0, 16, 0, 0]);
    ip.extend_from_slice(&index.to_be_bytes());
    let mut out = IpoibHeader::new(0x0800).to_bytes().to_vec();
    out.extend_from_slice(&ip);
    out
}

/// A RoCEv2 datagram to node 1 claiming to come from node 2's 198.18.0.2:4791, inside an
/// IPv4 header for a raw socket.
fn forged(repr: &RoceRepr, payload: &[u8], out: &mut Vec<u8>) {
    let (src, dst) = (Ipv4Addr::new(198, 18, 0, 2), Ipv4Addr::new(198, 18, 0, 1));
    let ip = IpHeaderInfo::V4 {
        src,
        dst,
        identification: 0,
        dont_fragment: true,
    };
    let mut roce = Vec::new();
    repr.emit(payload, &ip, 4791, 4791, &mut roce);
    let udp_len = 8 + roce.len();
    let total = 20 + udp_len;
    out.clear();
    out.extend_from_slice(&[0x45, 0]);
    out.extend_from_slice(&u16::try_from(total).unwrap().to_be_bytes());
    out.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
    out.extend_from_slice(&src.octets());
    out.extend_from_slice(&dst.octets());
    out.extend_from_slice(&4791u16.to_be_bytes());
    out.extend_from_slice(&4791u16.to_be_bytes());
    out.extend_from_slice(&u16::try_from(udp_len).unwrap().to_be_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&roce);
}

fn rc(opcode: Opcode, qpn: u32, psn: u32) -> RoceRepr {
    let mut bth = Bth::new(opcode, qpn, psn & 0x00FF_FFFF);
    bth.pkey = 0xFFFF;
    bth.ack_req = true;
    RoceRepr::new(bth)
}

/// A PSN no one can predict (the test's own clock and pid).
fn random_start() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let x = (t ^ u64::from(std::process::id()).rotate_left(40)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 40) as u32 & 0x00FF_FFFF
}

/// Not a test on its own: the rogue, run in the third namespace by the tests above.
#[test]
#[ignore = "helper, run inside a namespace by the tests above"]
fn rogue_child() {
    let Ok(role) = std::env::var(ROGUE) else {
        return;
    };
    let w: Vec<&str> = role.split_whitespace().collect();
    let num = |i: usize| w.get(i).and_then(|s| s.parse::<u64>().ok()).expect("arg");
    let (mode, rx_qpn, tx_qpn) = (w[0], num(1) as u32, num(2) as u32);
    let sock = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::RAW,
        Some(socket2::Protocol::from(libc::IPPROTO_RAW)),
    )
    .expect("raw socket");
    let to = socket2::SockAddr::from(SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)), 0));
    let mut pkt = Vec::with_capacity(256);
    if mode == "bad" {
        let mut bad_opcodes = 0u64;
        let start = random_start();
        // A wrong PSN is any but the one expected: 2^-24 odds per packet of hitting it.
        for i in 0..64u32 {
            let psn = start.wrapping_add(i.wrapping_mul(0x0004_0001));
            let mid = rc(Opcode::RC_SEND_MIDDLE, rx_qpn, psn);
            forged(&mid, &[0u8; 256], &mut pkt);
            let _ = sock.send_to(&pkt, &to);
            let mut write = rc(Opcode::RC_RDMA_WRITE_ONLY, rx_qpn, psn);
            write.reth = Some(Reth {
                va: 0x1000,
                rkey: 0x1234,
                dma_len: 64,
            });
            forged(&write, &[0u8; 64], &mut pkt);
            let _ = sock.send_to(&pkt, &to);
            let mut ud = rc(Opcode::UD_SEND_ONLY, rx_qpn, psn);
            ud.deth = Some(Deth {
                qkey: 0x0B1B,
                src_qp: 0x99,
            });
            forged(&ud, &ipoib_payload(0), &mut pkt);
            let _ = sock.send_to(&pkt, &to);
            bad_opcodes += 2;
            // Fatal NAKs, to the receive QP and to node 1's send QP.
            for qpn in [rx_qpn, tx_qpn] {
                let mut nak = rc(Opcode::RC_ACKNOWLEDGE, qpn, psn);
                nak.bth.ack_req = false;
                nak.aeth = Some(Aeth {
                    syndrome: Syndrome::Nak(NakCode::InvalidRequest),
                    msn: 0,
                });
                forged(&nak, &[], &mut pkt);
                let _ = sock.send_to(&pkt, &to);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        println!("bad_opcodes {bad_opcodes}");
        println!("ROGUE DONE");
        return;
    }
    if mode == "onpath" {
        let sniff = socket2::Socket::new(
            socket2::Domain::PACKET,
            socket2::Type::RAW,
            Some(socket2::Protocol::from(i32::from(0x0003u16.to_be()))),
        )
        .expect("packet socket");
        sniff
            .set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        let deadline = Instant::now() + Duration::from_secs(num(4));
        // The PSN of the next SEND from node 2 to node 1's receive QP that goes by.
        let next_psn = || -> u32 {
            let mut buf = vec![0u8; 10_000];
            while Instant::now() < deadline {
                let Ok(n) = (&sniff).read(&mut buf) else {
                    continue;
                };
                if let Some(psn) = send_psn(&buf[..n], rx_qpn) {
                    return psn;
                }
            }
            panic!("no SEND to QPN {rx_qpn} seen");
        };
        let psn = next_psn();
        forged(
            &rc(Opcode::RC_SEND_ONLY, rx_qpn, psn + 1),
            &ipoib_payload(0),
            &mut pkt,
        );
        sock.send_to(&pkt, &to).expect("send");
        // Let the injected message be delivered, and skip the frames seen meanwhile (the
        // rogue's own among them).
        let quiet = Instant::now() + Duration::from_millis(100);
        let mut skip = [0u8; 10_000];
        while Instant::now() < quiet {
            let _ = (&sniff).read(&mut skip);
        }
        let psn2 = next_psn();
        forged(
            &rc(Opcode::RC_SEND_MIDDLE, rx_qpn, psn2 + 1),
            &[0u8; 256],
            &mut pkt,
        );
        sock.send_to(&pkt, &to).expect("send");
        println!(
            "psn seen {psn}, injected at {}; then seen {psn2}, SEND_MIDDLE at {}",
            psn + 1,
            psn2 + 1
        );
        println!("ROGUE DONE");
        return;
    }
    // A sweep down from a random PSN: after a hit the expected PSN is one above it, which the
    // rest of the sweep reaches last.
    let (limit, secs, pps) = (num(3), num(4), num(5));
    let hitfile = w.get(6).map(Path::new).expect("hit file");
    let start_psn = random_start();
    let begin = Instant::now();
    let deadline = begin + Duration::from_secs(secs);
    let mut sent = 0u64;
    let mut failed = 0u64;
    let mut reprs = rc(Opcode::RC_SEND_ONLY, rx_qpn, 0);
    while sent < limit {
        if sent % 1024 == 0 {
            if Instant::now() >= deadline || hitfile.exists() {
                break;
            }
            if pps > 0 {
                let due = begin + Duration::from_secs_f64(sent as f64 / pps as f64);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
        }
        reprs.bth.psn = start_psn.wrapping_sub(sent as u32) & 0x00FF_FFFF;
        forged(&reprs, &ipoib_payload(sent), &mut pkt);
        if sock.send_to(&pkt, &to).is_err() {
            failed += 1;
        }
        sent += 1;
    }
    let took = begin.elapsed().as_secs_f64();
    println!("start_psn {start_psn} sent {sent} secs {took:.3} failed {failed}");
    println!("ROGUE DONE");
}

/// The PSN of `frame` if it is an RC SEND from 198.18.0.2 to node 1's QP `qpn`.
fn send_psn(frame: &[u8], qpn: u32) -> Option<u32> {
    let ip = frame.get(14..)?;
    if frame.get(12..14)? != [0x08, 0x00] || ip.get(9) != Some(&17) {
        return None;
    }
    if ip.get(12..20)? != [198, 18, 0, 2, 198, 18, 0, 1] {
        return None;
    }
    let udp = ip.get(usize::from(ip[0] & 0x0F) * 4..)?;
    if udp.get(2..4)? != 4791u16.to_be_bytes() {
        return None;
    }
    let pkt = RocePacket::parse(udp.get(8..)?).ok()?;
    (pkt.bth.dest_qp == qpn && pkt.bth.opcode.is_send()).then_some(pkt.bth.psn)
}
