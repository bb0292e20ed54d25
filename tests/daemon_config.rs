//! `ipoib-cm up` configuration: every validation rule, file errors, flag-over-file precedence.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use clap::CommandFactory;
use clap::Parser;
use ipoib_cm::daemon::config::{
    parse_config_file, parse_duration, parse_path_mtu, path_mtu_for_link_mtu, resolve, resolve_str,
    Cidr, ConfigError, Mode, ProviderKind, QpBudgetPolicy, Settings,
};
use ipoib_cm::verbs::PathMtu;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    up: Settings,
}

fn flags(args: &[&str]) -> Settings {
    Cli::try_parse_from(std::iter::once("up").chain(args.iter().copied()))
        .unwrap()
        .up
}

const P: &str = "/x.toml";

fn file_err(text: &str, args: &[&str]) -> String {
    let e = resolve_str(Path::new(P), text, &flags(args)).unwrap_err();
    let s = e.to_string();
    assert!(!s.contains('\n'), "multi-line error: {s:?}");
    s
}

fn flag_err(args: &[&str]) -> String {
    file_err("", args)
}

fn ok(text: &str, args: &[&str]) -> ipoib_cm::daemon::Config {
    resolve_str(Path::new(P), text, &flags(args)).unwrap()
}

/// The soft provider's QPN order is drawn per start unless `--qpn-seed` / `qpn_seed` fixes it.
#[test]
fn qpn_seed_is_drawn_unless_given() {
    assert_eq!(ok("", &["--bind", "192.0.2.1"]).qpn_seed, None);
    assert_eq!(
        ok("", &["--bind", "192.0.2.1", "--qpn-seed", "0"]).qpn_seed,
        Some(0)
    );
    assert_eq!(
        ok("bind = \"192.0.2.1\"\nqpn_seed = 77\n", &[]).qpn_seed,
        Some(77)
    );
    let e = flag_err(&["--bind", "192.0.2.1", "--qpn-seed", "-1"]);
    assert!(e.contains("qpn_seed") || e.contains("qpn-seed"), "{e}");
}

#[test]
fn defaults() {
    let c = ok("", &["--bind", "192.0.2.1"]);
    assert_eq!(c.ifname, "ib0");
    assert!(c.addr.is_empty());
    assert_eq!(c.bind, "192.0.2.1".parse::<IpAddr>().unwrap());
    assert!(c.peer.is_empty());
    assert_eq!(c.udp_port, 4791);
    assert_eq!(c.mode, Mode::Connected);
    assert!(c.srq);
    assert_eq!(c.rx_timeout, Duration::from_secs(60));
    assert_eq!(c.drain_timeout, Duration::from_secs(5));
    assert_eq!(c.tx_stall_timeout, Duration::from_secs(1));
    assert_eq!(c.neigh_timeout, Duration::from_secs(300));
    assert_eq!(c.max_conn_qp, 8192);
    assert_eq!(c.max_pending_rx, 256);
    assert_eq!(c.neigh_max, 16384);
    assert_eq!(c.qp_budget_policy, QpBudgetPolicy::Evict);
    assert_eq!(c.tx_queue_len, 3);
    assert_eq!(c.path_mtu, None);
    assert!(c.fault.is_clean());
    assert_eq!(c.fault.seed, 1);
    assert_eq!(c.quirks, Default::default());
    assert_eq!(c.control_socket, Path::new("@ipoib-cm/ib0"));
    assert_eq!(c.log, "info");
    // No cap: the port's active MTU, on RoCE at most what the --bind link carries.
    let mtu = |c: &ipoib_cm::daemon::Config, link| c.path_mtu_choice(&port_4k(), link).path_mtu;
    assert_eq!(mtu(&c, None), PathMtu::Mtu4096);
    assert_eq!(mtu(&c, Some(9000)), PathMtu::Mtu4096);
    assert_eq!(mtu(&c, Some(1500)), PathMtu::Mtu1024);
    // Without an SRQ the budget is Linux's non-SRQ one (a connection pins a receive ring).
    assert_eq!(
        ok("", &["--bind", "192.0.2.1", "--no-srq"]).max_conn_qp,
        128
    );
    assert_eq!(
        ok(
            "",
            &["--bind", "192.0.2.1", "--no-srq", "--max-conn-qp", "300"]
        )
        .max_conn_qp,
        300
    );
}

/// A port whose active and largest MTU are 4096 (InfiniBand, or RoCE on a 9000-byte link).
fn port_4k() -> ipoib_cm::verbs::PortAttr {
    ipoib_cm::verbs::PortAttr {
        gid: ipoib_cm::verbs::Gid([0; 16]),
        active_mtu: PathMtu::Mtu4096,
        max_mtu: PathMtu::Mtu4096,
        max_msg_size: 1 << 31,
        active: true,
        lids: None,
    }
}

#[test]
fn full_file() {
    let text = r#"
ifname = "ib3"
addr = ["198.19.0.1/24", "fd00::1/64"]
bind = "10.0.0.1"
peer = ["10.0.0.2", "10.0.0.3"]
udp_port = 4792
mode = "datagram"
srq = false
rx_timeout = "2m"
drain_timeout = 7
neigh_timeout = "1h"
max_conn_qp = 16
qp_budget_policy = "reject"
tx_queue_len = 10
path_mtu = 2048
fault_loss = 5
fault_reorder = 1.5
fault_dup = 2.0
fault_corrupt = 0.5
fault_seed = 42
quirk = ["drain-never", "dup-last-wqe"]
control_socket = "/tmp/x.sock"
log = "debug"
"#;
    let c = ok(text, &[]);
    assert_eq!(c.ifname, "ib3");
    assert_eq!(
        c.addr,
        vec![
            "198.19.0.1/24".parse::<Cidr>().unwrap(),
            "fd00::1/64".parse::<Cidr>().unwrap()
        ]
    );
    assert_eq!(c.addr[1].prefix_len, 64);
    assert_eq!(c.peer.len(), 2);
    assert_eq!(c.udp_port, 4792);
    assert_eq!(c.mode, Mode::Datagram);
    assert!(!c.srq);
    assert_eq!(c.rx_timeout, Duration::from_secs(120));
    assert_eq!(c.drain_timeout, Duration::from_secs(7));
    assert_eq!(c.neigh_timeout, Duration::from_secs(3600));
    assert_eq!(c.max_conn_qp, 16);
    assert_eq!(c.qp_budget_policy, QpBudgetPolicy::Reject);
    assert_eq!(c.tx_queue_len, 10);
    assert_eq!(c.path_mtu, Some(PathMtu::Mtu2048));
    // A cap: it lowers the port's MTU, and never raises what the --bind link carries.
    assert_eq!(
        c.path_mtu_choice(&port_4k(), None).path_mtu,
        PathMtu::Mtu2048
    );
    assert_eq!(
        c.path_mtu_choice(&port_4k(), Some(9000)).path_mtu,
        PathMtu::Mtu2048
    );
    assert_eq!(
        c.path_mtu_choice(&port_4k(), Some(1500)).path_mtu,
        PathMtu::Mtu1024
    );
    assert_eq!(c.fault.loss_pct, 5.0);
    assert_eq!(c.fault.reorder_pct, 1.5);
    assert_eq!(c.fault.dup_pct, 2.0);
    assert_eq!(c.fault.corrupt_pct, 0.5);
    assert_eq!(c.fault.seed, 42);
    assert!(c.quirks.drain_never && c.quirks.dup_last_wqe && !c.quirks.no_last_wqe);
    assert_eq!(c.control_socket, Path::new("/tmp/x.sock"));
    assert_eq!(c.log, "debug");
}

