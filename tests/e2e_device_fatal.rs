//! A device context lost under a running daemon (`IBV_EVENT_DEVICE_FATAL`, as a firmware reset
//! raises it), against daemons in namespaces made by `scripts/lab.sh` (removed by the test;
//! without root it is skipped): node 2 runs with `--fault-device-fatal-after`, its software
//! device reports the fatal event and fails every verb from then on. The daemon tears
//! everything down and opens the device again; node 1 sees a peer that restarted, and pings
//! carry on both ways. Node 2 counts one fatal event and one reopen.

mod common;

use std::time::{Duration, Instant};

use common::lab::{ping_received as received, provider_of as provider, Lab};

/// How long after its start node 2's device fails.
const FATAL_AFTER: Duration = Duration::from_secs(3);
/// How long pings may take to come back after the fatal event.
const RECOVERY_LIMIT: Duration = Duration::from_secs(20);

/// Pings sent every 100 ms from before the fatal event to well after it.
const ACROSS_PINGS: u32 = 60;

#[test]
fn a_fatal_device_event_is_survived_by_reopening_the_device() {
    let Some(lab) = Lab::up("e2efa", 2, &[]) else {
        return;
    };
    lab.ping_ok(1, "198.19.0.2", &[]);
    assert!(lab.sh(&["kill", "2"]).status.success());
    std::thread::sleep(Duration::from_millis(300));
    let start = lab.sh(&["start", "2", "--", "--fault-device-fatal-after", "3s"]);
    let started = Instant::now();
    assert!(
        start.status.success(),
        "start 2: {}",
        String::from_utf8_lossy(&start.stderr)
    );
    lab.ping_ok(1, "198.19.0.2", &[]);
    // Pings every 100 ms across the fatal event, for the figure of what it costs.
    let across = lab.start_ping(1, "198.19.0.2", ACROSS_PINGS);
    // The fatal event, and a little more.
    std::thread::sleep(
        (FATAL_AFTER + Duration::from_millis(500)).saturating_sub(started.elapsed()),
    );
    let fatal = Instant::now();
    let mut tries = 0;
    let back = lab.wait_for(RECOVERY_LIMIT, |lab| {
        tries += 1;
        lab.exec(
            1,
            &["ping", "-n", "-c", "1", "-W", "1", "198.19.0.2"],
            Duration::from_secs(5),
        )
        .status
        .success()
    });
    let took = fatal.elapsed();
    let got = received(across);
    let s2 = lab.status(2);
    println!(
        "device fatal: {got} of {ACROSS_PINGS} pings every 100 ms across the event answered; \
         pings back {back} {took:?} after fatal + 0.5 s ({tries} single pings); node 2 \
         device_fatal_events {} device_reopens {} device_reopen_failures {} \
         device_down_drops {} rx_device_lost {}",
        provider(&s2, "device_fatal_events"),
        provider(&s2, "device_reopens"),
        provider(&s2, "device_reopen_failures"),
        provider(&s2, "device_down_drops"),
        provider(&s2, "rx_device_lost"),
    );
    assert!(
        back,
        "no ping answered within {RECOVERY_LIMIT:?} of the fatal event\n{}",
        lab.log(2)
    );
    lab.ping_ok(1, "198.19.0.2", &[]);
    lab.ping_ok(2, "198.19.0.1", &[]);
    let log = lab.log(2);
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("device")).collect();
    println!("node 2 log of the device:\n{}", lines.join("\n"));
    assert_eq!(lines.len(), 2, "one line for the loss, one for the reopen");
    let s2 = lab.status(2);
    assert_eq!(
        provider(&s2, "device_fatal_events"),
        1,
        "{}",
        s2["provider"]
    );
    assert_eq!(provider(&s2, "device_reopens"), 1, "{}", s2["provider"]);
    assert_eq!(
        provider(&s2, "device_reopen_failures"),
        0,
        "{}",
        s2["provider"]
    );
    // Everything was built again: one TX and one live RX connection to node 1.
    let live_rx = s2["rx"]
        .as_array()
        .map_or(0, |r| r.iter().filter(|c| c["state"] == "live").count());
    assert_eq!(live_rx, 1, "{}", s2["rx"]);
    assert_eq!(s2["tx"].as_array().map_or(0, Vec::len), 1, "{}", s2["tx"]);
}

/// With several workers the interface is not rebuilt in place (a follower's interface and
/// views, control's MAD routing and the shared RX budget would not come back): a lost device
/// ends the daemon with one line and exit status 3, as the kernel's CM does, for the service
/// manager to restart it; node 1 is undisturbed.
#[test]
fn with_workers_a_fatal_device_event_ends_the_daemon_with_status_3() {
    let Some(lab) = Lab::up("e2efw", 2, &["--workers", "2"]) else {
        return;
    };
    lab.ping_ok(1, "198.19.0.2", &[]);
    assert!(lab.sh(&["kill", "2"]).status.success());
    std::thread::sleep(Duration::from_millis(300));
    let start = lab.sh(&["start", "2", "--", "--fault-device-fatal-after", "3s"]);
    assert!(
        start.status.success(),
        "start 2: {}",
        String::from_utf8_lossy(&start.stderr)
    );
    let exits = |l: &Lab| l.log(2).matches("ipoib-cm exited with status").count();
    let before = exits(&lab);
    let ended = lab.wait_for(FATAL_AFTER + Duration::from_secs(10), |l| exits(l) > before);
    let log = lab.log(2);
    assert!(ended, "{log}");
    assert!(
        log.contains("workers is not reopened in place")
            && log.trim_end().ends_with("ipoib-cm exited with status 3"),
        "{log}"
    );
    assert!(!lab.log(1).contains("exited with status"), "{}", lab.log(1));
}
