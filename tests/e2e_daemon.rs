//! End-to-end tests of `ipoib-cm up` in labs of network namespaces built by `scripts/lab.sh`:
//! real TUN interfaces, real UDP underlay, real `ping` and `iperf3`.
//!
//! Each test builds its own lab (its own namespace prefix and state directory) and tears it
//! down, also on failure; without root they print `skipped: ...` and pass. Every wait is
//! bounded.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::lab::{can_run, Lab, BIN};

/// A sender that outruns the fabric: once every send buffer is in flight the daemon stops
/// reading the TUN, so the excess is dropped by the kernel at the TUN queue (counted as the
/// interface's TX drops) instead of being read only to be dropped by the endpoint.
#[test]
fn a_udp_flood_waits_in_the_tun_queue() {
    let Some(lab) = Lab::up("e2eq", 2, &[]) else {
        return;
    };
    lab.ping_ok(1, "198.19.0.2", &[]);
    let flood = ["-u", "-b", "0", "-l", "64", "-t", "2"];
    let Some(j) = lab.iperf3(1, 2, "198.19.0.2", &flood) else {
        println!("skipped: iperf3 not installed");
        return;
    };
    let sum = &j["end"]["sum"];
    let (sent, lost) = (
        sum["packets"].as_u64().expect("packets"),
        sum["lost_packets"].as_u64().expect("lost_packets"),
    );
    let links = lab.exec(
        1,
        &["ip", "-s", "-j", "link", "show", "ib0"],
        Duration::from_secs(10),
    );
    let links: serde_json::Value = serde_json::from_slice(&links.stdout).expect("ip -j");
    let tun_drops = links[0]["stats64"]["tx"]["dropped"].as_u64().unwrap_or(0);
    println!("flood: {sent} sent, {lost} lost; TUN queue drops {tun_drops}");
    assert!(sent > lost, "nothing got through");
    assert_eq!(
        lab.provider_counter(1, "tx_dropped"),
        0,
        "the daemon read packets it could not send"
    );
    // What the fabric could not take went nowhere else: the TUN queue dropped it.
    assert!(tun_drops > 0 || lost == 0, "{lost} lost but no TUN drops");
}

