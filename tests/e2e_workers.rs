//! An interface carried by several workers (`--workers N`), in labs of network namespaces built
//! by `scripts/lab.sh`: real multi-queue TUN devices, steered sockets, ping and iperf3. Without
//! root each test prints `skipped: ...` and passes. Every wait is bounded.

mod common;

use std::process::Command;
use std::time::Duration;

use common::lab::{Lab, BIN};

/// The `workers` array of node `k`'s status, once every worker has reported.
fn workers(lab: &Lab, k: usize, count: usize) -> Vec<serde_json::Value> {
    let mut last = Vec::new();
    lab.wait_for(Duration::from_secs(3), |l| {
        last = l.status(k)["workers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        last.len() == count && last.iter().all(|w| w["cpu_seconds"].as_f64() > Some(0.0))
    });
    assert_eq!(last.len(), count, "{last:?}");
    last
}

fn field(w: &serde_json::Value, name: &str) -> u64 {
    w[name]
        .as_u64()
        .unwrap_or_else(|| panic!("no {name} in {w}"))
}

/// iperf3's out-of-order count of every UDP stream of a report.
fn out_of_order(report: &serde_json::Value) -> Vec<u64> {
    report["end"]["streams"]
        .as_array()
        .map(|streams| {
            streams
                .iter()
                .map(|s| s["udp"]["out_of_order"].as_u64().unwrap_or(u64::MAX))
                .collect()
        })
        .unwrap_or_default()
}

/// Two nodes of two workers each: ping (IPv4, IPv6, 60,000 bytes) with nothing lost, four
/// TCP streams carried by both workers of both nodes, UDP streams with nothing out of order;
/// the status sums the workers and shows each.
#[test]
fn two_workers_carry_the_interface_together() {
    let Some(lab) = Lab::up("e2ew", 2, &["--workers", "2"]) else {
        return;
    };
    lab.ping_ok(1, "198.19.0.2", &[]);
    lab.ping_ok(2, "2001:db8:19::1", &[]);
    lab.ping_ok(1, "198.19.0.2", &["-s", "60000"]);
    let received = common::lab::ping_received(lab.start_ping(1, "198.19.0.2", 50));
    assert_eq!(received, 50, "{}", lab.log(1));

    // The kernel puts a flow on a TUN queue by its hash, so four streams all land on one of
    // two workers one run in eight: a run that left a worker without its share is followed
    // by another (new ports, new hashes), at most three in all; the counts add up.
    let carried =
        |w: &serde_json::Value| field(w, "tx_packets") > 1000 && field(w, "rx_packets") > 1000;
    for _ in 0..3 {
        let Some(tcp) = lab.iperf3(1, 2, "198.19.0.2", &["-t", "3", "-P", "4"]) else {
            println!("skipped: the iperf3 part (not installed)");
            return;
        };
        let bps = tcp["end"]["sum_received"]["bits_per_second"].as_f64();
        assert!(bps > Some(1e8), "{tcp}");
        if [1, 2]
            .iter()
            .all(|&k| workers(&lab, k, 2).iter().all(carried))
        {
            break;
        }
    }
    for k in [1, 2] {
        for w in workers(&lab, k, 2) {
            assert!(
                carried(&w),
                "node {k}: a worker carried no share of four streams: {w}"
            );
        }
    }
    let udp = lab
        .iperf3(
            1,
            2,
            "198.19.0.2",
            &["-u", "-b", "200M", "-t", "3", "-P", "4"],
        )
        .expect("iperf3");
    let ooo = out_of_order(&udp);
    assert_eq!(ooo, [0, 0, 0, 0], "{udp}");

    // The totals are the workers' sums.
    let s = lab.status(1);
    let ws = s["workers"].as_array().cloned().unwrap_or_default();
    let sum = |name: &str| ws.iter().map(|w| field(w, name)).sum::<u64>();
    assert!(s["tx_packets"].as_u64() >= Some(sum("tx_packets")), "{s}");
    assert_eq!(
        s["tx"].as_array().map(Vec::len),
        Some(usize::try_from(sum("tx_conns")).unwrap_or(0)),
        "{s}"
    );
    // The human view has a line per worker; the exposition a sample per worker.
    let text = status_text(&lab, 1, &[]);
    assert!(
        text.contains("  worker 0: rx ") && text.contains("  worker 1: rx "),
        "{text}"
    );
    let prom = status_text(&lab, 1, &["--prometheus"]);
    assert!(
        prom.contains("ipoib_cm_worker_tx_packets_total{ifname=\"ib0\",worker=\"1\"}"),
        "{prom}"
    );
    assert!(!lab.log(1).contains("ERROR"), "{}", lab.log(1));
}

/// `ipoib-cm status ARGS` on node `k`.
fn status_text(lab: &Lab, k: usize, args: &[&str]) -> String {
    let socket = lab.socket(k);
    let mut cmd = vec![BIN, "status", "--control-socket"];
    let socket = socket.to_string_lossy().into_owned();
    cmd.push(&socket);
    cmd.extend_from_slice(args);
    let out = lab.exec(k, &cmd, Duration::from_secs(10));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Four workers a node, eight UDP flows each way: every flow stays on one connection, so
/// none arrives out of order.
#[test]
fn four_workers_keep_every_flow_in_order() {
    let Some(lab) = Lab::up("e2ew4", 2, &["--workers", "4"]) else {
        return;
    };
    lab.ping_ok(1, "198.19.0.2", &[]);
    let Some(udp) = lab.iperf3(
        1,
        2,
        "198.19.0.2",
        &["-u", "-b", "50M", "-t", "3", "-P", "8"],
    ) else {
        println!("skipped: iperf3 not installed");
        return;
    };
    assert_eq!(out_of_order(&udp), [0; 8], "{udp}");
    let back = lab
        .iperf3(
            1,
            2,
            "198.19.0.2",
            &["-u", "-b", "50M", "-t", "3", "-P", "8", "-R"],
        )
        .expect("iperf3");
    assert_eq!(out_of_order(&back), [0; 8], "{back}");
    let busy = workers(&lab, 2, 4)
        .iter()
        .filter(|w| field(w, "rx_packets") > 100)
        .count();
    assert!(busy >= 2, "eight flows landed on {busy} of 4 workers");
}

/// A node of two workers and one of one (a peer that opens one connection, as an older
/// daemon): they reach each other both ways; the one-worker node's packets arrive on one
/// connection, and the two-worker node sends to it from each worker (it advertises 0x10).
#[test]
fn two_workers_meet_one() {
    let Some(lab) = Lab::up("e2ew1", 2, &[]) else {
        return;
    };
    let out = lab.sh(&["stop", "1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = lab.sh(&["start", "1", "--", "--workers", "2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lab.ping_ok(1, "198.19.0.2", &[]);
    lab.ping_ok(2, "198.19.0.1", &["-s", "60000"]);
    if let Some(tcp) = lab.iperf3(2, 1, "198.19.0.1", &["-t", "2", "-P", "4"]) {
        assert!(tcp["end"]["sum_received"]["bits_per_second"].as_f64() > Some(1e8));
        let back = lab
            .iperf3(1, 2, "198.19.0.2", &["-t", "2", "-P", "4"])
            .expect("iperf3");
        assert!(back["end"]["sum_received"]["bits_per_second"].as_f64() > Some(1e8));
    }
    assert_eq!(workers(&lab, 2, 1).len(), 1);
    assert!(!lab.log(1).contains("ERROR"), "{}", lab.log(1));
}

/// A peer whose hardware address lacks `0x10` (Linux `ipoib_cm`, older daemons of ours)
/// gets one connection from a node of two workers: control's, which carries the packets the
/// other worker reads for it.
#[test]
fn a_peer_that_takes_one_connection_gets_one() {
    let Some(lab) = Lab::up("e2ew0", 2, &[]) else {
        return;
    };
    let hw = lab.status(2)["interface"]["hwaddr"]
        .as_str()
        .expect("hwaddr")
        .to_owned();
    let (flags, rest) = hw.split_once(':').expect("hwaddr");
    assert_eq!(flags, "90", "{hw}");
    let linux_like = format!("198.19.0.2={}", ["80", rest].join(":"));
    let out = lab.sh(&["stop", "1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = lab.sh(&["start", "1", "--", "--workers", "2", "--neigh", &linux_like]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lab.ping_ok(1, "198.19.0.2", &[]);
    if lab
        .iperf3(1, 2, "198.19.0.2", &["-t", "2", "-P", "4"])
        .is_none()
    {
        println!("skipped: the iperf3 part (not installed)");
    }
    let ws = workers(&lab, 1, 2);
    let tx: Vec<u64> = ws.iter().map(|w| field(w, "tx_conns")).collect();
    assert_eq!(tx, [1, 0], "{ws:?}");
    assert!(!lab.log(1).contains("ERROR"), "{}", lab.log(1));
}

/// A worker thread that panics, or stops turning, ends the daemon with exit status 1 and one
/// line naming it (the service manager restarts it), rather than leave its connections
/// unserved (`--fault-worker`: 2 s after start).
#[test]
fn a_failed_worker_ends_the_daemon() {
    let Some(lab) = Lab::up("e2ewf", 2, &["--workers", "2"]) else {
        return;
    };
    for (fault, says, within) in [
        (
            "panic",
            "ipoib-cm up: worker 1: panicked",
            Duration::from_secs(10),
        ),
        (
            "stall",
            "ipoib-cm up: worker 1: stalled",
            Duration::from_secs(25),
        ),
    ] {
        assert!(lab.sh(&["kill", "2"]).status.success());
        std::thread::sleep(Duration::from_millis(300));
        let out = lab.sh(&["start", "2", "--", "--fault-worker", fault]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ended = lab.wait_for(within, |l| {
            let log = l.log(2);
            log.contains(says) && log.contains("ipoib-cm exited with status 1")
        });
        assert!(ended, "{fault}: {}", lab.log(2));
    }
}

/// Sends `sig` to node `k`'s daemon (by the pid the lab recorded).
fn signal(lab: &Lab, k: usize, sig: &str) {
    let pid = std::fs::read_to_string(lab.state.join(format!("node{k}.pid"))).expect("pid file");
    let st = Command::new("kill")
        .args([sig, pid.trim()])
        .status()
        .expect("kill");
    assert!(st.success(), "kill {sig} {pid}");
}

/// A pause of the whole process (SIGSTOP, a frozen cgroup, a debugger, a migrated VM) longer
/// than the stall limit is no stall of a worker: after SIGCONT the daemon goes on, and its
/// traffic with it, on both workers' connections.
#[test]
fn a_paused_daemon_is_not_taken_for_a_stalled_worker() {
    let Some(lab) = Lab::up("e2ewp", 2, &["--workers", "2"]) else {
        return;
    };
    lab.ping_ok(1, "198.19.0.2", &[]);
    signal(&lab, 2, "-STOP");
    // Longer than the stall limit (10 s).
    std::thread::sleep(Duration::from_secs(13));
    signal(&lab, 2, "-CONT");
    std::thread::sleep(Duration::from_secs(2));
    let log = lab.log(2);
    assert!(
        !log.contains("stalled") && !log.contains("exited with status"),
        "{log}"
    );
    lab.ping_ok(1, "198.19.0.2", &[]);
    lab.ping_ok(2, "198.19.0.1", &[]);
    let log = lab.log(2);
    assert!(!log.contains("exited with status"), "{log}");
}

/// SIGTERM while a worker thread is stuck (`--fault-worker stall`: 2 s after start, for a
/// minute): the daemon ends within its drain and 2 s more, exit status 1 and one line naming
/// the worker, rather than wait for the thread.
#[test]
fn shutdown_does_not_wait_for_a_stuck_worker() {
    let Some(lab) = Lab::up("e2ews", 2, &["--workers", "2", "--drain-timeout", "1s"]) else {
        return;
    };
    assert!(lab.sh(&["kill", "2"]).status.success());
    std::thread::sleep(Duration::from_millis(300));
    let out = lab.sh(&["start", "2", "--", "--fault-worker", "stall"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The stall begins 2 s after start.
    std::thread::sleep(Duration::from_secs(3));
    // The log holds the killed daemon's end already.
    let exits = |l: &Lab| l.log(2).matches("ipoib-cm exited with status").count();
    let before = exits(&lab);
    let t0 = std::time::Instant::now();
    signal(&lab, 2, "-TERM");
    let ended = lab.wait_for(Duration::from_secs(10), |l| exits(l) > before);
    let took = t0.elapsed();
    let log = lab.log(2);
    assert!(ended, "{log}");
    assert!(
        log.contains("worker 1: did not end within 3s of the shutdown")
            && log.trim_end().ends_with("ipoib-cm exited with status 1"),
        "{log}"
    );
    println!(
        "ended {:.1} s after SIGTERM with worker 1 stuck",
        took.as_secs_f64()
    );
    assert!(took < Duration::from_secs(6), "{took:?}");
}

/// A second daemon for the interface, bind address, port and control socket of a running one
/// (a multi-queue TUN lets a second opener attach a queue, `SO_REUSEPORT` a second socket
/// bind the port) is refused in one line, exit 2, whatever its worker count; the first goes
/// on undisturbed.
#[test]
fn a_second_daemon_for_a_running_interface_is_refused() {
    let Some(lab) = Lab::up("e2ew2", 2, &["--workers", "2"]) else {
        return;
    };
    lab.ping_ok(2, "198.19.0.1", &[]);
    let sock = lab.socket(1);
    let sock = sock.to_string_lossy();
    for workers in ["2", "1", "4"] {
        let out = lab.exec(
            1,
            &[
                BIN,
                "up",
                "--ifname",
                "ib0",
                "--addr",
                "198.19.0.1/24",
                "--bind",
                "198.18.0.1",
                "--peer",
                "198.18.0.2",
                "--control-socket",
                &sock,
                "--workers",
                workers,
            ],
            Duration::from_secs(10),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--workers {workers}: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| l.contains("ERROR")).collect();
        assert_eq!(lines.len(), 1, "{err}");
        assert!(
            lines[0].contains("in use") || lines[0].contains("exists"),
            "{err}"
        );
    }
    lab.ping_ok(2, "198.19.0.1", &[]);
    lab.ping_ok(1, "198.19.0.2", &[]);
    assert!(!lab.log(1).contains("exited with status"), "{}", lab.log(1));
}

/// What `--workers` does not run with is refused at start, in one line, exit 2.
#[test]
fn a_worker_count_that_cannot_run_is_refused_in_one_line() {
    for (args, says) in [
        (
            &["--workers", "3"][..],
            "--workers: 3 workers: must be a power of two",
        ),
        (
            &["--workers", "128"][..],
            "--workers: 128 workers: must be a power of two",
        ),
        (
            &["--workers", "2", "--mode", "datagram"][..],
            "--workers 2: needs connected mode",
        ),
        (
            &[
                "--workers",
                "2",
                "--cm-transport",
                "udp",
                "--mode",
                "datagram",
            ][..],
            "--workers 2: needs connected mode",
        ),
    ] {
        let out = Command::new(BIN)
            .args(["up", "--bind", "127.0.0.1", "--ifname", "ibw0"])
            .args(args)
            .output()
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}
