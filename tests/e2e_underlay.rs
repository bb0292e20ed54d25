//! The host changing under running daemons, in labs of network namespaces built by
//! `scripts/lab.sh` (underlay links of 9000 bytes on a bridge): the underlay MTU lowered under
//! a TCP stream and raised again, two nodes whose links differ, the `--bind` address removed
//! and put back, and `ip link set ib0 down; up`. Each test fails on the daemon that read the
//! underlay only at start. Without root the tests print `skipped: ...` and pass. Every wait
//! is bounded.

mod common;

use std::time::{Duration, Instant};

use common::lab::{provider_of, Lab};

/// Sets node `k`'s underlay link (and its bridge port) to `mtu` bytes.
fn set_link_mtu(lab: &Lab, k: usize, mtu: u32) {
    let mtu = mtu.to_string();
    let node = format!("{}{k}", lab.prefix);
    let bridge = format!("{}br", lab.prefix);
    let port = format!("v{k}");
    for (ns, dev) in [(node.as_str(), "eth0"), (bridge.as_str(), port.as_str())] {
        let out = common::lab::run_within(
            {
                let mut c = std::process::Command::new("ip");
                c.args(["-n", ns, "link", "set", dev, "mtu", &mtu]);
                c
            },
            Duration::from_secs(10),
        );
        assert!(out.status.success(), "ip -n {ns} link set {dev} mtu {mtu}");
    }
}

