//! What an operator reads: the log lines of a two-node run (start-up, connections, a peer
//! SIGKILLed and reaped, its restart, shutdown) and the totals of the status document, and that
//! a burst of one kind of event writes a bounded number of lines, in labs of network
//! namespaces built by `scripts/lab.sh`. Without root the tests print `skipped: ...`
//! and pass. Every wait is bounded.

mod common;

use std::time::{Duration, Instant};

use common::lab::Lab;

/// The lines of node `k`'s log that contain every one of `parts`.
fn lines_with(lab: &Lab, k: usize, parts: &[&str]) -> Vec<String> {
    lab.log(k)
        .lines()
        .filter(|l| parts.iter().all(|p| l.contains(p)))
        .map(str::to_owned)
        .collect()
}

/// Waits up to `limit` for a line of node `k`'s log with every one of `parts`.
fn wait_line(lab: &Lab, k: usize, parts: &[&str], limit: Duration) -> String {
    let found = lab.wait_for(limit, |l| !lines_with(l, k, parts).is_empty());
    assert!(
        found,
        "no line with {parts:?} in node {k}'s log:\n{}",
        lab.log(k)
    );
    lines_with(lab, k, parts).remove(0)
}

fn total(s: &serde_json::Value, name: &str) -> u64 {
    s[name]
        .as_u64()
        .unwrap_or_else(|| panic!("no top-level {name} in {s}"))
}

