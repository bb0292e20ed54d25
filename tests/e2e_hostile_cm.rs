//! Forged CM REQs against a running daemon (issue 16, point 2): a rogue on the underlay sends
//! REQs for node 1's IPoIB-CM service from addresses that are no daemon, as QP1 GMPs in
//! RoCEv2 (how the software provider carries CM MADs), and never completes them.
//!
//! - `forged_req_flood_costs_no_qp_budget`: node 1 runs with `--reject`; while a flood of
//!   REQs from 64 sources goes on, node 2 connects (and, restarted, connects again) and pings.
//!   No lockout, and node 1's QPs stay within its half-open bound.
//! - `forged_reqs_draw_few_mads_back`: REQs asking for 15 retries and a 1 ms response timeout,
//!   from one address the rogue listens on (the reflection's victim); the MADs that come back
//!   per REQ stay within the CM's clamp, and the per-source rate limit caps the total.
//!
//! Each test builds its own three-namespace lab (`scripts/lab.sh`, node 3's daemon stopped so
//! its namespace is the rogue), and removes it; without root it is skipped.

mod common;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::lab::Lab;
use ipoib_cm::soft::transport::UdpTransport;
use ipoib_cm::verbs::{Gid, PathMtu, Psn, QpNum};
use ipoib_cm::wire::bth::{Bth, Opcode};
use ipoib_cm::wire::cm::{ipoib_service_id, CmMad, CmMessage, CmPath, IpoibCmData, Req};
use ipoib_cm::wire::ext::Deth;
use ipoib_cm::wire::icrc::IpHeaderInfo;
use ipoib_cm::wire::ipoib::HwAddr;
use ipoib_cm::wire::roce::{RocePacket, RoceRepr};

const ROLE: &str = "IPOIB_CM_FORGED_REQ";
/// Sources of the flood: 198.18.0.100 ..
const FLOOD_SOURCES: u8 = 64;
/// The reflection's victim, an address of the rogue's namespace.
const VICTIM: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 200);
/// The MADs one admitted REQ may draw back: the REP, 3 resends, a REJ (the CM's
/// `MAX_MADS_PER_REQ`).
const MADS_PER_REQ: usize = 5;
/// The CM's per-source REQ burst (`ReqRateLimit::default`).
const REQ_BURST: usize = 32;

fn node1() -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 0, 1)
}