/// `count` pings of `size` bytes from node `from` to `to` (0.2 s apart, 2 s to answer each);
/// how many came back.
fn pings(lab: &Lab, from: usize, to: &str, size: u32, count: u32) -> u32 {
    let out = lab.exec(
        from,
        &[
            "ping",
            "-n",
            "-c",
            &count.to_string(),
            "-i",
            "0.2",
            "-W",
            "2",
            "-s",
            &size.to_string(),
            to,
        ],
        Duration::from_secs(30),
    );
    String::from_utf8_lossy(&out.stdout)
        .split(',')
        .find_map(|part| part.trim().strip_suffix(" received"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Lines of node `k`'s log at level WARN.
fn warnings(lab: &Lab, k: usize) -> Vec<String> {
    lab.log(k)
        .lines()
        .filter(|l| l.contains(" WARN "))
        .map(str::to_owned)
        .collect()
}

/// Runs `ip ARGS` in node `k`'s namespace; it must succeed.
fn ip_on(lab: &Lab, k: usize, args: &[&str]) {
    let mut c = std::process::Command::new("ip");
    c.args(["-n", &format!("{}{k}", lab.prefix)]).args(args);
    let out = common::lab::run_within(c, Duration::from_secs(10));
    assert!(out.status.success(), "ip {args:?} on node {k}");
}

fn underlay(lab: &Lab, k: usize) -> serde_json::Value {
    lab.status(k)["interface"]["underlay"].clone()
}

/// 9000 → 1500 on both nodes three seconds into a 10-second TCP stream: the stream goes on
/// (every second from two seconds after the change carries data), 8000- and 60000-byte pings
/// cross both ways at 1500, each node logs at most 20 warnings, and back at 9000 UDP GSO is
/// still on. (Before: the path MTU read at start stayed, the stream moved nothing until the
/// MTU came back, and a refused GSO train turned GSO off for good.)
#[test]
fn an_underlay_mtu_lowered_under_a_tcp_stream_is_followed() {
    an_underlay_mtu_lowered_under_a_tcp_stream_is_followed_with("e2eum", 1);
}

/// The same with 2 workers on both nodes: every worker follows the link (the provider
/// figures are summed over the workers).
#[test]
fn an_underlay_mtu_lowered_under_a_tcp_stream_is_followed_with_2_workers() {
    an_underlay_mtu_lowered_under_a_tcp_stream_is_followed_with("e2euw", 2);
}

fn an_underlay_mtu_lowered_under_a_tcp_stream_is_followed_with(prefix: &str, workers: u64) {
    let Some(lab) = Lab::up(prefix, 2, &["--workers", &workers.to_string()]) else {
        return;
    };
    lab.ping_ok(1, "198.19.0.2", &[]);
    let report = std::thread::scope(|s| {
        let stream = s.spawn(|| lab.iperf3(1, 2, "198.19.0.2", &["-t", "10", "-i", "1"]));
        std::thread::sleep(Duration::from_secs(3) + Duration::from_millis(500));
        for k in 1..=2 {
            set_link_mtu(&lab, k, 1500);
        }
        stream.join().expect("iperf3 thread")
    });
    let Some(report) = report else {
        println!("skipped: no iperf3");
        return;
    };
    let intervals = report["intervals"].as_array().cloned().unwrap_or_default();
    let per_second: Vec<(f64, f64)> = intervals
        .iter()
        .map(|i| {
            let s = &i["sum"];
            (
                s["start"].as_f64().unwrap_or(0.0),
                s["bits_per_second"].as_f64().unwrap_or(0.0) / 1e6,
            )
        })
        .collect();
    println!(
        "underlay mtu 9000 -> 1500 at 3.5 s, workers {workers}; Mbit/s per second: \
         {per_second:?}"
    );
    let after: Vec<f64> = per_second
        .iter()
        .filter(|(start, _)| *start >= 5.5 - 1e-6)
        .map(|(_, mbit)| *mbit)
        .collect();
    assert!(!after.is_empty(), "{per_second:?}");
    assert!(
        after.iter().all(|m| *m > 1.0),
        "a second without traffic from 2 s after the change: {per_second:?}"
    );
    for (from, to) in [(1, "198.19.0.2"), (2, "198.19.0.1")] {
        for size in [8000, 60_000] {
            assert_eq!(
                pings(&lab, from, to, size, 5),
                5,
                "{size} bytes from node {from}"
            );
        }
    }
    for k in 1..=2 {
        let st = lab.status(k);
        assert_eq!(st["interface"]["path_mtu"], 1024, "{}", st["interface"]);
        assert_eq!(st["interface"]["underlay"]["mtu"], 1500);
    }
    for k in 1..=2 {
        set_link_mtu(&lab, k, 9000);
    }
    assert_eq!(pings(&lab, 1, "198.19.0.2", 60_000, 5), 5);
    for k in 1..=2 {
        let st = lab.status(k);
        assert_eq!(st["interface"]["path_mtu"], 4096, "{}", st["interface"]);
        // Flags and counts of the providers, summed over the workers: each has GSO back on
        // and saw both changes.
        assert_eq!(
            provider_of(&st, "udp_gso"),
            workers,
            "GSO back on: {}",
            st["provider"]
        );
        assert_eq!(provider_of(&st, "path_mtu_changes"), 2 * workers);
        let w = warnings(&lab, k);
        println!(
            "node {k}: {} warning lines, send_errors {} send_too_big {}",
            w.len(),
            provider_of(&st, "send_errors"),
            provider_of(&st, "send_too_big")
        );
        assert!(
            w.len() <= 20,
            "node {k} warned {} times:\n{}",
            w.len(),
            w.join("\n")
        );
        let log = lab.log(k);
        assert!(
            log.contains("underlay: link eth0 mtu 9000 -> 1500")
                && log.contains("underlay: link eth0 mtu 1500 -> 9000"),
            "{log}"
        );
    }
}

/// Node 2 restarted on a 1500-byte link next to node 1 on 9000: 60000-byte pings cross both
/// ways (node 1's REQ at 4096 draws REJ 26 naming 1024, and it asks again at 1024). Before,
/// large packets from node 1 were lost until every node restarted at the same MTU.
#[test]
fn nodes_whose_links_differ_carry_60000_byte_pings_both_ways() {
    let Some(lab) = Lab::up("e2eud", 2, &[]) else {
        return;
    };
    let out = lab.sh(&["stop", "2"]);
    assert!(out.status.success(), "stop 2");
    set_link_mtu(&lab, 2, 1500);
    let out = lab.sh(&["start", "2"]);
    assert!(
        out.status.success(),
        "start 2: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(lab.status(2)["interface"]["path_mtu"], 1024);
    assert_eq!(lab.status(1)["interface"]["path_mtu"], 4096);
    assert_eq!(pings(&lab, 1, "198.19.0.2", 60_000, 5), 5, "{}", lab.log(1));
    assert_eq!(pings(&lab, 2, "198.19.0.1", 60_000, 5), 5, "{}", lab.log(2));
    let (s1, s2) = (lab.status(1), lab.status(2));
    assert!(
        provider_of(&s1, "tx_mtu_retries") >= 1,
        "{}",
        s1["provider"]
    );
    assert!(
        provider_of(&s2, "rx_mtu_rejected") >= 1,
        "{}",
        s2["provider"]
    );
}

/// The `--bind` address removed under traffic: one warning says so, the status says
/// `no-address`, the refused sends write at most 20 lines per place (and a count); put back,
/// one line says so and pings cross again. Before: not a line in 10 s, every connection
/// `live` in the status.
#[test]
fn the_bind_address_gone_and_back_is_logged_and_shown() {
    let Some(lab) = Lab::up("e2eua", 2, &[]) else {
        return;
    };
    lab.ping_ok(1, "198.19.0.2", &[]);
    assert_eq!(underlay(&lab, 1)["state"], "up");
    let ip = |args: &[&str]| ip_on(&lab, 1, args);
    ip(&["addr", "del", "198.18.0.1/24", "dev", "eth0"]);
    assert!(
        lab.wait_for(Duration::from_secs(2), |l| underlay(l, 1)["state"]
            == "no-address"),
        "{}",
        underlay(&lab, 1)
    );
    // Traffic with nowhere to go: 300 pings in 3 s, each a refused send (and retries).
    let _ = lab.exec(
        1,
        &[
            "ping",
            "-n",
            "-c",
            "300",
            "-i",
            "0.01",
            "-W",
            "1",
            "198.19.0.2",
        ],
        Duration::from_secs(20),
    );
    ip(&["addr", "add", "198.18.0.1/24", "dev", "eth0"]);
    assert!(
        lab.wait_for(Duration::from_secs(2), |l| underlay(l, 1)["state"] == "up"),
        "{}",
        underlay(&lab, 1)
    );
    let started = Instant::now();
    let back = lab.wait_for(Duration::from_secs(10), |l| {
        pings(l, 1, "198.19.0.2", 56, 1) == 1
    });
    assert!(back, "{}", lab.log(1));
    println!(
        "pings cross again {:?} after the address is back",
        started.elapsed()
    );
    let log = lab.log(1);
    let gone = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("--bind 198.18.0.1 is gone from eth0"))
        .count();
    assert_eq!(gone, 1, "{log}");
    assert!(log.contains("--bind 198.18.0.1 is back on eth0"), "{log}");
    let send_failed = log
        .lines()
        .filter(|l| l.contains("soft provider send failed"))
        .count();
    let sends = provider_of(&lab.status(1), "send_errors");
    println!("{sends} refused sends, {send_failed} log lines of them");
    assert!(send_failed <= 20, "{send_failed} lines:\n{log}");
}

/// `ip link set ib0 down; up`: the interface keeps its IPv6 address and IPv6 pings cross
/// again within 2 s; if the address is removed while down (a kernel that drops it), it is
/// put back when the interface is up again; one deleted by hand is put back by `reload`.
/// Before: IPv6 dead until a restart, and `reload` did not help.
#[test]
fn the_interface_keeps_its_addresses_across_down_and_up() {
    let Some(lab) = Lab::up("e2eui", 2, &[]) else {
        return;
    };
    lab.ping_ok(1, "2001:db8:19::2", &["-6"]);
    let ip = |args: &[&str]| ip_on(&lab, 1, args);
    for drop_address in [false, true] {
        ip(&["link", "set", "ib0", "down"]);
        if drop_address {
            ip(&["addr", "del", "2001:db8:19::1/64", "dev", "ib0"]);
        }
        std::thread::sleep(Duration::from_millis(300));
        ip(&["link", "set", "ib0", "up"]);
        let up = Instant::now();
        let mut ok = false;
        while up.elapsed() < Duration::from_secs(2) {
            let out = lab.exec(
                1,
                &["ping", "-6", "-n", "-c", "1", "-W", "1", "2001:db8:19::2"],
                Duration::from_secs(5),
            );
            if out.status.success() {
                ok = true;
                break;
            }
        }
        println!(
            "address dropped while down: {drop_address}; IPv6 ping back after {:?}",
            up.elapsed()
        );
        assert!(ok, "no IPv6 ping within 2 s of ib0 up:\n{}", lab.log(1));
    }
    // An address deleted by hand stays deleted until a reload, which puts it back (with or
    // without a configuration file to read).
    ip(&["addr", "del", "198.19.0.1/24", "dev", "ib0"]);
    let out = lab.exec(
        1,
        &[
            common::lab::BIN,
            "reload",
            "--control-socket",
            &lab.socket(1).to_string_lossy(),
        ],
        Duration::from_secs(10),
    );
    println!("reload: {}", String::from_utf8_lossy(&out.stdout).trim());
    lab.ping_ok(1, "198.19.0.2", &[]);
    let log = lab.log(1);
    assert!(
        log.contains("addresses put back on ib0: 198.19.0.1/24"),
        "{log}"
    );
    assert!(log.contains("interface ib0 is down"), "{log}");
    assert!(
        log.contains("interface ib0 is up again; addresses put back: 2001:db8:19::1/64"),
        "{log}"
    );
}

/// In datagram mode the interface MTU is the path MTU - 4: 9000 → 1500 takes `ib0` from 4092
/// to 1020, and back.
#[test]
fn in_datagram_mode_the_interface_mtu_follows_the_link() {
    let Some(lab) = Lab::up("e2eug", 2, &["--mode", "datagram"]) else {
        return;
    };
    let ib0_mtu = |l: &Lab| {
        let out = l.exec(
            1,
            &["cat", "/sys/class/net/ib0/mtu"],
            Duration::from_secs(5),
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(ib0_mtu(&lab), "4092");
    set_link_mtu(&lab, 1, 1500);
    assert!(
        lab.wait_for(Duration::from_secs(2), |l| ib0_mtu(l) == "1020"),
        "ib0 mtu {}:\n{}",
        ib0_mtu(&lab),
        lab.log(1)
    );
    set_link_mtu(&lab, 1, 9000);
    assert!(lab.wait_for(Duration::from_secs(2), |l| ib0_mtu(l) == "4092"));
    assert!(lab
        .log(1)
        .contains("interface MTU 1020 -> 4092 from the path MTU"));
}
