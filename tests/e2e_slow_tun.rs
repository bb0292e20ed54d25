//! A receiver whose host cannot keep up, next to a sender configured as Linux's `ipoib_cm`
//! (`rnr_retry_count` 0, `retry_count` 0: the first RNR NAK fails its QP and the connection is
//! torn down and built again), against daemons in namespaces made by `scripts/lab.sh` (removed
//! by the test; without root it is skipped). Node 2's TUN device takes at most
//! `TUN_RATE` packets a second (`--fault-tun-rate`), with the default SRQ (256 receives,
//! deeper than the sender's send queue of 128, so that no burst outruns a turn) and 16 spare buffers, while
//! node 1 sends UDP at ten times that rate and more: node 2 drops and counts what its host
//! cannot take (`rx_buffer_drops`), and node 1's connection lives through it (one connection
//! established, none failed), where a receive buffer held until its packet reaches the TUN
//! device would have emptied the SRQ and RNR-NAKed the sender.

mod common;

use std::time::Duration;

use common::lab::Lab;

/// Packets a second node 2's TUN device takes.
const TUN_RATE: &str = "2000";

#[test]
fn a_linux_like_sender_keeps_its_connection_to_a_host_that_cannot_keep_up() {
    let linux = ["--tx-rnr-retry", "0", "--tx-retry-count", "0"];
    let Some(lab) = Lab::up("e2est", 2, &linux) else {
        return;
    };
    assert!(lab.sh(&["kill", "2"]).status.success());
    std::thread::sleep(Duration::from_millis(300));
    let slow = ["--rx-spare", "16", "--fault-tun-rate", TUN_RATE];
    let start = lab.sh(&[&["start", "2", "--"][..], &slow[..]].concat());
    assert!(
        start.status.success(),
        "start 2: {}",
        String::from_utf8_lossy(&start.stderr)
    );
    lab.ping_ok(1, "198.19.0.2", &[]);
    let Some(report) = lab.iperf3(
        1,
        2,
        "198.19.0.2",
        &["-u", "-b", "200M", "-l", "1200", "-t", "3"],
    ) else {
        println!("skipped: iperf3 is not installed");
        return;
    };
    let sum = &report["end"]["sum"];
    let sent = sum["packets"].as_u64().unwrap_or(0);
    let lost = sum["lost_packets"].as_u64().unwrap_or(0);
    let drops = lab.provider_counter(2, "rx_buffer_drops");
    let refills = lab.provider_counter(2, "srq_refills");
    let (established, failed, stalled) = (
        lab.counter(1, "tx_established"),
        lab.counter(1, "tx_failed"),
        lab.counter(1, "tx_stalled"),
    );
    let written = lab.provider_counter(2, "tun_written");
    let rnr_naks = lab.provider_counter(2, "tx_rnr_naks");
    println!(
        "slow TUN ({TUN_RATE} packets/s, SRQ 256 + 16 spares): iperf3 sent {sent} UDP packets, \
         lost {lost}; node 2 rx_buffer_drops {drops}, srq_refills {refills}, TUN written \
         {written}, RNR NAKs sent {rnr_naks}; node 1 tx_established {established}, tx_failed {failed}, tx_stalled \
         {stalled}"
    );
    assert!(sent > 0, "iperf3 sent nothing: {report}");
    assert!(drops > 0, "node 2 dropped nothing: the TUN device kept up");
    assert_eq!(rnr_naks, 0, "node 2 RNR-NAKed its sender");
    assert_eq!(
        (established, failed, stalled),
        (1, 0, 0),
        "node 1's connection was torn down\n{}",
        lab.log(1)
    );
    // The operator reads that the host fell behind, not that peers sent bad input.
    let log = lab.log(2);
    assert!(
        log.contains("dropped: the host did not keep up kind=rx_buffer_drops")
            && !log.contains("bad input dropped kind=rx_buffer_drops"),
        "{log}"
    );
    // The connection still carries traffic once the flood is over.
    lab.ping_ok(1, "198.19.0.2", &[]);
}
