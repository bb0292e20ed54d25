//! Hostile input against a running daemon: a rogue node on the same underlay sends datagrams
//! that look like RoCEv2 but come from an address that is not the QP's peer, carry a wrong
//! P_Key, a bad ICRC, an unknown QPN, a wrong Q_Key, are truncated or oversized; it forges
//! ARP replies claiming another node's address, and CM DREQs/REJs for connections it does not
//! own. None of it may reach the TUN device or tear down a connection, and each kind is
//! counted in `ipoib-cm status`.
//!
//! The lab (three namespaces by `scripts/lab.sh`, the third node's daemon stopped so its
//! namespace is the rogue) is created and removed by the test; without root it is skipped.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use ipoib_cm::verbs::{Gid, QpNum};
use ipoib_cm::wire::bth::{Bth, Opcode};
use ipoib_cm::wire::cm::{CmMad, CmMessage, Dreq, Rej, RejReason};
use ipoib_cm::wire::ext::Deth;
use ipoib_cm::wire::icrc::IpHeaderInfo;
use ipoib_cm::wire::ipoib::{ArpOp, HwAddr, IpoibArp, IpoibHeader, ETHERTYPE_ARP};
use ipoib_cm::wire::roce::RoceRepr;

const BIN: &str = env!("CARGO_BIN_EXE_ipoib-cm");
const ROLE: &str = "IPOIB_CM_ROGUE";
const PREFIX: &str = "e2eh";

fn lab(state: &PathBuf, args: &[&str]) -> Output {
    let mut c = Command::new("bash");
    c.arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/lab.sh"))
        .args(args)
        .env("LAB_PREFIX", PREFIX)
        .env("LAB_STATE", state)
        .env("IPOIB_CM_BIN", BIN)
        .stdin(Stdio::null());
    c.output().expect("lab.sh")
}