#[test]
fn a_two_node_run_explains_itself() {
    let args = [
        "--rx-timeout",
        "2s",
        "--neigh-timeout",
        "3s",
        "--drain-timeout",
        "1s",
    ];
    let Some(lab) = Lab::up("e2el", 2, &args) else {
        return;
    };
    let start = wait_line(&lab, 1, &["started"], Duration::from_secs(5));
    for part in [
        "INFO",
        concat!("version=", env!("CARGO_PKG_VERSION")),
        "ifname=ib0",
        "bind=198.18.0.1:4791",
        "peers=198.18.0.2",
        "mode=connected",
        "srq=true",
        "cm_transport=qp1",
        "control_socket=",
        // No SA on the software provider (RoCEv2): nothing of the SA client runs.
        "sa=none (RoCE)",
    ] {
        assert!(
            start.contains(part),
            "{part:?} not in the start-up line: {start}"
        );
    }

    // Five pings to an address nobody answers: five packets dropped, counted once each.
    let before = lab.status(1);
    let out = lab.exec(
        1,
        &[
            "ping",
            "-n",
            "-c",
            "5",
            "-i",
            "0.2",
            "-W",
            "1",
            "198.19.0.99",
        ],
        Duration::from_secs(20),
    );
    assert!(!out.status.success(), "someone answered 198.19.0.99");
    let dropped = lab.wait_for(Duration::from_secs(10), |l| {
        total(&l.status(1), "tx_dropped") >= total(&before, "tx_dropped") + 5
    });
    let after = lab.status(1);
    assert!(dropped, "before {before}\nafter {after}");
    assert_eq!(
        total(&after, "tx_dropped") - total(&before, "tx_dropped"),
        5,
        "{}",
        after["drops"]
    );
    wait_line(
        &lab,
        1,
        &["INFO", "neighbour failed peer=198.19.0.99", "dropped="],
        Duration::from_secs(5),
    );
    let link = lab.exec(
        1,
        &["ip", "-s", "-j", "link", "show", "ib0"],
        Duration::from_secs(10),
    );
    let link: serde_json::Value = serde_json::from_slice(&link.stdout).unwrap_or_default();
    println!(
        "five pings to nowhere: daemon tx_dropped +{} ({}); kernel TUN tx {}",
        total(&after, "tx_dropped") - total(&before, "tx_dropped"),
        after["drops"]["tx"],
        link[0]["stats64"]["tx"]
    );

    // Connect (then at once, before the idle RX connection goes stale, SIGKILL the peer): a neighbour resolved, a TX connection, and the peer's RX connection.
    lab.ping_ok(1, "198.19.0.2", &[]);
    let s = lab.status(1);
    let gid2 = s["tx"][0]["peer"].as_str().expect("tx peer").to_owned();
    let gid = format!("gid={gid2}");
    wait_line(
        &lab,
        1,
        &["neighbour resolved peer=198.19.0.2", &gid],
        Duration::from_secs(5),
    );
    let tx = wait_line(
        &lab,
        1,
        &["INFO", "tx connected peer=198.19.0.2", &gid, "qpn=0x"],
        Duration::from_secs(5),
    );
    wait_line(
        &lab,
        1,
        &["INFO", "rx accepted peer=198.19.0.2", &gid, "qpn=0x"],
        Duration::from_secs(5),
    );
    assert!(tx.contains("mtu="), "{tx}");
    assert_eq!(total(&s, "schema"), 2);
    assert!(s["version"].is_string() && s["uptime_s"].is_u64(), "{s}");
    assert!(
        total(&s, "rx_packets") >= 2 && total(&s, "tx_packets") >= 2,
        "{s}"
    );
    assert!(
        total(&s, "rx_bytes") >= 2 * 84 && total(&s, "tx_bytes") >= 2 * 84,
        "{s}"
    );

    // Peer SIGKILLed: its RX connection is reaped as stale, and the line names the peer.
    assert!(lab.sh(&["kill", "2"]).status.success());
    let t0 = Instant::now();
    let reaped = wait_line(
        &lab,
        1,
        &["INFO", "rx reaped peer=198.19.0.2", &gid, "reason=stale"],
        Duration::from_secs(15),
    );
    println!(
        "reaped {:.1} s after SIGKILL: {reaped}",
        t0.elapsed().as_secs_f64()
    );

    // Node 1's neighbour entry ages out, and its TX connection with it.
    let idle = lab.wait_for(Duration::from_secs(15), |l| {
        let s = l.status(1);
        s["tx"].as_array().is_some_and(Vec::is_empty)
            && s["rx"].as_array().is_some_and(Vec::is_empty)
    });
    assert!(idle, "{}", lab.status(1));
    wait_line(
        &lab,
        1,
        &["INFO", "tx closed peer=198.19.0.2", &gid, "reason=aged-out"],
        Duration::from_secs(5),
    );

    // Restarted: connected again.
    let out = lab.sh(&["start", "2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lab.ping_ok(2, "198.19.0.1", &[]);
    lab.ping_ok(1, "198.19.0.2", &[]);
    let connects = lab.wait_for(Duration::from_secs(5), |l| {
        lines_with(l, 1, &["tx connected peer=198.19.0.2"]).len() >= 2
    });
    assert!(connects, "{}", lab.log(1));

    // Shutdown: the connection closes with a line, then one line of key=value totals, no
    // Debug dump.
    lab.ping_ok(1, "198.19.0.2", &[]);
    assert!(lab.sh(&["stop", "1"]).status.success());
    wait_line(
        &lab,
        1,
        &["INFO", "tx closed peer=198.19.0.2", "reason=shutdown"],
        Duration::from_secs(10),
    );
    let stopped = wait_line(
        &lab,
        1,
        &["INFO", "stopped uptime_s="],
        Duration::from_secs(10),
    );
    for key in [
        "rx_packets=",
        "rx_dropped=",
        "tx_bytes=",
        "tx_dropped=",
        "tx_established=",
    ] {
        assert!(stopped.contains(key), "{key} not in {stopped}");
    }
    assert!(
        !stopped.contains('{') && !stopped.contains("Counters"),
        "{stopped}"
    );
    let tx_dropped: u64 = stopped
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("tx_dropped="))
        .and_then(|v| v.parse().ok())
        .expect("tx_dropped=N");
    assert!(tx_dropped >= 5, "{stopped}");

    // Every line the daemon wrote carries its level.
    let log = lab.log(1);
    for line in log.lines().filter(|l| !l.starts_with("ipoib-cm exited")) {
        assert!(
            [" INFO ", " WARN ", " ERROR ", " DEBUG "]
                .iter()
                .any(|lvl| line.contains(lvl)),
            "no level: {line}"
        );
    }
    println!("node 1's log:\n{log}");
}

#[test]
fn json_lines_when_asked() {
    let Some(lab) = Lab::up("e2ej", 2, &["--log-format", "json"]) else {
        return;
    };
    lab.ping_ok(1, "198.19.0.2", &[]);
    let found = lab.wait_for(Duration::from_secs(5), |l| {
        l.log(1).contains("tx connected")
    });
    assert!(found, "{}", lab.log(1));
    let log = lab.log(1);
    let mut messages = Vec::new();
    for line in log.lines().filter(|l| !l.starts_with("ipoib-cm exited")) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(
            v["level"].is_string() && v["timestamp"].is_string(),
            "{line}"
        );
        messages.push(v["message"].as_str().unwrap_or_default().to_owned());
    }
    assert!(messages.iter().any(|m| m == "started"), "{log}");
    assert!(
        messages
            .iter()
            .any(|m| m.starts_with("tx connected peer=198.19.0.2 ")),
        "{log}"
    );
}

