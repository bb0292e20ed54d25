//! `ipoib-cm rc-pingpong` between two network namespaces, over real UDP sockets.
//!
//! - 10,000 messages with 5% injected loss arrive intact (`-c` checks every payload).
//! - A capture of a clean run decodes in tshark as RoCEv2 (RRoCE) with the expected opcodes
//!   and consecutive PSNs, nothing malformed, and every ICRC (recomputed here from the
//!   captured IP and UDP headers) correct.
//!
//! Each test builds its own namespaces (198.18.0.0/24) and removes them; without root, or
//! without tshark/tcpdump for the capture test, they print `skipped: ...` and pass.

mod common;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::netns::{output_within, server_and_client, wait_within, Lab, Lines};
use ipoib_cm::wire::icrc::{verify_icrc, IpHeaderInfo};

const BIN: &str = env!("CARGO_BIN_EXE_ipoib-cm");

/// Runs a server on node 1 and a client on node 2 with the same extra arguments; returns
/// both outputs after checking both exited 0.
fn pingpong(lab: &Lab, args: &[&str], limit: Duration) -> (String, String) {
    pingpong_with(lab, args, &[], limit)
}

/// [`pingpong`] with `server_only` arguments added for the server.
fn pingpong_with(
    lab: &Lab,
    args: &[&str],
    server_only: &[&str],
    limit: Duration,
) -> (String, String) {
    let mut client = vec![BIN, "rc-pingpong"];
    client.extend_from_slice(args);
    let mut server = client.clone();
    server.extend_from_slice(server_only);
    server_and_client(lab, &server, &client, limit)
}

fn stat(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

#[test]
fn ten_thousand_messages_survive_five_percent_loss() {
    let lab = crate::lab_or_skip!("ipcmpp", 2, 1500);
    let (server, client) = pingpong(
        &lab,
        &[
            "-n",
            "5000",
            "-s",
            "4096",
            "-c",
            "--qp-timeout",
            "10",
            "--fault-loss",
            "5",
            "--fault-seed",
            "11",
            "--stats",
            "--deadline",
            "100",
        ],
        Duration::from_secs(120),
    );
    for out in [&server, &client] {
        assert!(out.contains("5000 iters in"), "{out}");
        assert!(out.contains("40960000 bytes in"), "{out}");
        let stats = out
            .lines()
            .find(|l| l.starts_with("soft-rc:"))
            .expect("stats line");
        println!("{stats}");
        // Each side sends 5000 messages of 4 packets plus ACKs: 5% of that is ~1000+.
        assert!(stat(stats, "injected_loss") > 500, "{stats}");
        assert!(stat(stats, "retransmits") > 0, "{stats}");
    }
}

/// One captured RoCEv2 frame, as tshark reports it.
#[derive(Debug)]
struct Frame {
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
    ip_id: u16,
    df: bool,
    opcode: u8,
    psn: u32,
    payload: Vec<u8>,
}

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(char::is_ascii_hexdigit).collect();
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

fn parse_u32(s: &str) -> u32 {
    match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16).expect("hex field"),
        None => s.parse().expect("decimal field"),
    }
}