#[test]
fn flags_win_over_file() {
    let text = r#"
ifname = "ib3"
addr = ["198.19.0.1/24"]
bind = "10.0.0.1"
peer = ["10.0.0.2"]
mode = "datagram"
rx_timeout = "2m"
max_conn_qp = 16
qp_budget_policy = "reject"
path_mtu = 2048
fault_loss = 5
quirk = ["drain-never"]
log = "debug"
"#;
    let c = ok(
        text,
        &[
            "--ifname",
            "ib7",
            "--addr",
            "198.19.1.1/16",
            "--addr",
            "fd00::2/64",
            "--bind",
            "10.0.0.9",
            "--peer",
            "10.0.0.8",
            "--mode",
            "connected",
            "--rx-timeout",
            "90",
            "--max-conn-qp",
            "64",
            "--max-pending-rx",
            "8",
            "--evict",
            "--path-mtu",
            "4096",
            "--fault-loss",
            "0",
            "--quirk",
            "no-last-wqe",
            "--log",
            "warn",
            "--no-srq",
        ],
    );
    assert_eq!(c.ifname, "ib7");
    assert_eq!(c.addr.len(), 2, "repeatable flags replace the file's list");
    assert_eq!(c.addr[0].to_string(), "198.19.1.1/16");
    assert_eq!(c.bind.to_string(), "10.0.0.9");
    assert_eq!(c.peer, vec!["10.0.0.8".parse::<IpAddr>().unwrap()]);
    assert_eq!(c.mode, Mode::Connected);
    assert_eq!(c.rx_timeout, Duration::from_secs(90));
    assert_eq!(c.max_conn_qp, 64);
    assert_eq!(c.max_pending_rx, 8);
    assert_eq!(c.endpoint_config(PathMtu::Mtu1024, 0).max_pending_rx, 8);
    assert_eq!(c.qp_budget_policy, QpBudgetPolicy::Evict);
    assert_eq!(c.path_mtu, Some(PathMtu::Mtu4096));
    assert_eq!(c.fault.loss_pct, 0.0);
    assert!(c.quirks.no_last_wqe && !c.quirks.drain_never);
    assert_eq!(c.log, "warn");
    assert!(!c.srq);
    assert_eq!(c.control_socket, Path::new("@ipoib-cm/ib7"));

    // Unset flags leave the file's values.
    let c = ok(text, &["--reject"]);
    assert_eq!(c.ifname, "ib3");
    assert_eq!(c.mode, Mode::Datagram);
    assert_eq!(c.qp_budget_policy, QpBudgetPolicy::Reject);
    let c = ok(
        "bind = \"10.0.0.1\"\nqp_budget_policy = \"evict\"\n",
        &["--reject"],
    );
    assert_eq!(c.qp_budget_policy, QpBudgetPolicy::Reject);
}

#[test]
fn evict_and_reject_conflict() {
    assert!(Cli::try_parse_from(["up", "--evict", "--reject"]).is_err());
}

#[test]
fn bind_is_required() {
    assert!(flag_err(&[]).starts_with("--bind: required"));
    assert_eq!(
        flag_err(&["--bind", "10.0.0.300"]),
        "--bind: invalid IP address \"10.0.0.300\""
    );
    assert_eq!(
        file_err("bind = \"nope\"", &[]),
        "config: bind: invalid IP address \"nope\""
    );
}

#[test]
fn cidr_rules() {
    for bad in [
        "198.19.0.1/40",
        "198.19.0.1/",
        "198.19.0.1/+1",
        "198.19.0.1/a",
        "fd00::1/129",
        "fd00::1/0129",
        "x/24",
        "",
    ] {
        assert_eq!(
            flag_err(&["--bind", "10.0.0.1", "--addr", bad]),
            format!("--addr: invalid CIDR {bad:?}")
        );
    }
    assert_eq!(
        file_err("bind = \"10.0.0.1\"\naddr = [\"198.19.0.1/40\"]", &[]),
        "config: addr: invalid CIDR \"198.19.0.1/40\""
    );
    let c = ok(
        "",
        &[
            "--bind",
            "10.0.0.1",
            "--addr",
            "0.0.0.0/0",
            "--addr",
            "::1/128",
        ],
    );
    assert_eq!(c.addr[0].prefix_len, 0);
    assert_eq!(c.addr[1].prefix_len, 128);
}

#[test]
fn peer_rules() {
    assert_eq!(
        flag_err(&["--bind", "10.0.0.1", "--peer", "fd00::2"]),
        "--peer: fd00::2 is not the same address family as bind address 10.0.0.1"
    );
    assert_eq!(
        flag_err(&["--bind", "10.0.0.1", "--peer", "10.0.0.1"]),
        "--peer: 10.0.0.1 is the bind address itself"
    );
    assert_eq!(
        file_err("bind = \"10.0.0.1\"\npeer = [\"10.0.0.x\"]", &[]),
        "config: peer: invalid IP address \"10.0.0.x\""
    );
}