/// A fatal error is one line at the error level; with stderr the journal (`JOURNAL_STREAM`
/// naming it), without a timestamp of its own. (The daemon fails at its `--bind` check, before
/// it creates anything or sends a packet.)
#[test]
fn a_fatal_error_is_one_error_line_and_the_journal_gets_no_timestamp() {
    use std::os::unix::fs::MetadataExt;
    let dir = std::env::temp_dir().join(format!("ipoib-cm-e2elf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let run = |journal: bool| {
        let path = dir.join(format!("stderr-{journal}"));
        let file = std::fs::File::create(&path).expect("stderr file");
        let meta = file.metadata().expect("metadata");
        let mut c = std::process::Command::new(common::lab::BIN);
        c.args(["up", "--bind", "198.18.255.254", "--ifname", "e2elf0"])
            .arg("--control-socket")
            .arg(dir.join("ctl.sock"))
            .stderr(file)
            .env_remove("RUST_LOG");
        if journal {
            c.env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()));
        } else {
            c.env_remove("JOURNAL_STREAM");
        }
        let status = c.status().expect("run");
        (
            status.code(),
            std::fs::read_to_string(&path).unwrap_or_default(),
        )
    };
    let (code, plain) = run(false);
    assert_eq!(code, Some(2), "{plain}");
    assert_eq!(plain.lines().count(), 1, "{plain}");
    assert!(
        plain.contains(" ERROR ") && plain.contains("--bind 198.18.255.254"),
        "{plain}"
    );
    assert!(plain.starts_with("20"), "a timestamp first: {plain}");
    let (code, journal) = run(true);
    assert_eq!(code, Some(2), "{journal}");
    assert_eq!(journal.lines().count(), 1, "{journal}");
    assert!(
        journal.starts_with("ERROR "),
        "no timestamp under the journal: {journal}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// 240 addresses of the subnet that nobody answers, pinged at once: 240 "neighbour failed"
/// events. The log has at most 20 lines of that kind in its 10 s window, then one line that
/// counts the rest (before: one line per event, 240).
#[test]
fn a_burst_of_one_kind_of_event_writes_a_bounded_number_of_lines() {
    let Some(lab) = Lab::up("e2eb", 2, &["--neigh-max", "1024"]) else {
        return;
    };
    lab.ping_ok(1, "198.19.0.2", &[]);
    let burst = lab.exec(
        1,
        &[
            "sh",
            "-c",
            "for i in $(seq 10 249); do ping -n -c 1 -W 1 198.19.0.$i >/dev/null 2>&1 & done; wait",
        ],
        Duration::from_secs(60),
    );
    assert!(burst.status.code().is_some(), "{burst:?}");
    let counted = lab.wait_for(Duration::from_secs(30), |l| {
        !lines_with(
            l,
            1,
            &["neighbour failed: ", "more not logged in the last 10s"],
        )
        .is_empty()
    });
    let each = lines_with(&lab, 1, &["neighbour failed peer="]).len();
    let summary = lines_with(&lab, 1, &["neighbour failed: ", "more not logged"]);
    println!("240 failed resolutions: {each} lines of their own, summary {summary:?}");
    assert!(counted, "no summary line:\n{}", lab.log(1));
    assert!(
        each <= 20,
        "{each} lines of one kind in one window:\n{}",
        lab.log(1)
    );
    let more: u64 = summary[0]
        .split("neighbour failed: ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(more > 0 && each as u64 + more <= 240, "{summary:?}");
}
