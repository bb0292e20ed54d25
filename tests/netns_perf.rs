//! `ipoib-cm perf` between two network namespaces, over real UDP sockets.
//!
//! - `--bw -s 65536 -n 2000` and `--lat -s 64 -n 2000` exit 0 on both sides and end with a
//!   JSON line whose figures add up (bytes = size × iters) and are positive and plausible.
//! - `--bw` with 5% injected loss on both sides still delivers every message.
//!
//! Each test builds its own namespaces (198.18.0.0/24, MTU 9000) and removes them; without
//! root they print `skipped: ...` and pass.

mod common;

use std::time::Duration;

use common::netns::{server_and_client, Lab};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_ipoib-cm");

/// Runs `perf args --json` as server (node 1) and client (node 2); returns the JSON objects
/// of their last lines (server, client) and their whole outputs.
fn perf(lab: &Lab, args: &[&str]) -> ((Value, Value), (String, String)) {
    let mut cmd = vec![BIN, "perf", "--json", "--deadline", "20"];
    cmd.extend_from_slice(args);
    let (server, client) = server_and_client(lab, &cmd, &cmd, Duration::from_secs(30));
    let json = |out: &str| -> Value {
        let last = out.lines().last().unwrap_or_default();
        serde_json::from_str(last).unwrap_or_else(|e| panic!("last line is not JSON ({e}): {out}"))
    };
    ((json(&server), json(&client)), (server, client))
}

fn num(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

/// The checks every bandwidth run passes on both sides.
fn check_bw(v: &Value, side: &str, size: u64, iters: u64) {
    assert_eq!(v["mode"], "bw", "{v}");
    assert_eq!(v["side"], side, "{v}");
    assert_eq!(v["size"], size, "{v}");
    assert_eq!(v["iters"], iters, "{v}");
    assert_eq!(v["bytes"], size * iters, "{v}");
    let (secs, gbit, mps) = (num(v, "seconds"), num(v, "gbit_s"), num(v, "msg_per_s"));
    assert!(secs > 0.0 && secs < 20.0, "{v}");
    // Over a veth, a software provider: more than 10 Mbit/s, less than 1 Tbit/s.
    assert!(gbit > 0.01 && gbit < 1000.0, "{v}");
    let want = (size * iters) as f64 * 8.0 / secs / 1e9;
    assert!((gbit - want).abs() < want * 1e-6, "{v}");
    assert!((mps - iters as f64 / secs).abs() < mps * 1e-6, "{v}");
    assert!(
        v["lat_p50_us"].is_null() && v["lat_avg_us"].is_null(),
        "{v}"
    );
}

#[test]
fn bw_streams_two_thousand_64k_messages() {
    let lab = crate::lab_or_skip!("ipcmpf", 2, 9000);
    let ((server, client), (text, _)) = perf(&lab, &["--bw", "-s", "65536", "-n", "2000"]);
    println!("{text}");
    check_bw(&server, "server", 65536, 2000);
    check_bw(&client, "client", 65536, 2000);
}

#[test]
fn lat_ping_pongs_two_thousand_small_messages() {
    let lab = crate::lab_or_skip!("ipcmpf", 2, 9000);
    let ((server, client), (_, text)) = perf(&lab, &["--lat", "-s", "64", "-n", "2000"]);
    println!("{text}");
    for (v, side, samples) in [(&server, "server", 1999), (&client, "client", 2000)] {
        assert_eq!(v["mode"], "lat", "{v}");
        assert_eq!(v["side"], side, "{v}");
        assert_eq!(v["bytes"], 64 * 2000, "{v}");
        assert_eq!(v["lat_samples"], samples, "{v}");
        assert!(v["gbit_s"].is_null() && v["msg_per_s"].is_null(), "{v}");
        let (p50, p99, max, avg) = (
            num(v, "lat_p50_us"),
            num(v, "lat_p99_us"),
            num(v, "lat_max_us"),
            num(v, "lat_avg_us"),
        );
        // One way over a veth: more than a microsecond, less than 10 ms at the median.
        assert!(p50 > 1.0 && p50 < 10_000.0, "{v}");
        assert!(p50 <= p99 && p99 <= max && avg <= max, "{v}");
        // 2000 round trips take at least 2 × 2000 one-way trips.
        assert!(num(v, "seconds") * 1e6 >= avg * 2.0 * 1999.0, "{v}");
    }
}

#[test]
fn bw_completes_every_message_under_five_percent_loss() {
    let lab = crate::lab_or_skip!("ipcmpf", 2, 9000);
    let ((server, client), (srv_text, cli_text)) = perf(
        &lab,
        &[
            "--bw",
            "-s",
            "65536",
            "-n",
            "1000",
            "--qp-timeout",
            "10",
            "--fault-loss",
            "5",
            "--fault-seed",
            "3",
            "--stats",
        ],
    );
    check_bw(&server, "server", 65536, 1000);
    check_bw(&client, "client", 65536, 1000);
    let stat = |out: &str, key: &str| -> u64 {
        let line = out
            .lines()
            .find(|l| l.starts_with("soft-rc:"))
            .unwrap_or_else(|| panic!("no stats line: {out}"));
        println!("{line}");
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {line}"))
    };
    // 1000 messages of 16 packets: 5% of the client's is ~800 lost, all made good.
    assert!(stat(&cli_text, "injected_loss") > 200, "{cli_text}");
    assert!(stat(&cli_text, "retransmits") > 0, "{cli_text}");
    assert!(stat(&srv_text, "rx_out_of_sequence") > 0, "{srv_text}");
}