#[test]
fn duration_syntax() {
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
    assert_eq!(parse_duration("60"), Ok(Duration::from_secs(60)));
    assert_eq!(parse_duration("50us"), Ok(Duration::from_micros(50)));
    assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
    assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
    assert_eq!(parse_duration("1m 30s"), Ok(Duration::from_secs(90)));
    assert_eq!(parse_duration("2.5ms"), Ok(Duration::from_micros(2500)));
    for bad in ["", "s", "-5s", "5S", "0.5", "5x", "soon", "1.5"] {
        assert!(parse_duration(bad).is_err(), "{bad:?}");
    }
    for huge in [
        "99999999999999999999h",
        "9999999999999999h",
        "99999999999999999999",
    ] {
        assert!(
            parse_duration(huge)
                .unwrap_err()
                .to_string()
                .contains("too large"),
            "{huge}"
        );
    }
}

#[test]
fn fractional_and_compound_durations_from_flags_and_file() {
    let b = ["--bind", "10.0.0.1"];
    assert_eq!(
        ok("", &[&b[..], &["--rx-timeout", "1.5s"]].concat()).rx_timeout,
        Duration::from_millis(1500)
    );
    assert_eq!(
        ok("", &[&b[..], &["--neigh-timeout", "1m30s"]].concat()).neigh_timeout,
        Duration::from_secs(90)
    );
    assert_eq!(
        ok("", &[&b[..], &["--neigh-max", "64"]].concat()).neigh_max,
        64
    );
    let c = ok("bind = \"10.0.0.1\"\nneigh_max = 4096", &[]);
    assert_eq!(c.endpoint_config(PathMtu::Mtu1024, 0).neigh_max, 4096);
    let c = ok(
        "bind = \"10.0.0.1\"\ndrain_timeout = \"1.5s\"\nrx_timeout = \"1m30s\"",
        &[],
    );
    assert_eq!(c.drain_timeout, Duration::from_millis(1500));
    assert_eq!(c.rx_timeout, Duration::from_secs(90));
    assert_eq!(
        flag_err(&[&b[..], &["--busy-poll", "10.5ms"]].concat()),
        "--busy-poll: must be at most 10ms"
    );
}

#[test]
fn duration_rules() {
    let b = ["--bind", "10.0.0.1"];
    assert_eq!(
        file_err("bind = \"10.0.0.1\"\nrx_timeout = \"500ms\"", &[]),
        "config: rx_timeout: must be at least 1s (got \"500ms\")"
    );
    assert_eq!(
        flag_err(&[&b[..], &["--rx-timeout", "500ms"]].concat()),
        "--rx-timeout: must be at least 1s (got \"500ms\")"
    );
    assert_eq!(
        flag_err(&[&b[..], &["--rx-timeout", "soon"]].concat()),
        "--rx-timeout: invalid duration \"soon\" (use e.g. 50us, 500ms, 1.5s, 1m30s, 1h or plain seconds)"
    );
    assert_eq!(
        ok("", &[&b[..], &["--rx-timeout", "1s"]].concat()).rx_timeout,
        Duration::from_secs(1)
    );
    assert_eq!(ok("", &b).busy_poll, Duration::ZERO);
    assert_eq!(
        ok("", &[&b[..], &["--busy-poll", "200us"]].concat()).busy_poll,
        Duration::from_micros(200)
    );
    assert_eq!(
        ok("busy_poll = \"2ms\"", &b).busy_poll,
        Duration::from_millis(2)
    );
    assert_eq!(
        flag_err(&[&b[..], &["--busy-poll", "11ms"]].concat()),
        "--busy-poll: must be at most 10ms"
    );
    assert_eq!(
        flag_err(&[&b[..], &["--drain-timeout", "0"]].concat()),
        "--drain-timeout: must be positive (got \"0\")"
    );
    assert_eq!(
        ok("", &[&b[..], &["--drain-timeout", "1ms"]].concat()).drain_timeout,
        Duration::from_millis(1)
    );
    assert_eq!(
        file_err("bind = \"10.0.0.1\"\nneigh_timeout = 0", &[]),
        "config: neigh_timeout: must be at least 1s (got \"0\")"
    );
    assert_eq!(
        file_err("bind = \"10.0.0.1\"\nneigh_timeout = -3", &[]),
        "config: neigh_timeout: invalid duration \"-3\" (use e.g. 50us, 500ms, 1.5s, 1m30s, 1h or plain seconds)"
    );
}

#[test]
fn tx_stall_timeout_rules() {
    let b = ["--bind", "192.0.2.1"];
    // The default is 1 s, or 4 local ACK timeouts when they are longer (2^18 * 4.096 us).
    assert_eq!(
        ok("", &[&b[..], &["--qp-timeout", "18"]].concat()).tx_stall_timeout,
        Duration::from_nanos(4 * (4096 << 18))
    );
    assert_eq!(
        ok("", &[&b[..], &["--tx-stall-timeout", "250ms"]].concat()).tx_stall_timeout,
        Duration::from_millis(250)
    );
    assert_eq!(
        ok("tx_stall_timeout = \"3s\"", &b).tx_stall_timeout,
        Duration::from_secs(3)
    );
    // It must outlast one local ACK timeout (2^12 * 4.096 us = 16.8 ms by default).
    assert_eq!(
        flag_err(&[&b[..], &["--tx-stall-timeout", "10ms"]].concat()),
        "--tx-stall-timeout: must be longer than the local ACK timeout of qp_timeout 12 (16ms 777us)"
    );
    assert_eq!(
        file_err("bind = \"10.0.0.1\"\ntx_stall_timeout = \"0\"", &[]),
        "config: tx_stall_timeout: must be positive (got \"0\")"
    );
}