fn status(state: &PathBuf, k: usize) -> serde_json::Value {
    let out = lab(state, &["status", &k.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

fn ping(k: usize, to: &str) -> bool {
    Command::new("ip")
        .args(["netns", "exec", &format!("{PREFIX}{k}")])
        .args(["ping", "-n", "-c", "2", "-i", "0.2", "-W", "3", to])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

struct Down(PathBuf);
impl Drop for Down {
    fn drop(&mut self) {
        let _ = lab(&self.0, &["down"]);
    }
}

#[test]
fn hostile_datagrams_are_dropped_and_counted() {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout == b"0\n");
    if !matches!(root, Ok(true)) || !std::path::Path::new("/dev/net/tun").exists() {
        println!("skipped: needs root and /dev/net/tun");
        return;
    }
    let state = std::env::temp_dir().join(format!("ipoib-cm-hostile-{}", std::process::id()));
    let _ = lab(&state, &["down"]);
    let up = lab(&state, &["up", "3"]);
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let _down = Down(state.clone());
    assert!(lab(&state, &["stop", "3"]).status.success());

    // Connections both ways between nodes 1 and 2.
    assert!(ping(1, "198.19.0.2") && ping(2, "198.19.0.1"));
    let before = status(&state, 1);
    let rx_qpn = before["rx"][0]["qpn"].as_u64().expect("rx qpn");
    let tx_qpn = before["tx"][0]["qpn"].as_u64().expect("tx qpn");
    let hw1: HwAddr = before["interface"]["hwaddr"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("hwaddr");
    let node2_hw = before["neighbours"]
        .as_array()
        .and_then(|n| n.iter().find(|e| e["ip"] == "198.19.0.2"))
        .map(|e| e["hwaddr"].clone())
        .expect("neighbour 198.19.0.2");
    let rx_packets_before = before["provider"]["rx_packets"].as_u64().unwrap_or(0);
    let rx_dropped_before = before["rx_dropped"].as_u64().expect("top-level rx_dropped");

    // The rogue: this test binary again, inside node 3's namespace.
    let exe = std::env::current_exe().expect("test binary");
    let out = Command::new("ip")
        .args(["netns", "exec", &format!("{PREFIX}3")])
        .arg(exe)
        .args(["--exact", "rogue_child", "--ignored", "--nocapture"])
        .env(ROLE, format!("{rx_qpn} {} ", hw1.qpn.get()))
        .output()
        .expect("rogue");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("ROGUE DONE"),
        "rogue: {text}"
    );
    let sent: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("sent "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("sent N hostile datagrams");
    std::thread::sleep(Duration::from_millis(500));

    let after = status(&state, 1);
    // Every hostile datagram is dropped, and counted once in the total.
    let rx_dropped = after["rx_dropped"].as_u64().expect("top-level rx_dropped");
    println!(
        "hostile: {sent} sent, rx_dropped +{} ({})",
        rx_dropped - rx_dropped_before,
        after["drops"]["rx"]
    );
    assert_eq!(rx_dropped - rx_dropped_before, sent, "{}", after["drops"]);
    // The flood is in the log, rate-limited: 128 CM MADs in well under the warning interval
    // make one line for their kind, with the count (two if an earlier one opened the window).
    let log = std::fs::read_to_string(state.join("node1.log")).unwrap_or_default();
    let warned: Vec<_> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("bad input dropped kind=cm_dropped_unknown"))
        .collect();
    assert!((1..=2).contains(&warned.len()), "{log}");
    println!("hostile: {}", warned.join("\n"));
    let p = &after["provider"];
    let n = |k: &str| p[k].as_u64().unwrap_or(0);
    println!(
        "hostile: rx_bad_src {} rx_bad_icrc {} rx_bad_pkey {} rx_unknown_qpn {} rx_bad_qkey {} \
         rx_malformed {} neigh_conflicts {} cm_dropped_unknown {} cm_dropped_spoofed {} \
         cm_dropped_unexpected {}",
        n("rx_bad_src"),
        n("rx_bad_icrc"),
        n("rx_bad_pkey"),
        n("rx_unknown_qpn"),
        n("rx_bad_qkey"),
        n("rx_malformed"),
        n("neigh_conflicts"),
        n("cm_dropped_unknown"),
        n("cm_dropped_spoofed"),
        n("cm_dropped_unexpected"),
    );
    assert!(n("rx_bad_src") >= 2, "{p}");
    assert!(n("rx_bad_icrc") >= 1, "{p}");
    assert!(n("rx_bad_pkey") >= 1, "{p}");
    assert!(n("rx_unknown_qpn") >= 1, "{p}");
    assert!(n("rx_bad_qkey") >= 1, "{p}");
    assert!(n("rx_malformed") + n("rx_bad_icrc") >= 2, "{p}");
    assert!(n("neigh_conflicts") >= 1, "{p}");
    // Nothing reached the TUN device, and the connections are the same ones.
    assert_eq!(
        p["rx_packets"].as_u64().unwrap_or(0),
        rx_packets_before,
        "{p}"
    );
    assert_eq!(after["rx"][0]["qpn"].as_u64(), Some(rx_qpn));
    assert_eq!(after["tx"][0]["qpn"].as_u64(), Some(tx_qpn));
    assert_eq!(after["rx"][0]["state"], "live");
    let still = after["neighbours"]
        .as_array()
        .and_then(|n| n.iter().find(|e| e["ip"] == "198.19.0.2"))
        .map(|e| e["hwaddr"].clone());
    assert_eq!(still, Some(node2_hw), "forged ARP changed the mapping");
    assert!(
        ping(1, "198.19.0.2") && ping(2, "198.19.0.1"),
        "traffic after the attack"
    );
    assert_eq!(status(&state, 1)["counters"]["rx_dreq_reaped"], 0);
}

/// Builds a RoCEv2 datagram from the rogue (198.18.0.3) to node 1.
fn roce(repr: &RoceRepr, payload: &[u8]) -> Vec<u8> {
    let ip = IpHeaderInfo::V4 {
        src: Ipv4Addr::new(198, 18, 0, 3),
        dst: Ipv4Addr::new(198, 18, 0, 1),
        identification: 0,
        dont_fragment: true,
    };
    let mut out = Vec::new();
    repr.emit(payload, &ip, 4791, 4791, &mut out);
    out
}

fn rc_send(qpn: u32, pkey: u16) -> RoceRepr {
    let mut bth = Bth::new(Opcode::RC_SEND_ONLY, qpn, 0);
    bth.pkey = pkey;
    bth.ack_req = true;
    RoceRepr::new(bth)
}

fn ud_send(qpn: u32, qkey: u32) -> RoceRepr {
    let mut r = RoceRepr::new(Bth::new(Opcode::UD_SEND_ONLY, qpn, 0));
    r.deth = Some(Deth { qkey, src_qp: 0x99 });
    r
}

/// Not a test on its own: run in the rogue namespace by the test above.
#[test]
#[ignore = "helper, run inside a namespace by hostile_datagrams_are_dropped_and_counted"]
fn rogue_child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let mut it = role.split_whitespace();
    let rx_qpn: u32 = it.next().and_then(|s| s.parse().ok()).expect("rx qpn");
    let ud_qpn: u32 = it.next().and_then(|s| s.parse().ok()).expect("ud qpn");
    // DF and unconnected, so the IPv4 ID is 0 and the ICRCs we compute are right.
    let sock = ipoib_cm::soft::transport::UdpTransport::bind("198.18.0.3:4791".parse().unwrap())
        .expect("bind");
    let to = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)), 4791);
    let ip_payload =
        b"\x45\x00\x00\x1c\x00\x00\x40\x00\x40\x01\x00\x00\xc6\x13\x00\x42\xc6\x13\x00\x01rogue!!!";
    let mut ipoib = IpoibHeader::new(0x0800).to_bytes().to_vec();
    ipoib.extend_from_slice(ip_payload);
    let mut datagrams: Vec<Vec<u8>> = Vec::new();
    // Valid-looking RC SEND to node 1's receive QP, but not from its peer.
    datagrams.push(roce(&rc_send(rx_qpn, 0xFFFF), &ipoib));
    // The same, oversized (more than any path MTU).
    datagrams.push(roce(&rc_send(rx_qpn, 0xFFFF), &vec![0u8; 8000]));
    // Bad ICRC.
    let mut bad = roce(&rc_send(rx_qpn, 0xFFFF), &ipoib);
    if let Some(b) = bad.last_mut() {
        *b ^= 0xFF;
    }
    datagrams.push(bad);
    // Wrong P_Key (valid ICRC).
    datagrams.push(roce(&rc_send(rx_qpn, 0x7F00), &ipoib));
    // Unknown QPN.
    datagrams.push(roce(&rc_send(0x00AB_CDEF, 0xFFFF), &ipoib));
    // UD with a wrong Q_Key.
    datagrams.push(roce(&ud_send(ud_qpn, 0x1234), &ipoib));
    // Truncated headers.
    datagrams.push(vec![0x04, 0, 0xFF]);
    datagrams.push(roce(&rc_send(rx_qpn, 0xFFFF), &ipoib)[..14].to_vec());
    // A forged ARP reply: "198.19.0.2 is at the rogue".
    let rogue_hw = HwAddr::new(
        0x80,
        QpNum::new(0x99),
        Gid::from(Ipv4Addr::new(198, 18, 0, 3)),
    );
    let arp = IpoibArp {
        op: ArpOp::Reply,
        sender_hw: rogue_hw,
        sender_ip: Ipv4Addr::new(198, 19, 0, 2),
        target_hw: HwAddr::new(
            0x80,
            QpNum::new(ud_qpn),
            Gid::from(Ipv4Addr::new(198, 18, 0, 1)),
        ),
        target_ip: Ipv4Addr::new(198, 19, 0, 1),
    };
    let mut arp_payload = IpoibHeader::new(ETHERTYPE_ARP).to_bytes().to_vec();
    arp_payload.extend_from_slice(&arp.to_bytes());
    datagrams.push(roce(&ud_send(ud_qpn, 0x0B1B), &arp_payload));
    // Forged CM messages for connections the rogue does not own (guessed comm ids).
    for guess in 0..64u32 {
        let dreq = CmMad::new(
            u64::from(guess),
            CmMessage::Dreq(Dreq {
                local_comm_id: 0x1000 + guess,
                remote_comm_id: guess.wrapping_mul(0x9E37_79B9),
                remote_qpn: QpNum::new(rx_qpn),
                ..Dreq::default()
            }),
        );
        let rej = CmMad::new(
            u64::from(guess),
            CmMessage::Rej(Rej {
                local_comm_id: 0x2000 + guess,
                remote_comm_id: guess.wrapping_mul(0x85EB_CA6B),
                reason: RejReason::StaleConn,
                ..Rej::default()
            }),
        );
        for mad in [dreq, rej] {
            datagrams.push(roce(&ud_send(1, 0x8001_0000), &mad.emit()));
        }
    }
    let start = Instant::now();
    for d in &datagrams {
        let _ = sock.send_to(d, to);
        std::thread::sleep(Duration::from_millis(2));
    }
    println!(
        "sent {} hostile datagrams in {:?}",
        datagrams.len(),
        start.elapsed()
    );
    println!("ROGUE DONE");
}