#[test]
fn ping_and_iperf3_both_ways() {
    let Some(lab) = Lab::up("e2ep", 2, &[]) else {
        return;
    };
    lab.ping_ok(1, "198.19.0.2", &[]);
    lab.ping_ok(2, "198.19.0.1", &[]);
    lab.ping_ok(1, "2001:db8:19::2", &["-6"]);
    lab.ping_ok(2, "2001:db8:19::1", &["-6"]);
    lab.ping_ok(1, "198.19.0.2", &["-s", "65000"]);
    lab.ping_ok(2, "2001:db8:19::1", &["-6", "-s", "65000"]);
    if let Some(j) = lab.iperf3(1, 2, "198.19.0.2", &["-t", "2"]) {
        let bps = j["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .unwrap_or(0.0);
        println!("iperf3 TCP through the tunnel: {:.2} Gbit/s", bps / 1e9);
        assert!(bps > 1e6, "iperf3 moved almost nothing: {bps}");
    } else {
        println!("skipped (partly): iperf3 not installed");
    }
    let s = lab.status(1);
    assert_eq!(s["interface"]["mtu"], 65520);
    assert_eq!(s["interface"]["mode"], "connected");
    assert!(s["counters"]["tx_established"].as_u64() >= Some(1));
    assert!(s["counters"]["rx_accepted"].as_u64() >= Some(1));
}

#[test]
fn cm_over_the_udp_side_channel() {
    // What a soft daemon runs with to talk to a `--provider verbs` one (whose kernel owns QP1).
    let Some(lab) = Lab::up("e2eu", 2, &["--cm-transport", "udp", "--mad-port", "4799"]) else {
        return;
    };
    lab.ping_ok(1, "198.19.0.2", &[]);
    lab.ping_ok(2, "2001:db8:19::1", &["-6"]);
    for k in [1, 2] {
        let s = lab.status(k);
        assert!(s["counters"]["tx_established"].as_u64() >= Some(1));
        assert!(s["provider"]["mad_received"].as_u64() >= Some(2), "{s}");
    }
}

#[test]
fn packet_too_big_for_a_datagram_peer_reaches_ping() {
    let Some(lab) = Lab::up("e2eb", 2, &[]) else {
        return;
    };
    let out = lab.sh(&["stop", "2"]);
    assert!(out.status.success());
    let out = lab.sh(&["start", "2", "--", "--mode", "datagram"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Node 2 advertises no connected-mode flag, so node 1 sends over UD (UD MTU 4092).
    lab.ping_ok(1, "198.19.0.2", &["-s", "1000"]);
    let out = lab.ping(1, "198.19.0.2", &["-M", "do", "-s", "6000"]);
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a 6000-byte DF ping crossed a 4092 MTU: {text}"
    );
    assert!(
        text.contains("mtu = 4092") || text.contains("mtu=4092"),
        "ping did not learn the MTU: {text}"
    );
    assert!(lab.counter(1, "icmp_too_big_sent") >= 1);
}

/// SIGKILL node 2 after it connected to node 1: node 1 reaps the RX QP and returns to its
/// baseline QP count; a restarted node 2 connects again.
fn kill_reap_restart(prefix: &str, extra: &[&str]) -> Lab {
    let mut args = vec![
        "--rx-timeout",
        "2s",
        "--neigh-timeout",
        "3s",
        "--drain-timeout",
        "1s",
    ];
    args.extend_from_slice(extra);
    let lab = Lab::up(prefix, 2, &args).expect("lab");
    let baseline = lab.counter(1, "qp_live");
    lab.ping_ok(2, "198.19.0.1", &[]);
    assert_eq!(lab.status(1)["rx"].as_array().map(Vec::len), Some(1));
    assert!(lab.sh(&["kill", "2"]).status.success());
    let t0 = Instant::now();
    let reaped = lab.wait_for(Duration::from_secs(15), |l| {
        let s = l.status(1);
        s["rx"].as_array().is_some_and(Vec::is_empty)
            && s["counters"]["qp_live"].as_u64() == Some(baseline)
    });
    let s = lab.status(1);
    assert!(reaped, "not reaped: {s}");
    println!(
        "{prefix}: RX QP reaped and qp_live back to {baseline} {:.1} s after SIGKILL (rx_timeout 2 s)",
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(s["counters"]["rx_stale_reaped"], 1);
    let out = lab.sh(&["start", "2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lab.ping_ok(2, "198.19.0.1", &[]);
    lab.ping_ok(1, "198.19.0.2", &[]);
    lab
}

#[test]
fn sigkilled_peer_is_reaped_then_reconnects_srq() {
    if can_run().is_err() {
        println!("skipped: needs root");
        return;
    }
    let lab = kill_reap_restart("e2es", &[]);
    assert!(lab.counter(1, "last_wqe_events") >= 1);
    assert_eq!(lab.counter(1, "drain_timeouts"), 0);
}

#[test]
fn sigkilled_peer_is_reaped_then_reconnects_without_srq() {
    if can_run().is_err() {
        println!("skipped: needs root");
        return;
    }
    let lab = kill_reap_restart("e2en", &["--no-srq"]);
    assert_eq!(lab.counter(1, "last_wqe_events"), 0);
    assert_eq!(lab.counter(1, "drain_timeouts"), 0);
}

#[test]
fn provider_quirks_never_leak_a_qp() {
    if can_run().is_err() {
        println!("skipped: needs root");
        return;
    }
    for (quirk, prefix) in [
        ("drain-never", "e2eq1"),
        ("no-last-wqe", "e2eq2"),
        ("dup-last-wqe", "e2eq3"),
    ] {
        let lab = kill_reap_restart(prefix, &["--quirk", quirk]);
        let timeouts = lab.counter(1, "drain_timeouts");
        let last_wqe = lab.counter(1, "last_wqe_events");
        println!("quirk {quirk}: drain_timeouts {timeouts}, last_wqe_events {last_wqe}");
        match quirk {
            "drain-never" | "no-last-wqe" => assert!(timeouts >= 1, "{quirk}"),
            _ => {
                assert_eq!(timeouts, 0);
                assert!(last_wqe >= 2, "{quirk}: duplicated event counted");
            }
        }
    }
}

#[test]
fn qp_budget_of_two_keeps_four_nodes_reachable() {
    let Some(lab) = Lab::up("e2eqb", 4, &["--max-conn-qp", "2"]) else {
        return;
    };
    for round in 0..2 {
        for k in 2..=4 {
            let out = lab.ping(k, "198.19.0.1", &[]);
            assert!(
                out.status.success(),
                "round {round}: node {k} cannot reach node 1: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
    }
    let s = lab.status(1);
    assert!(s["counters"]["rx_evicted"].as_u64() >= Some(1), "{s}");
    assert!(s["rx"].as_array().map_or(0, Vec::len) <= 3, "{s}");
}

#[test]
fn sigterm_exits_cleanly_and_removes_the_interface() {
    let Some(lab) = Lab::up("e2et", 2, &[]) else {
        return;
    };
    lab.ping_ok(1, "198.19.0.2", &[]);
    assert!(lab.sh(&["stop", "2"]).status.success());
    let gone = lab.wait_for(Duration::from_secs(5), |l| {
        l.log(2).contains("ipoib-cm exited with status 0")
    });
    assert!(gone, "daemon log:\n{}", lab.log(2));
    let link = lab.exec(2, &["ip", "link", "show", "ib0"], Duration::from_secs(5));
    assert!(!link.status.success(), "ib0 still exists");
    // Node 1 saw the DREQ for its RX connection.
    let reaped = lab.wait_for(Duration::from_secs(5), |l| {
        l.counter(1, "rx_dreq_reaped") >= 1
    });
    assert!(reaped, "{}", lab.status(1));
}

#[test]
fn bad_config_is_one_line_and_exit_2() {
    let out = Command::new(BIN)
        .args(["up", "--bind", "198.18.0.1", "--rx-timeout", "500ms"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("rx-timeout"), "{err}");
}

/// With UDP GSO on (the default), what leaves the host is still one exact RoCEv2 packet per
/// datagram: the underlay veths get `tx-udp-segmentation off`, so the kernel cuts each train
/// before the device and tcpdump sees the segments. Every captured IPv4 frame's ICRC, recomputed
/// with the IP ID it carries (1, 2, ... within a train), is correct; IPv6 frames too; nothing
/// exceeds the underlay MTU; tshark finds nothing malformed; the counters show trains sent and
/// segments accepted, with no bad ICRC.
#[test]
fn gso_trains_leave_as_exact_roce_packets() {
    use ipoib_cm::wire::icrc::{verify_icrc, IpHeaderInfo};
    let tools = ["ethtool", "tcpdump", "tshark"];
    if let Some(t) = tools.iter().find(|t| {
        !Command::new(t)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    }) {
        println!("skipped: {t} not installed");
        return;
    }
    let Some(lab) = Lab::up("e2eg", 2, &[]) else {
        return;
    };
    for k in [1, 2] {
        let out = lab.exec(
            k,
            &["ethtool", "-K", "eth0", "tx-udp-segmentation", "off"],
            Duration::from_secs(10),
        );
        assert!(out.status.success(), "ethtool: {out:?}");
    }
    let pcap = lab.state.join("gso.pcap");
    let pcap_s = pcap.to_string_lossy().to_string();
    let mut dump = Command::new("ip")
        .args([
            "netns", "exec", "e2eg2", "tcpdump", "-Z", "root", "-i", "eth0",
        ])
        .args([
            "-n", "-U", "-B", "32768", "-s", "0", "-c", "4000", "-w", &pcap_s,
        ])
        .args(["udp", "port", "4791"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("tcpdump");
    std::thread::sleep(Duration::from_millis(1500));
    // 60,000-byte echoes: RC messages of 15 packets at path MTU 4096, sent as trains.
    lab.ping_ok(1, "198.19.0.2", &["-s", "60000"]);
    lab.ping_ok(1, "2001:db8:19::2", &["-6", "-s", "60000"]);
    std::thread::sleep(Duration::from_millis(500));
    let _ = Command::new("kill")
        .args(["-INT", &dump.id().to_string()])
        .status();
    let _ = dump.wait();

    // tshark writes to a file: its output (hex payloads) is far larger than a pipe buffer.
    let text = lab.state.join("tshark.txt");
    let tshark = |extra: &[&str]| {
        let mut child = Command::new("tshark")
            .args(["-r", &pcap_s, "--disable-protocol", "rpcordma"])
            .args(extra)
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&text).expect("tshark output file"))
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("tshark");
        let end = Instant::now() + Duration::from_secs(120);
        let status = loop {
            if let Ok(Some(st)) = child.try_wait() {
                break st;
            }
            assert!(Instant::now() < end, "tshark took over 120 s");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "tshark failed: {status}");
        std::fs::read_to_string(&text).expect("tshark output")
    };
    let bad = tshark(&["-Y", "_ws.malformed || !infiniband || frame.len > 9014"]);
    assert!(
        bad.trim().is_empty(),
        "malformed or oversized:\n{bad:.2000}"
    );
    // First occurrences: tshark also decodes the IP packet inside the IPoIB payload.
    let fields = tshark(&[
        "-T",
        "fields",
        "-E",
        "separator=|",
        "-E",
        "occurrence=f",
        "-e",
        "ip.src",
        "-e",
        "ip.dst",
        "-e",
        "ip.id",
        "-e",
        "udp.srcport",
        "-e",
        "udp.payload",
    ]);
    let (mut frames, mut shifted) = (0, 0);
    for line in fields.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split('|').collect();
        assert_eq!(f.len(), 5, "{line:.200}");
        let payload: Vec<u8> = (0..f[4].len() / 2)
            .map(|i| u8::from_str_radix(&f[4][2 * i..2 * i + 2], 16).expect("hex"))
            .collect();
        let id = u16::from_str_radix(f[2].trim_start_matches("0x"), 16)
            .unwrap_or_else(|e| panic!("ip.id in {line:.200}: {e}"));
        frames += 1;
        shifted += usize::from(id != 0);
        let ip = IpHeaderInfo::V4 {
            src: f[0].parse().expect("ip.src"),
            dst: f[1].parse().expect("ip.dst"),
            identification: id,
            dont_fragment: true,
        };
        let sport = f[3].parse().expect("udp.srcport");
        assert!(
            verify_icrc(&ip, sport, 4791, &payload),
            "ICRC of {line:.200}"
        );
    }
    println!("{frames} frames ({shifted} with IP ID > 0), every ICRC valid");
    assert!(frames >= 120, "too few frames captured: {frames}");
    assert!(shifted > 0, "no train segment (IP ID > 0) on the wire");
    for k in [1, 2] {
        assert!(
            lab.provider_counter(k, "tx_gso_trains") > 0,
            "node {k} sent no train"
        );
        assert!(
            lab.provider_counter(k, "rx_gso_segments") > 0,
            "node {k} took no segment"
        );
        assert_eq!(lab.provider_counter(k, "rx_bad_icrc"), 0, "node {k}");
    }
}

/// A peer whose daemon freezes (SIGSTOP: no DREQ, no NAK, no ACK) while node 1 has every
/// send buffer in flight to it holds node 1 back only for `--tx-stall-timeout`, not for the
/// RC retry budget: at `--qp-timeout 16` (268 ms) the software provider would retry for about
/// 12.6 s (47 backed-off timeouts), and node 1 could reach no one meanwhile.
#[test]
fn a_frozen_peer_holds_the_send_buffers_only_for_the_stall_timeout() {
    let Some(lab) = Lab::up(
        "e2ez",
        3,
        &["--qp-timeout", "16", "--tx-stall-timeout", "1s"],
    ) else {
        return;
    };
    lab.ping_ok(1, "198.19.0.2", &[]);
    lab.ping_ok(1, "198.19.0.3", &[]);
    let pid = std::fs::read_to_string(lab.state.join("node2.pid")).expect("node 2 pid");
    let stop = |sig: &str| {
        let ok = Command::new("kill")
            .args([sig, pid.trim()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} node 2");
    };
    stop("-STOP");
    // More packets for the frozen peer than node 1 has send buffers (128), sent at once (in
    // the background: ping waits for replies that will not come).
    let mut flood = Command::new("ip")
        .args(["netns", "exec", "e2ez1"])
        .args([
            "ping", "-n", "-q", "-c", "300", "-l", "300", "-s", "1000", "-w", "3",
        ])
        .arg("198.19.0.2")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("ping");
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    let reached = lab.wait_for(Duration::from_secs(10), |l| {
        l.exec(
            1,
            &["ping", "-n", "-c", "1", "-W", "1", "198.19.0.3"],
            Duration::from_secs(3),
        )
        .status
        .success()
    });
    let waited = t0.elapsed();
    let _ = flood.kill();
    let _ = flood.wait();
    stop("-CONT");
    assert!(reached, "node 1 never reached node 3 again: {}", lab.log(1));
    println!(
        "node 1 reached node 3 {:.1} s after flooding the frozen node 2 (stall timeout 1 s)",
        waited.as_secs_f64()
    );
    assert!(waited < Duration::from_secs(4), "took {waited:?}");
    assert!(lab.counter(1, "tx_stalled") >= 1);
    // The thawed peer is reachable again (a new connection).
    let back = lab.wait_for(Duration::from_secs(15), |l| {
        l.ping(1, "198.19.0.2", &[]).status.success()
    });
    assert!(back, "node 2 not reachable after SIGCONT: {}", lab.log(1));
}