#[test]
fn integer_rules() {
    let b = ["--bind", "10.0.0.1"];
    let cases: &[(&str, &str, &str)] = &[
        (
            "--max-conn-qp",
            "0",
            "--max-conn-qp: must be between 1 and 65536 (got 0)",
        ),
        (
            "--max-conn-qp",
            "65537",
            "--max-conn-qp: must be between 1 and 65536 (got 65537)",
        ),
        (
            "--max-pending-rx",
            "0",
            "--max-pending-rx: must be between 1 and 4096 (got 0)",
        ),
        (
            "--srq-depth",
            "100",
            "--srq-depth: must be a power of two from 2 to 8192 (got 100)",
        ),
        (
            "--srq-depth",
            "16384",
            "--srq-depth: must be a power of two from 2 to 8192 (got 16384)",
        ),
        (
            "--tx-rnr-retry",
            "8",
            "--tx-rnr-retry: must be between 0 and 7 (got 8)",
        ),
        (
            "--max-conn-qp",
            "lots",
            "--max-conn-qp: invalid number \"lots\"",
        ),
        (
            "--udp-port",
            "0",
            "--udp-port: must be between 1 and 65535 (got 0)",
        ),
        (
            "--udp-port",
            "65536",
            "--udp-port: must be between 1 and 65535 (got 65536)",
        ),
        (
            "--tx-queue-len",
            "0",
            "--tx-queue-len: must be between 1 and 65536 (got 0)",
        ),
        (
            "--tx-queue-len",
            "99999999999999999999",
            "--tx-queue-len: invalid number \"99999999999999999999\"",
        ),
        (
            "--max-conn-qp",
            "-5",
            "--max-conn-qp: must be between 1 and 65536 (got -5)",
        ),
        (
            "--neigh-max",
            "0",
            "--neigh-max: must be between 1 and 1048576 (got 0)",
        ),
        (
            "--fault-seed",
            "-1",
            "--fault-seed: must be between 0 and 9223372036854775807 (got -1)",
        ),
        (
            "--path-mtu",
            "1500",
            "--path-mtu: must be 256, 512, 1024, 2048 or 4096 (got \"1500\")",
        ),
        (
            "--path-mtu",
            "big",
            "--path-mtu: must be 256, 512, 1024, 2048 or 4096 (got \"big\")",
        ),
    ];
    for (flag, v, want) in cases {
        assert_eq!(&flag_err(&[&b[..], &[flag, v]].concat()), want);
    }
    assert_eq!(
        file_err("bind = \"10.0.0.1\"\nmax_conn_qp = -1", &[]),
        "config: max_conn_qp: must be between 1 and 65536 (got -1)"
    );
    assert_eq!(
        file_err("bind = \"10.0.0.1\"\nudp_port = 70000", &[]),
        "config: udp_port: must be between 1 and 65535 (got 70000)"
    );
    assert_eq!(
        file_err("bind = \"10.0.0.1\"\npath_mtu = 1000", &[]),
        "config: path_mtu: must be 256, 512, 1024, 2048 or 4096 (got 1000)"
    );
    for (v, want) in [
        ("256", PathMtu::Mtu256),
        ("512", PathMtu::Mtu512),
        ("1024", PathMtu::Mtu1024),
    ] {
        assert_eq!(
            ok("", &[&b[..], &["--path-mtu", v]].concat()).path_mtu,
            Some(want)
        );
    }
}

#[test]
fn percentage_rules() {
    let b = ["--bind", "10.0.0.1"];
    for flag in [
        "--fault-loss",
        "--fault-reorder",
        "--fault-dup",
        "--fault-corrupt",
    ] {
        assert_eq!(
            flag_err(&[&b[..], &[flag, "101"]].concat()),
            format!("{flag}: must be a percentage between 0 and 100 (got 101)")
        );
        assert_eq!(
            flag_err(&[&b[..], &[flag, "NaN"]].concat()),
            format!("{flag}: must be a percentage between 0 and 100 (got NaN)")
        );
        assert_eq!(
            flag_err(&[&b[..], &[flag, "half"]].concat()),
            format!("{flag}: invalid percentage \"half\"")
        );
    }
    assert_eq!(
        file_err("bind = \"10.0.0.1\"\nfault_dup = -0.5", &[]),
        "config: fault_dup: must be a percentage between 0 and 100 (got -0.5)"
    );
    assert_eq!(
        file_err("bind = \"10.0.0.1\"\nfault_loss = nan", &[]),
        "config: fault_loss: must be a percentage between 0 and 100 (got NaN)"
    );
}

#[test]
fn enum_rules() {
    let b = ["--bind", "10.0.0.1"];
    assert_eq!(
        flag_err(&[&b[..], &["--mode", "Connected"]].concat()),
        "--mode: must be \"connected\" or \"datagram\" (got \"Connected\")"
    );
    assert_eq!(
        file_err("bind = \"10.0.0.1\"\nqp_budget_policy = \"lru\"", &[]),
        "config: qp_budget_policy: must be \"evict\" or \"reject\" (got \"lru\")"
    );
    assert_eq!(
        flag_err(&[&b[..], &["--quirk", "drain-never", "--quirk", "slow"]].concat()),
        "--quirk: unknown quirk \"slow\" (known: drain-never, no-last-wqe, dup-last-wqe, \
         clean-cq-on-destroy, moves-later)"
    );
    assert_eq!(
        file_err("bind = \"10.0.0.1\"\nlog = \"loud\"", &[]),
        "config: log: invalid log filter \"loud\" (use off, error, warn, info, debug, trace or target=level)"
    );
    assert_eq!(
        ok("", &[&b[..], &["--log", "ipoib_cm=trace,warn"]].concat()).log,
        "ipoib_cm=trace,warn"
    );
    assert!(
        flag_err(&[&b[..], &["--log", "=debug"]].concat()).starts_with("--log: invalid log filter")
    );
}

#[test]
fn ifname_and_socket_rules() {
    let b = ["--bind", "10.0.0.1"];
    assert_eq!(
        flag_err(&[&b[..], &["--ifname", "a-very-long-ifname"]].concat()),
        "--ifname: must be at most 15 bytes (got \"a-very-long-ifname\")"
    );
    assert_eq!(
        flag_err(&[&b[..], &["--ifname", ""]].concat()),
        "--ifname: must not be empty"
    );
    for bad in ["ib/0", "..", "ib 0", "ib0:1"] {
        assert_eq!(
            flag_err(&[&b[..], &["--ifname", bad]].concat()),
            format!("--ifname: invalid interface name {bad:?}")
        );
    }
    let long = format!("/{}", "s".repeat(120));
    assert!(flag_err(&[&b[..], &["--control-socket", &long]].concat())
        .starts_with("--control-socket: path is longer than 107 bytes"));
    assert_eq!(
        file_err("bind = \"10.0.0.1\"\ncontrol_socket = \"\"", &[]),
        "config: control_socket: must not be empty"
    );
}

#[test]
fn toml_syntax_error_is_one_line_with_line_number() {
    let e = file_err("bind = \"10.0.0.1\"\n\nmode = \"connected\n", &[]);
    assert!(e.starts_with("config file /x.toml: line 3: "), "{e}");
    assert_eq!(
        file_err("bind = \"10.0.0.1\"\nbind = \"10.0.0.2\"", &[]),
        "config file /x.toml: line 2: bind: duplicate key"
    );
    let e = file_err("bind = = 1", &[]);
    assert!(e.starts_with("config file /x.toml: line 1: "), "{e}");
}