#[test]
fn tshark_decodes_a_captured_run() {
    if !tools_installed() {
        println!("skipped: tshark or tcpdump not installed");
        return;
    }
    let lab = crate::lab_or_skip!("ipcmcap", 2, 1500);
    let dir = std::env::temp_dir().join(format!("ipoib-cm-cap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let pcap = dir.join("rc-pingpong.pcap");
    let pcap_s = pcap.to_string_lossy().to_string();
    let (mut dump, mut dump_err) = start_capture(&lab, 1, &pcap_s);
    // 20 round trips of 3000-byte messages: FIRST, MIDDLE, LAST at path MTU 1024.
    let iters = 20u32;
    pingpong(
        &lab,
        &[
            "-n",
            "20",
            "-s",
            "3000",
            "-m",
            "1024",
            "-c",
            "--deadline",
            "30",
        ],
        Duration::from_secs(40),
    );
    stop_capture(&mut dump, &mut dump_err);

    let tshark = |extra: &[&str]| tshark(&pcap_s, extra);
    let bad = tshark(&["-Y", "_ws.malformed || _ws.expert.severity == error"]);
    assert!(bad.trim().is_empty(), "malformed frames:\n{bad}");
    let not_roce = tshark(&["-Y", "!infiniband"]);
    assert!(
        not_roce.trim().is_empty(),
        "frames not decoded as RoCE:\n{not_roce}"
    );
    let odd = tshark(&[
        "-Y",
        "infiniband.bth.tver != 0 || infiniband.bth.p_key != 0xffff",
    ]);
    assert!(odd.trim().is_empty(), "bad TVer or P_Key:\n{odd}");

    let fields = tshark(&[
        "-T",
        "fields",
        "-E",
        "separator=|",
        "-e",
        "ip.src",
        "-e",
        "ip.dst",
        "-e",
        "udp.srcport",
        "-e",
        "udp.dstport",
        "-e",
        "ip.id",
        "-e",
        "ip.flags.df",
        "-e",
        "infiniband.bth.opcode",
        "-e",
        "infiniband.bth.psn",
        "-e",
        "udp.payload",
    ]);
    let frames: Vec<Frame> = fields
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            assert_eq!(f.len(), 9, "{l}");
            Frame {
                src: f[0].parse().expect("ip.src"),
                dst: f[1].parse().expect("ip.dst"),
                sport: f[2].parse().expect("sport"),
                dport: f[3].parse().expect("dport"),
                ip_id: u16::try_from(parse_u32(f[4])).expect("ip.id"),
                df: f[5] == "1" || f[5] == "True",
                opcode: u8::try_from(parse_u32(f[6])).expect("opcode"),
                psn: parse_u32(f[7]),
                payload: hex(f[8]),
            }
        })
        .collect();

    assert!(
        !frames.is_empty(),
        "nothing captured; tshark said:\n{fields}"
    );
    // Every frame: UDP 4791 both ways, DF with IP ID 0, and a correct ICRC.
    for fr in &frames {
        assert_eq!((fr.sport, fr.dport), (4791, 4791), "{fr:?}");
        assert!(fr.df && fr.ip_id == 0, "DF/ID: {fr:?}");
        let ip = IpHeaderInfo::V4 {
            src: fr.src,
            dst: fr.dst,
            identification: fr.ip_id,
            dont_fragment: fr.df,
        };
        assert!(
            verify_icrc(&ip, fr.sport, fr.dport, &fr.payload),
            "ICRC: {fr:?}"
        );
    }

    // Requests: per direction, opcodes FIRST(0) MIDDLE(1) LAST(2) repeating, PSNs consecutive.
    let mut by_dir: BTreeMap<Ipv4Addr, Vec<&Frame>> = BTreeMap::new();
    for fr in frames.iter().filter(|f| f.opcode != 17) {
        by_dir.entry(fr.src).or_default().push(fr);
    }
    assert_eq!(by_dir.len(), 2, "both directions carried data");
    for (src, reqs) in &by_dir {
        assert_eq!(reqs.len() as u32, iters * 3, "requests from {src}");
        for (i, fr) in reqs.iter().enumerate() {
            assert_eq!(
                u32::from(fr.opcode),
                (i % 3) as u32,
                "opcode order from {src}"
            );
            let want = (reqs[0].psn + i as u32) & 0xFF_FFFF;
            assert_eq!(fr.psn, want, "PSN sequence from {src}");
        }
    }
    let acks = frames.iter().filter(|f| f.opcode == 17).count() as u32;
    assert!(acks >= iters * 2, "one ACK per message at least: {acks}");
    println!(
        "captured {} frames: {} requests, {} ACKs, all ICRCs valid",
        frames.len(),
        frames.len() as u32 - acks,
        acks
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts tcpdump on node `k`'s link writing to `pcap`; returns it once it listens.
fn start_capture(lab: &Lab, k: usize, pcap: &str) -> (std::process::Child, Lines) {
    let mut dump = lab.exec(
        k,
        &[
            "tcpdump",
            "-Z",
            "root",
            "--immediate-mode",
            "-B",
            "32768",
            "-i",
            "eth0",
            "-n",
            "-U",
            "-s",
            "0",
            "-w",
            pcap,
            "udp",
            "port",
            "4791",
        ],
    );
    dump.stderr(Stdio::piped()).stdout(Stdio::null());
    let mut dump = dump.spawn().expect("tcpdump");
    let mut err = Lines::new(dump.stderr.take().expect("stderr"));
    assert!(
        err.wait_for("listening on", Duration::from_secs(10)),
        "tcpdump did not start: {:?}",
        err.seen()
    );
    (dump, err)
}

/// Runs tshark on `pcap` (RPC-over-RDMA heuristics off) and returns its output.
fn tshark(pcap: &str, extra: &[&str]) -> String {
    let mut c = Command::new("tshark");
    c.args(["-r", pcap, "--disable-protocol", "rpcordma"])
        .args(extra);
    let out = output_within(c, Duration::from_secs(60));
    assert!(
        out.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn tools_installed() -> bool {
    ["tshark", "tcpdump"].iter().all(|tool| {
        Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// Stops tcpdump and prints its packet statistics.
fn stop_capture(dump: &mut std::process::Child, err: &mut Lines) {
    std::thread::sleep(Duration::from_millis(300));
    let _ = Command::new("kill")
        .args(["-INT", &dump.id().to_string()])
        .status();
    wait_within(dump, Duration::from_secs(10));
    println!("tcpdump: {:?}", err.finish(Duration::from_secs(2)));
}

#[test]
fn cm_connects_and_disconnects_and_tshark_decodes_it() {
    if !tools_installed() {
        println!("skipped: tshark or tcpdump not installed");
        return;
    }
    let lab = crate::lab_or_skip!("ipcmcm", 2, 1500);
    let dir = std::env::temp_dir().join(format!("ipoib-cm-cmcap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let pcap = dir.join("cm.pcap").to_string_lossy().to_string();
    let (mut dump, mut dump_err) = start_capture(&lab, 1, &pcap);
    let bind = lab.addr(1).to_string();
    let (server, client) = pingpong_with(
        &lab,
        &["--cm", "-n", "50", "-s", "2000", "-c", "--deadline", "30"],
        &["--bind", &bind],
        Duration::from_secs(40),
    );
    stop_capture(&mut dump, &mut dump_err);
    for out in [&server, &client] {
        assert!(out.contains("50 iters in"), "{out}");
    }
    // The client's QPN, as it printed it.
    let client_qpn = client
        .lines()
        .find(|l| l.contains("local address"))
        .and_then(|l| l.split("QPN ").nth(1))
        .and_then(|r| r.split(',').next())
        .map(|q| parse_u32(q.trim()))
        .expect("client QPN");

    let tshark = |extra: &[&str]| tshark(&pcap, extra);
    let bad = tshark(&["-Y", "_ws.malformed || _ws.expert.severity == error"]);
    assert!(bad.trim().is_empty(), "malformed frames:\n{bad}");
    let cm = tshark(&[
        "-Y",
        "infiniband.mad.mgmtclass == 7",
        "-T",
        "fields",
        "-E",
        "separator=|",
        "-e",
        "infiniband.bth.opcode",
        "-e",
        "infiniband.bth.destqp",
        "-e",
        "infiniband.deth.srcqp",
        "-e",
        "infiniband.mad.attributeid",
        "-e",
        "infiniband.mad.transactionid",
        "-e",
        "infiniband.cm.req.serviceid",
        "-e",
        "infiniband.cm.req.localqpn",
    ]);
    let rows: Vec<Vec<String>> = cm
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split('|').map(str::to_string).collect())
        .collect();
    let attrs: Vec<u32> = rows.iter().map(|r| parse_u32(&r[3])).collect();
    assert_eq!(
        attrs,
        [0x10, 0x13, 0x14, 0x15, 0x16],
        "CM flow REQ REP RTU DREQ DREP: {cm}"
    );
    for r in &rows {
        assert_eq!(parse_u32(&r[0]), 100, "UD SEND_ONLY: {r:?}");
        assert_eq!(parse_u32(&r[1]), 1, "to QP1: {r:?}");
        assert_eq!(parse_u32(&r[2]), 1, "from QP1: {r:?}");
    }
    // REP and RTU answer the REQ's transaction; DREP answers the DREQ's.
    assert_eq!(rows[1][4], rows[0][4]);
    assert_eq!(rows[2][4], rows[0][4]);
    assert_eq!(rows[4][4], rows[3][4]);
    assert_eq!(
        u64::from_str_radix(rows[0][5].trim_start_matches("0x"), 16).expect("service id"),
        0x0000_0000_0106_0000 | 18515,
        "rdma_cm TCP port-space service ID"
    );
    assert_eq!(
        parse_u32(&rows[0][6]),
        client_qpn,
        "REQ carries the client QPN"
    );
    println!("CM flow decoded: REQ REP RTU DREQ DREP, service ID 0x106484d");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cm_survives_loss_of_mads_and_data() {
    let lab = crate::lab_or_skip!("ipcmcml", 2, 1500);
    let bind = lab.addr(1).to_string();
    let (server, client) = pingpong_with(
        &lab,
        &[
            "--cm",
            "-n",
            "300",
            "-s",
            "4096",
            "-c",
            "--qp-timeout",
            "10",
            "--fault-loss",
            "10",
            "--fault-seed",
            "5",
            "--stats",
            "--deadline",
            "60",
        ],
        &["--bind", &bind],
        Duration::from_secs(90),
    );
    for out in [&server, &client] {
        assert!(out.contains("300 iters in"), "{out}");
    }
}