/// Node 1's UD QPN (its service ID is built from it).
fn ud_qpn(lab: &Lab) -> u32 {
    let hw: HwAddr = lab.status(1)["interface"]["hwaddr"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("hwaddr");
    hw.qpn.get()
}

/// Adds `addrs` to the rogue's (node 3's) underlay interface.
fn add_rogue_addrs(lab: &Lab, addrs: impl IntoIterator<Item = Ipv4Addr>) {
    for a in addrs {
        let out = lab.exec(
            3,
            &["ip", "addr", "add", &format!("{a}/32"), "dev", "eth0"],
            Duration::from_secs(5),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Starts this test binary as the rogue in node 3's namespace.
fn rogue(lab: &Lab, role: &str) -> std::process::Child {
    let exe = std::env::current_exe().expect("test binary");
    Command::new("ip")
        .args(["netns", "exec", &format!("{}3", lab.prefix)])
        .arg(exe)
        .args(["--exact", "rogue_child", "--ignored", "--nocapture"])
        .env(ROLE, role)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("rogue")
}

/// The rogue's output, after it exits (killed, by its pid, if it outlives `limit`).
fn rogue_output(child: std::process::Child, limit: Duration) -> String {
    let out = common::child::output_within(child, limit);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Seconds until node 2's first ping reply from node 1 (at most 8), `None` if none came.
fn first_reply(lab: &Lab) -> Option<f64> {
    let start = Instant::now();
    let out = lab.exec(
        2,
        &["ping", "-n", "-c", "1", "-w", "8", "198.19.0.1"],
        Duration::from_secs(12),
    );
    out.status.success().then(|| start.elapsed().as_secs_f64())
}

fn provider(status: &serde_json::Value, name: &str) -> u64 {
    status["provider"][name].as_u64().unwrap_or(0)
}

#[test]
fn forged_req_flood_costs_no_qp_budget() {
    forged_req_flood_costs_no_qp_budget_with("e2ehc", "1");
}

/// The same with 2 workers on every node: the flood's REQs (their QPNs' low bits) reach both
/// of node 1's workers, whose half-open limit is one for the interface.
#[test]
fn forged_req_flood_costs_no_qp_budget_with_2_workers() {
    forged_req_flood_costs_no_qp_budget_with("e2ehw", "2");
}

fn forged_req_flood_costs_no_qp_budget_with(prefix: &str, workers: &str) {
    // The half-open cap the bound below is written for (the default is larger).
    let args = ["--reject", "--max-pending-rx", "16", "--workers", workers];
    let Some(lab) = Lab::up(prefix, 3, &args) else {
        return;
    };
    assert!(lab.sh(&["stop", "3"]).status.success());
    add_rogue_addrs(
        &lab,
        (0..FLOOD_SOURCES).map(|i| Ipv4Addr::new(198, 18, 0, 100 + i)),
    );
    let qpn = ud_qpn(&lab);
    // 64 sources, each a REQ every 300 ms (under the per-source rate limit: only the QP
    // bounds can help), for 6 s: about 1,300 REQs, the first 128 within 0.3 s.
    let flood = rogue(&lab, &format!("flood {qpn} 6000 300"));
    std::thread::sleep(Duration::from_millis(1000));
    let during = lab.status(1);
    let first = first_reply(&lab);
    let connected = lab.status(1);
    // Node 2 restarts: a new incarnation connects again, the flood still on.
    assert!(lab.sh(&["stop", "2"]).status.success());
    assert!(lab.sh(&["start", "2"]).status.success());
    assert!(lab.wait_for(Duration::from_secs(10), |l| l
        .sh(&["status", "2"])
        .status
        .success()));
    let again = first_reply(&lab);
    let text = rogue_output(flood, Duration::from_secs(20));
    let after = lab.status(1);
    let qp_live = [&during, &connected]
        .iter()
        .filter_map(|s| s["counters"]["qp_live"].as_u64())
        .max()
        .unwrap_or(0);
    println!(
        "flood (workers {workers}): {} | first reply {first:?} s, after restart {again:?} s | node 1 during: \
         qp_live {qp_live} rx {} | after: rx_rejected {} rx_half_open_evicted {} \
         cm_rej_sent {} cm_req_rate_limited {} qp_live {}",
        text.lines().find(|l| l.starts_with("sent")).unwrap_or("?"),
        during["rx"].as_array().map_or(0, Vec::len),
        provider(&after, "rx_rejected"),
        provider(&after, "rx_half_open_evicted"),
        provider(&after, "cm_rej_sent"),
        provider(&after, "cm_req_rate_limited"),
        after["counters"]["qp_live"],
    );
    assert!(text.contains("ROGUE DONE"), "rogue: {text}");
    assert!(
        first.is_some(),
        "node 2 locked out during the flood\n{}",
        lab.log(1)
    );
    assert!(
        again.is_some(),
        "restarted node 2 locked out\n{}",
        lab.log(1)
    );
    // UD, QP1, at most 2 RC per direction with node 2, 16 half-open, some being torn down.
    assert!(qp_live <= 48, "node 1 holds {qp_live} QPs during the flood");
    // The half-open limit is the interface's, not each worker's: at most 16 of the live RX
    // connections are the flood's, the rest node 2's (two per worker at most, a restart's).
    let per_worker: usize = workers.parse().expect("workers");
    let live = during["rx"]
        .as_array()
        .map_or(0, |r| r.iter().filter(|c| c["state"] == "live").count());
    // One more half-open per other worker: a worker that holds none takes its REQ.
    assert!(
        live <= 16 + (per_worker - 1) + 2 * per_worker,
        "{live} live RX connections during the flood: {}",
        during["rx"]
    );
    assert!(provider(&after, "rx_half_open_evicted") > 0);
}

#[test]
fn forged_req_flood_evicts_nothing_under_evict() {
    let Some(lab) = Lab::up("e2ehe", 3, &["--evict", "--max-conn-qp", "4"]) else {
        return;
    };
    assert!(lab.sh(&["stop", "3"]).status.success());
    add_rogue_addrs(
        &lab,
        (0..FLOOD_SOURCES).map(|i| Ipv4Addr::new(198, 18, 0, 100 + i)),
    );
    let qpn = ud_qpn(&lab);
    lab.ping_ok(2, "198.19.0.1", &[]);
    let flood = rogue(&lab, &format!("flood {qpn} 4000 200"));
    // Node 2 pings through the flood on the connections it already has.
    let out = lab.exec(
        2,
        &[
            "ping",
            "-n",
            "-c",
            "60",
            "-i",
            "0.05",
            "-W",
            "1",
            "198.19.0.1",
        ],
        Duration::from_secs(20),
    );
    let text = rogue_output(flood, Duration::from_secs(20));
    let ping = String::from_utf8_lossy(&out.stdout);
    let summary = ping
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or("?");
    let (one, two) = (lab.status(1), lab.status(2));
    println!(
        "evict flood: {} | ping {summary} | node 1: rx_evicted {} rx_half_open_evicted {} | \
         node 2: tx_established {} tx_failed {}",
        text.lines().find(|l| l.starts_with("sent")).unwrap_or("?"),
        one["counters"]["rx_evicted"],
        provider(&one, "rx_half_open_evicted"),
        two["counters"]["tx_established"],
        two["counters"]["tx_failed"],
    );
    assert!(text.contains("ROGUE DONE"), "rogue: {text}");
    assert!(
        out.status.success() && summary.contains(" 0% packet loss"),
        "{ping}"
    );
    assert_eq!(
        one["counters"]["rx_evicted"], 0,
        "forged REQs evicted a connection"
    );
    assert_eq!(
        two["counters"]["tx_established"], 1,
        "node 2 had to reconnect"
    );
}

#[test]
fn forged_reqs_draw_few_mads_back() {
    let Some(lab) = Lab::up("e2ehr", 3, &["--reject"]) else {
        return;
    };
    assert!(lab.sh(&["stop", "3"]).status.success());
    add_rogue_addrs(&lab, [VICTIM]);
    let qpn = ud_qpn(&lab);
    // 100 REQs from the victim's address within 0.2 s, each asking for 15 retries and a
    // response timeout of 4.096 us * 2^3; then 2 s of listening.
    let text = rogue_output(
        rogue(&lab, &format!("reflect {qpn} 100 2000")),
        Duration::from_secs(30),
    );
    let after = lab.status(1);
    println!(
        "reflection: {} | node 1: cm_req_rate_limited {} cm_req_retx_clamped {} \
         cm_retransmits {}",
        text.lines().find(|l| l.starts_with("back")).unwrap_or("?"),
        provider(&after, "cm_req_rate_limited"),
        provider(&after, "cm_req_retx_clamped"),
        provider(&after, "cm_retransmits"),
    );
    assert!(text.contains("ROGUE DONE"), "rogue: {text}");
    let field = |name: &str| -> usize {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    };
    let (total, max_per_req, answered) = (field("total="), field("max="), field("answered="));
    assert!(answered > 0, "no REQ was answered: {text}");
    assert!(
        max_per_req <= MADS_PER_REQ,
        "one REQ drew {max_per_req} MADs back"
    );
    // The per-source bucket admits a burst, then 16 a second.
    assert!(
        total <= MADS_PER_REQ * (REQ_BURST + 8),
        "100 REQs drew {total} MADs back"
    );
    assert_eq!(ipoib_cm::cm::MAX_MADS_PER_REQ, MADS_PER_REQ as u64);
}

/// A REQ for node 1's IPoIB-CM service from `src`, as the rogue forges it.
fn forged_req(
    ud_qpn: u32,
    src: Ipv4Addr,
    comm_id: u32,
    response_timeout: u8,
    retries: u8,
) -> Vec<u8> {
    let mut private_data = [0u8; Req::PRIVATE_DATA_LEN];
    let data = IpoibCmData {
        qpn: QpNum::new(0x0077_0000 | (comm_id & 0xFFFF)),
        mtu: 65524,
    }
    .to_bytes();
    private_data[..data.len()].copy_from_slice(&data);
    let req = Req {
        local_comm_id: comm_id,
        service_id: ipoib_service_id(QpNum::new(ud_qpn), true),
        local_ca_guid: 0x5EED_0000_0000_0000 | u64::from(comm_id),
        local_qpn: QpNum::new(0x0066_0000 | (comm_id & 0xFFFF)),
        remote_cm_response_timeout: response_timeout,
        transport_service_type: Req::TRANSPORT_RC,
        starting_psn: Psn::new(comm_id & 0x00FF_FFFF),
        local_cm_response_timeout: response_timeout,
        retry_count: 7,
        pkey: 0xFFFF,
        path_mtu: Some(PathMtu::Mtu1024),
        rnr_retry_count: 7,
        max_cm_retries: retries,
        primary_path: CmPath {
            local_lid: 0xFFFF,
            remote_lid: 0xFFFF,
            local_gid: Gid::from(src),
            remote_gid: Gid::from(node1()),
            hop_limit: 64,
            local_ack_timeout: 17,
            ..CmPath::default()
        },
        private_data,
        ..Req::default()
    };
    let mad = CmMad::new(u64::from(comm_id), CmMessage::Req(req)).emit();
    let mut repr = RoceRepr::new(Bth::new(Opcode::UD_SEND_ONLY, 1, 0));
    repr.deth = Some(Deth {
        qkey: 0x8001_0000,
        src_qp: 1,
    });
    let ip = IpHeaderInfo::V4 {
        src,
        dst: node1(),
        identification: 0,
        dont_fragment: true,
    };
    let mut out = Vec::new();
    repr.emit(&mad, &ip, 4791, 4791, &mut out);
    out
}

fn bind(a: Ipv4Addr) -> UdpTransport {
    UdpTransport::bind(SocketAddr::new(IpAddr::V4(a), 4791)).expect("bind")
}

/// Not a test on its own: run in the rogue's namespace by the tests above.
#[test]
#[ignore = "helper, run inside a namespace by the forged-REQ tests"]
fn rogue_child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let words: Vec<&str> = role.split_whitespace().collect();
    let num = |i: usize| -> u32 { words.get(i).and_then(|s| s.parse().ok()).expect("role") };
    let to = SocketAddr::new(IpAddr::V4(node1()), 4791);
    match words.first().copied() {
        // flood UD_QPN MILLIS PERIOD_MS: every source a REQ each period.
        Some("flood") => {
            let (qpn, millis, period) = (num(1), num(2), num(3));
            let socks: Vec<(Ipv4Addr, UdpTransport)> = (0..FLOOD_SOURCES)
                .map(|i| Ipv4Addr::new(198, 18, 0, 100 + i))
                .map(|a| (a, bind(a)))
                .collect();
            let start = Instant::now();
            let gap = Duration::from_millis(u64::from(period)) / u32::from(FLOOD_SOURCES);
            let mut sent = 0u32;
            'flood: for round in 0..100_000u32 {
                for (i, (a, s)) in socks.iter().enumerate() {
                    if start.elapsed() > Duration::from_millis(u64::from(millis)) {
                        break 'flood;
                    }
                    let id = 0x0100_0000 | round << 8 | i as u32;
                    let _ = s.send_to(&forged_req(qpn, *a, id, 20, 15), to);
                    sent += 1;
                    // The first 128 at once, then paced.
                    if sent > 128 {
                        std::thread::sleep(gap);
                    }
                }
            }
            println!("sent {sent} REQs in {:?}", start.elapsed());
        }
        // reflect UD_QPN COUNT LISTEN_MS: COUNT REQs from the victim, then count what returns.
        Some("reflect") => {
            let (qpn, count, listen) = (num(1), num(2), num(3));
            let sock = bind(VICTIM);
            for k in 0..count {
                let _ = sock.send_to(&forged_req(qpn, VICTIM, 0x0200_0000 + k, 3, 15), to);
                std::thread::sleep(Duration::from_millis(2));
            }
            let end = Instant::now() + Duration::from_millis(u64::from(listen));
            let mut per_req: BTreeMap<u32, usize> = BTreeMap::new();
            let mut other = 0usize;
            let mut buf = vec![0u8; 65_536];
            while Instant::now() < end {
                match sock.recv(&mut buf) {
                    Ok(Some(meta)) => {
                        let Some(mad) = buf
                            .get(..meta.len)
                            .and_then(|d| RocePacket::parse(d).ok())
                            .and_then(|p| CmMad::parse(p.payload).ok())
                        else {
                            other += 1;
                            continue;
                        };
                        let id = match mad.msg {
                            CmMessage::Rep(r) => r.remote_comm_id,
                            CmMessage::Rej(r) => r.remote_comm_id,
                            _ => 0,
                        };
                        *per_req.entry(id).or_default() += 1;
                    }
                    _ => std::thread::sleep(Duration::from_millis(1)),
                }
            }
            let total: usize = per_req.values().sum();
            let max = per_req.values().copied().max().unwrap_or(0);
            println!(
                "back: total={total} max={max} answered={} sent={count} other={other}",
                per_req.len()
            );
        }
        _ => panic!("unknown role {role}"),
    }
    println!("ROGUE DONE");
}