#[test]
fn unknown_key_is_named() {
    assert_eq!(
        file_err("bind = \"10.0.0.1\"\n\nrx_timout = \"5s\"\n", &[]),
        "config file /x.toml: line 3: unknown field \"rx_timout\""
    );
    assert_eq!(
        file_err("[fabric]\nloss = 1\n", &[]),
        "config file /x.toml: line 1: unknown field \"fabric\""
    );
}

#[test]
fn wrong_type_names_the_key() {
    for (text, key) in [
        ("bind = \"10.0.0.1\"\nsrq = \"no\"", "srq"),
        ("bind = \"10.0.0.1\"\nmax_conn_qp = \"64\"", "max_conn_qp"),
        ("bind = \"10.0.0.1\"\naddr = \"198.19.0.1/24\"", "addr"),
        ("bind = \"10.0.0.1\"\nrx_timeout = true", "rx_timeout"),
        ("bind = \"10.0.0.1\"\nfault_loss = \"5\"", "fault_loss"),
        ("bind = 10", "bind"),
    ] {
        let e = file_err(text, &[]);
        let line = text.lines().count();
        assert!(
            e.starts_with(&format!("config file /x.toml: line {line}: ")) && e.contains(key),
            "{text:?}: {e}"
        );
    }
}

#[test]
fn unreadable_file() {
    let e = resolve(
        Some(Path::new("/nonexistent/ipoib.toml")),
        &flags(&["--bind", "10.0.0.1"]),
    )
    .unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }));
    assert_eq!(
        e.to_string(),
        "config file /nonexistent/ipoib.toml: No such file or directory"
    );
}

#[test]
fn real_file_round_trip() {
    let dir = std::env::temp_dir().join(format!("ipoib-cm-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.toml");
    std::fs::write(&path, "bind = \"fd00::1\"\npeer = [\"fd00::2\"]\n").unwrap();
    let c = resolve(Some(&path), &flags(&["--udp-port", "5000"])).unwrap();
    assert!(c.bind.is_ipv6());
    assert_eq!(c.udp_port, 5000);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn link_mtu_to_path_mtu() {
    assert_eq!(path_mtu_for_link_mtu(0), PathMtu::Mtu256);
    assert_eq!(path_mtu_for_link_mtu(1500), PathMtu::Mtu1024);
    assert_eq!(path_mtu_for_link_mtu(2128), PathMtu::Mtu2048);
    assert_eq!(path_mtu_for_link_mtu(2127), PathMtu::Mtu1024);
    assert_eq!(path_mtu_for_link_mtu(4176), PathMtu::Mtu4096);
    assert_eq!(path_mtu_for_link_mtu(65536), PathMtu::Mtu4096);
}

#[test]
fn exit_code_is_two() {
    assert_eq!(ConfigError::EXIT_CODE, 2);
}

#[test]
fn an_address_without_a_prefix_is_a_host_address_as_ip_assumes() {
    let c = ok(
        "addr = [\"2001:db8:19::1\"]",
        &["--bind", "198.18.0.1", "--addr", "198.19.1.1"],
    );
    assert_eq!(c.addr, ["198.19.1.1/32".parse::<Cidr>().unwrap()]);
    let c = ok("bind = \"198.18.0.1\"\naddr = [\"2001:db8:19::1\"]", &[]);
    assert_eq!(c.addr, ["2001:db8:19::1/128".parse::<Cidr>().unwrap()]);
    assert_eq!(c.addr[0].to_string(), "2001:db8:19::1/128");
}

#[test]
fn static_neighbours_parse_and_name_the_field() {
    let hw = "80:00:00:11:00:00:00:00:00:00:00:00:00:00:ff:ff:c6:12:00:02";
    let c = ok(
        "",
        &[
            "--bind",
            "198.18.0.1",
            "--neigh",
            &format!("198.19.0.2={hw}"),
        ],
    );
    assert_eq!(c.neigh.len(), 1);
    assert_eq!(c.neigh[0].0, "198.19.0.2".parse::<IpAddr>().unwrap());
    assert_eq!(c.neigh[0].1.to_string(), hw);
    let from_file = ok(
        &format!("bind = \"198.18.0.1\"\nneigh = [\"2001:db8:19::2={hw}\"]\n"),
        &[],
    );
    assert_eq!(from_file.neigh.len(), 1);
    let e = flag_err(&["--bind", "198.18.0.1", "--neigh", "198.19.0.2"]);
    assert!(e.contains("--neigh"), "{e}");
    let e = file_err("bind = \"198.18.0.1\"\nneigh = [\"x=1:2\"]\n", &[]);
    assert!(e.contains("neigh"), "{e}");
}

#[test]
fn cm_transport_mad_port_and_icrc() {
    use ipoib_cm::daemon::CmTransport;
    let c = ok("", &["--bind", "192.0.2.1"]);
    assert_eq!(c.cm_transport, None);
    assert_eq!(c.mad_port, 4792);
    assert!(c.verify_icrc_v4);
    let c = ok(
        "bind = \"192.0.2.1\"\ncm_transport = \"qp1\"\nmad_port = 5000\nverify_icrc_v4 = false",
        &[],
    );
    assert_eq!(c.cm_transport, Some(CmTransport::Qp1));
    assert_eq!(c.mad_port, 5000);
    assert!(!c.verify_icrc_v4);
    let c = ok(
        "bind = \"192.0.2.1\"\ncm_transport = \"qp1\"",
        &[
            "--cm-transport",
            "udp",
            "--mad-port",
            "6000",
            "--no-icrc-v4",
        ],
    );
    assert_eq!(c.cm_transport, Some(CmTransport::Udp));
    assert_eq!(c.mad_port, 6000);
    assert!(!c.verify_icrc_v4);
    assert_eq!(
        flag_err(&["--bind", "192.0.2.1", "--cm-transport", "tcp"]),
        "--cm-transport: must be \"qp1\", \"udp\", \"umad\" or \"rdmacm\" (got \"tcp\")"
    );
    let c = ok("", &["--bind", "192.0.2.1", "--cm-transport", "rdmacm"]);
    assert_eq!(c.cm_transport, Some(CmTransport::RdmaCm));
    assert_eq!(c.rdma_cm_port, 4793);
    let c = ok("bind = \"192.0.2.1\"\nrdma_cm_port = 7000", &[]);
    assert_eq!(c.rdma_cm_port, 7000);
    assert_eq!(
        file_err("bind = \"10.0.0.1\"\nmad_port = 0", &[]),
        "config: mad_port: must be between 1 and 65535 (got 0)"
    );
}

#[test]
fn rdma_cm_port_reaches_the_endpoint() {
    let c = ok("", &["--bind", "192.0.2.1"]);
    assert_eq!(c.rdma_cm_port, 4793);
    let e = c.endpoint_config(PathMtu::Mtu1024, 1);
    assert_eq!(e.rdma_cm_port, 4793);
    assert_eq!(e.rdma_cm_service_id(), 0x013F_12B9);
    assert!(!e.advertise_rdma_cm && e.listen_ipoib_service);
    let c = ok("bind = \"192.0.2.1\"\nrdma_cm_port = 7000", &[]);
    assert_eq!(c.endpoint_config(PathMtu::Mtu1024, 1).rdma_cm_port, 7000);
    let c = ok(
        "rdma_cm_port = 7000",
        &["--bind", "192.0.2.1", "--rdma-cm-port", "65535"],
    );
    assert_eq!(c.rdma_cm_port, 65535);
    assert_eq!(
        file_err("bind = \"10.0.0.1\"\nrdma_cm_port = 0", &[]),
        "config: rdma_cm_port: must be between 1 and 65535 (got 0)"
    );
    assert_eq!(
        flag_err(&["--bind", "192.0.2.1", "--rdma-cm-port", "65536"]),
        "--rdma-cm-port: must be between 1 and 65535 (got 65536)"
    );
}

#[test]
fn udp_offload_flag_and_key() {
    assert!(ok("", &["--bind", "192.0.2.1"]).udp_offload);
    assert!(!ok("", &["--bind", "192.0.2.1", "--no-udp-offload"]).udp_offload);
    assert!(!ok("bind = \"192.0.2.1\"\nudp_offload = false", &[]).udp_offload);
    assert!(
        !ok(
            "bind = \"192.0.2.1\"\nudp_offload = true",
            &["--no-udp-offload"]
        )
        .udp_offload
    );
    let e = file_err("bind = \"192.0.2.1\"\nudp_offload = \"yes\"", &[]);
    assert!(e.contains("udp_offload"), "{e}");
}

#[test]
fn defaults_are_the_endpoints() {
    let c = ok("", &["--bind", "192.0.2.1"]);
    let e = ipoib_cm::ipoib::EndpointConfig::new(Vec::new());
    assert_eq!(c.qp_timeout, 12);
    assert_eq!(
        (c.mode, c.srq, c.qp_timeout, c.qp_budget_policy),
        (e.mode, e.srq, e.qp_timeout, e.budget_policy)
    );
    assert_eq!(
        (
            c.rx_timeout,
            c.drain_timeout,
            c.tx_stall_timeout,
            c.neigh_timeout
        ),
        (
            e.rx_timeout,
            e.drain_timeout,
            e.tx_stall_timeout,
            e.neigh_timeout
        )
    );
    assert_eq!(
        (
            c.max_conn_qp as usize,
            c.tx_queue_len as usize,
            c.neigh_max as usize
        ),
        (e.max_conn_qp, e.tx_queue_len, e.neigh_max)
    );
    let mapped = c.endpoint_config(PathMtu::Mtu2048, 9);
    assert_eq!(
        mapped,
        ipoib_cm::ipoib::EndpointConfig {
            path_mtu: PathMtu::Mtu2048,
            seed: 9,
            ..e
        }
    );
}

/// The long flags of `ipoib-cm up`, `_` for `-`.
fn up_flag_keys() -> Vec<String> {
    Cli::command()
        .get_arguments()
        .filter_map(|a| a.get_long())
        .map(|l| l.replace('-', "_"))
        .collect()
}

#[test]
fn every_up_flag_is_a_config_key() {
    let keys = Settings::keys();
    let up_flags = up_flag_keys();
    assert!(up_flags.len() > 30, "{up_flags:?}");
    for f in up_flags.iter().filter(|f| *f != "config") {
        assert!(keys.contains(&f.as_str()), "--{f} has no config key");
        // And the file takes it (any error is about its value, not an unknown key).
        if let Err(e) = resolve_str(
            Path::new(P),
            &format!("{f} = 0"),
            &flags(&["--bind", "10.0.0.1"]),
        ) {
            assert!(!e.to_string().contains("unknown field"), "{f}: {e}");
        }
    }
    // The aliases older files use, and nothing else.
    let extra: Vec<_> = keys
        .iter()
        .filter(|k| !up_flags.iter().any(|f| f == *k))
        .collect();
    assert_eq!(
        extra,
        [
            &"verify_icrc_v4",
            &"udp_offload",
            &"srq",
            &"qp_budget_policy"
        ]
    );
}

#[test]
fn readme_settings_table_names_every_flag() {
    let readme = include_str!("../README.md");
    for f in up_flag_keys() {
        let flag = format!("--{}", f.replace('_', "-"));
        assert!(
            readme.contains(&flag),
            "README does not name the flag {flag}"
        );
    }
}

#[test]
fn readme_settings_table_names_every_key() {
    let readme = include_str!("../README.md");
    for k in Settings::keys() {
        assert!(
            readme.contains(&format!("`{k}`")),
            "README does not name the key `{k}`"
        );
    }
}

#[test]
fn switch_flags_are_keys_and_aliases_agree() {
    let c = ok(
        "bind = \"10.0.0.1\"\nno_srq = true\nno_icrc_v4 = true\nno_udp_offload = true\nreject = true",
        &[],
    );
    assert!(!c.srq && !c.verify_icrc_v4 && !c.udp_offload);
    assert_eq!(c.qp_budget_policy, QpBudgetPolicy::Reject);
    let c = ok("bind = \"10.0.0.1\"\nno_srq = false\nevict = true", &[]);
    assert!(c.srq);
    assert_eq!(c.qp_budget_policy, QpBudgetPolicy::Evict);
    // An alias that says the same is fine; one that says otherwise is named.
    assert!(!ok("bind = \"10.0.0.1\"\nno_srq = true\nsrq = false", &[]).srq);
    assert_eq!(
        file_err("bind = \"10.0.0.1\"\nno_srq = true\nsrq = true", &[]),
        "config: no_srq: contradicts srq"
    );
    assert_eq!(
        file_err(
            "bind = \"10.0.0.1\"\nreject = true\nqp_budget_policy = \"evict\"",
            &[]
        ),
        "config: reject: contradicts qp_budget_policy"
    );
    // The flag wins over the file's policy keys.
    let c = ok("bind = \"10.0.0.1\"\nreject = true", &["--evict"]);
    assert_eq!(c.qp_budget_policy, QpBudgetPolicy::Evict);
}

#[test]
fn provider_and_ib_dev_are_flags_and_keys() {
    let c = ok("", &["--bind", "10.0.0.1"]);
    assert_eq!(
        (c.provider, c.ib_dev.as_deref()),
        (ProviderKind::Soft, None)
    );
    let c = ok(
        "bind = \"10.0.0.1\"\nprovider = \"verbs\"\nib_dev = \"rxe0\"",
        &[],
    );
    assert_eq!(
        (c.provider, c.ib_dev.as_deref()),
        (ProviderKind::Verbs, Some("rxe0"))
    );
    let c = ok(
        "bind = \"10.0.0.1\"\nprovider = \"verbs\"",
        &["--provider", "soft", "--ib-dev", "mlx5_0"],
    );
    assert_eq!(
        (c.provider, c.ib_dev.as_deref()),
        (ProviderKind::Soft, Some("mlx5_0"))
    );
    assert_eq!(
        flag_err(&["--bind", "10.0.0.1", "--provider", "hw"]),
        "--provider: must be \"soft\" or \"verbs\" (got \"hw\")"
    );
    assert_eq!(
        file_err("bind = \"10.0.0.1\"\nib_dev = \"\"", &[]),
        "config: ib_dev: must not be empty"
    );
}

#[test]
fn metrics_listen_is_a_flag_and_a_key_and_off_by_default() {
    let c = ok("", &["--bind", "10.0.0.1"]);
    assert_eq!(c.metrics_listen, None);
    let c = ok(
        "bind = \"10.0.0.1\"\nmetrics_listen = \"127.0.0.1:9464\"",
        &[],
    );
    assert_eq!(c.metrics_listen, Some("127.0.0.1:9464".parse().unwrap()));
    let c = ok(
        "bind = \"10.0.0.1\"\nmetrics_listen = \"127.0.0.1:9464\"",
        &["--metrics-listen", "[::1]:9100"],
    );
    assert_eq!(c.metrics_listen, Some("[::1]:9100".parse().unwrap()));
    assert_eq!(
        flag_err(&["--bind", "10.0.0.1", "--metrics-listen", "9464"]),
        "--metrics-listen: invalid address \"9464\": expected ADDR:PORT, [IPv6]:PORT for IPv6"
    );
}

#[test]
fn every_flag_has_its_help_from_the_settings_doc() {
    for a in Cli::command().get_arguments() {
        let help = a.get_help().map(ToString::to_string).unwrap_or_default();
        assert!(
            !help.trim().is_empty(),
            "--{} has no doc",
            a.get_long().unwrap_or_default()
        );
    }
}

#[test]
fn flags_lay_over_the_file_field_by_field() {
    let file = parse_config_file(
        Path::new(P),
        "mode = \"datagram\"\naddr = [\"198.19.0.1/24\", \"fd00::1/64\"]\nquirk = [\"drain-never\"]",
    )
    .unwrap();
    let merged = flags(&["--addr", "198.19.1.1/16", "--max-conn-qp", "7"]).over(file.clone());
    assert_eq!(
        merged.mode, file.mode,
        "a flag not given leaves the file's key"
    );
    assert_eq!(merged.quirk, file.quirk);
    assert_eq!(
        merged.addr.len(),
        1,
        "a repeatable flag replaces the file's list"
    );
    assert!(merged.max_conn_qp.is_some());
    assert_eq!(flags(&[]).over(file.clone()), file);
}

#[test]
fn switch_flags_take_no_value() {
    for f in [
        "--no-srq",
        "--no-icrc-v4",
        "--no-udp-offload",
        "--evict",
        "--reject",
    ] {
        assert!(
            Cli::try_parse_from(["up", &format!("{f}=false")]).is_err(),
            "{f}"
        );
        assert!(Cli::try_parse_from(["up", f]).is_ok(), "{f}");
    }
}

#[test]
fn file_aliases_must_agree_even_under_a_flag() {
    assert_eq!(
        file_err(
            "bind = \"10.0.0.1\"\nno_icrc_v4 = true\nverify_icrc_v4 = true",
            &["--no-icrc-v4"]
        ),
        "config: no_icrc_v4: contradicts verify_icrc_v4"
    );
    assert_eq!(
        file_err(
            "bind = \"10.0.0.1\"\nno_udp_offload = false\nudp_offload = false",
            &[]
        ),
        "config: no_udp_offload: contradicts udp_offload"
    );
}

#[test]
fn path_mtu_parse_is_shared_with_the_tools() {
    assert_eq!(parse_path_mtu("4096"), Ok(PathMtu::Mtu4096));
    assert_eq!(
        parse_path_mtu("1500").unwrap_err().to_string(),
        "must be 256, 512, 1024, 2048 or 4096 (got \"1500\")"
    );
}

#[test]
fn peer_and_static_neighbour_lists_are_bounded() {
    let peers: Vec<String> = (0..=1024)
        .map(|i| format!("\"198.18.{}.{}\"", 1 + i / 250, 1 + i % 250))
        .collect();
    let text = format!("bind = \"198.18.0.1\"\npeer = [{}]\n", peers.join(", "));
    assert_eq!(file_err(&text, &[]), "config: peer: more than 1024 peers");
    let ok_text = format!(
        "bind = \"198.18.0.1\"\npeer = [{}]\n",
        peers[..1024].join(", ")
    );
    assert_eq!(ok(&ok_text, &[]).peer.len(), 1024);

    let hw = "80:00:00:48:fe:80:00:00:00:00:00:00:00:00:00:00:c6:12:00:02";
    let mut args = vec!["--bind".to_owned(), "198.18.0.1".to_owned()];
    for i in 0..=4096u32 {
        args.push("--neigh".to_owned());
        args.push(format!("198.19.{}.{}={hw}", i / 256, i % 256));
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(flag_err(&refs), "--neigh: more than 4096 static neighbours");
}

#[test]
fn multicast_flag_and_key() {
    let c = ok("", &["--bind", "192.0.2.1"]);
    assert!(c.multicast, "on by default");
    assert_eq!(c.multicast_ttl, 1);
    assert!(!ok("", &["--bind", "192.0.2.1", "--no-multicast"]).multicast);
    let c = ok(
        "bind = \"192.0.2.1\"\nno_multicast = true\nmulticast_ttl = 8",
        &[],
    );
    assert!(!c.multicast);
    assert_eq!(c.multicast_ttl, 8);
    assert_eq!(
        ok(
            "multicast_ttl = 8",
            &["--bind", "192.0.2.1", "--multicast-ttl", "2"]
        )
        .multicast_ttl,
        2
    );
    assert_eq!(
        flag_err(&["--bind", "192.0.2.1", "--multicast-ttl", "0"]),
        "--multicast-ttl: must be between 1 and 255 (got 0)"
    );
    assert_eq!(
        file_err("bind = \"10.0.0.1\"\nmulticast_ttl = 256", &[]),
        "config: multicast_ttl: must be between 1 and 255 (got 256)"
    );
}

/// `--reorder-hold` / `reorder_hold`: 1,024 held packets by default, 0 (rxe's drop) to 65536.
#[test]
fn reorder_hold_flag_and_key() {
    let c = ok("", &["--bind", "192.0.2.1"]);
    assert_eq!(c.reorder_hold, ipoib_cm::soft::DEFAULT_REORDER_HOLD_PACKETS);
    assert_eq!(
        ok("bind = \"192.0.2.1\"\nreorder_hold = 0", &[]).reorder_hold,
        0
    );
    assert_eq!(
        ok(
            "reorder_hold = 0",
            &["--bind", "192.0.2.1", "--reorder-hold", "64"]
        )
        .reorder_hold,
        64
    );
    assert_eq!(
        flag_err(&["--bind", "192.0.2.1", "--reorder-hold", "65537"]),
        "--reorder-hold: must be between 0 and 65536 (got 65537)"
    );
}

/// `--pkey` / `pkey`: hex or decimal, limited membership allowed, low 15 bits zero refused;
/// it reaches the endpoint's configuration.
#[test]
fn pkey_rules() {
    use ipoib_cm::verbs::PKey;
    let b = ["--bind", "192.0.2.1"];
    assert_eq!(ok("", &b).pkey, PKey::DEFAULT);
    assert_eq!(
        ok("", &[&b[..], &["--pkey", "0x8001"]].concat()).pkey,
        PKey(0x8001)
    );
    assert_eq!(
        ok("", &[&b[..], &["--pkey", "32770"]].concat()).pkey,
        PKey(0x8002)
    );
    assert_eq!(
        ok("", &[&b[..], &["--pkey", "0x0001"]].concat()).pkey,
        PKey(0x0001)
    );
    let file = ok("bind = \"192.0.2.1\"\npkey = 0x7fff\n", &[]);
    assert_eq!(file.pkey, PKey(0x7FFF));
    assert_eq!(file.endpoint_config(PathMtu::Mtu2048, 1).pkey, PKey(0x7FFF));
    assert_eq!(
        ok(
            "bind = \"192.0.2.1\"\npkey = 0x8001\n",
            &["--pkey", "0x8002"]
        )
        .pkey,
        PKey(0x8002)
    );
    for bad in ["0", "0x8000", "0x10000", "-1", "partition"] {
        let e = flag_err(&[&b[..], &["--pkey", bad]].concat());
        assert!(e.contains("pkey") && e.contains("P_Key"), "{bad}: {e}");
    }
    for bad in ["0", "32768", "65536", "-5"] {
        let e = file_err(&format!("bind = \"192.0.2.1\"\npkey = {bad}\n"), &[]);
        assert!(e.contains("pkey") && e.contains("P_Key"), "{bad}: {e}");
    }
    let e = file_err("bind = \"192.0.2.1\"\npkey = \"0x8001\"\n", &[]);
    assert!(e.contains("pkey"), "{e}");
}

/// The configuration file is read without waiting on anything but its bytes: a FIFO (with no
/// writer), a device, a directory or an oversized file there is refused at once with one line,
/// also behind a symlink.
#[test]
fn only_a_regular_file_of_bounded_size_is_read() {
    use ipoib_cm::daemon::config::{read_config_text, MAX_CONFIG_BYTES};
    let dir = std::env::temp_dir().join(format!("ipoib-cm-readcfg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    let link = dir.join("link.toml");
    let big = dir.join("big.toml");
    std::fs::write(&big, vec![b'#'; MAX_CONFIG_BYTES as usize + 1]).unwrap();
    let good = dir.join("good.toml");
    std::fs::write(&good, "bind = \"198.18.0.1\"\n").unwrap();
    let err = |p: &Path| read_config_text(p).unwrap_err().to_string();
    if made.is_ok_and(|s| s.success()) {
        let t0 = std::time::Instant::now();
        assert!(
            err(&fifo).ends_with(": not a regular file"),
            "{}",
            err(&fifo)
        );
        std::os::unix::fs::symlink(&fifo, &link).unwrap();
        assert!(
            err(&link).ends_with(": not a regular file"),
            "{}",
            err(&link)
        );
        assert!(t0.elapsed() < Duration::from_secs(5), "waited on the FIFO");
    }
    assert!(err(Path::new("/dev/zero")).ends_with(": not a regular file"));
    assert!(err(&dir).ends_with(": not a regular file"));
    assert!(err(&big).ends_with(&format!(": longer than {MAX_CONFIG_BYTES} bytes")));
    assert_eq!(read_config_text(&good).unwrap(), "bind = \"198.18.0.1\"\n");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The receive-side sizes and the send-side retry counts reach the endpoint.
#[test]
fn srq_depth_rx_spare_and_tx_retries_reach_the_endpoint() {
    let c = ok(
        "bind = \"10.0.0.1\"\nsrq_depth = 1024\nrx_spare = 1",
        &["--tx-rnr-retry", "0", "--tx-retry-count", "0"],
    );
    let e = c.endpoint_config(PathMtu::Mtu1024, 0);
    assert_eq!(
        (e.srq_depth, e.rx_spare, e.tx_rnr_retry, e.tx_retry_count),
        (1024, 1, 0, 0)
    );
    // Without a spare no received packet could go up: each would wait for a buffer that only
    // its own delivery frees.
    assert_eq!(
        file_err("bind = \"10.0.0.1\"\nrx_spare = 0", &[]),
        "config: rx_spare: must be between 1 and 65536 (got 0)"
    );
    let d = ok("bind = \"10.0.0.1\"", &[]).endpoint_config(PathMtu::Mtu1024, 0);
    assert_eq!(
        (d.srq_depth, d.rx_spare, d.tx_rnr_retry, d.tx_retry_count),
        (256, 256, 7, 7)
    );
}
