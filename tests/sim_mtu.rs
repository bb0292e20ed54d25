//! UD datagrams larger than the receiver's path MTU on the simulated fabric: a kernel-like
//! peer in datagram mode on a 4096-byte path (interface MTU 4092) sends 2044- and 4092-byte
//! IP packets to a node whose underlay is a 1500-byte link (path MTU 1024, as the daemon
//! derives it from `--bind`). The receiver's UD buffers hold the GRH and the port's largest
//! MTU (kernel ipoib's `IPOIB_UD_BUF_SIZE(max_ib_mtu)`), not the path MTU: both arrive. (With
//! buffers of GRH + path MTU, 1064 bytes, the provider dropped both, `rx_ud_dropped`, and the
//! sender saw neither an error nor an ICMP.)

use std::time::{Duration, Instant};

use ipoib_cm::ipoib::Mode;
use ipoib_cm::sim::cluster::{ping4, Cluster};
use ipoib_cm::verbs::PathMtu;

/// Node 0: datagram mode at path MTU 4096; node 1: connected mode on a 1500-byte underlay.
fn cluster() -> Cluster {
    Cluster::new(
        2,
        Instant::now(),
        |i, s| {
            s.port_mtu = if i == 0 {
                PathMtu::Mtu4096
            } else {
                PathMtu::Mtu1024
            }
        },
        |i, c| {
            if i == 0 {
                c.mode = Mode::Datagram;
                c.path_mtu = PathMtu::Mtu4096;
            } else {
                c.path_mtu = PathMtu::Mtu1024;
            }
        },
    )
    .expect("cluster")
}

#[test]
fn datagrams_of_2044_and_4092_bytes_reach_a_node_whose_path_mtu_is_1024() {
    let mut cl = cluster();
    assert_eq!(cl.ep(0).expect("up").interface_mtu(), 4092);
    assert_eq!(cl.ep(1).expect("up").ud_mtu(), 1020);
    // IPv4 packets of exactly 2044 and 4092 bytes (ICMP echo: 28 bytes of headers).
    let packets: Vec<Vec<u8>> = [2044, 4092, 4092]
        .iter()
        .map(|&n| ping4(0, 1, n - 28))
        .collect();
    assert_eq!(packets[0].len(), 2044);
    assert_eq!(packets[1].len(), 4092);
    for p in &packets {
        cl.inject(0, p);
    }
    cl.run(Duration::from_millis(500));
    let dropped = cl.f.nodes[1].stats().rx_ud_dropped;
    let delivered = cl.tun[1].len();
    println!(
        "sim_ud_mtu: {} datagrams of {:?} bytes sent over UD, {delivered} delivered, rx_ud_dropped {dropped}",
        packets.len(),
        packets.iter().map(Vec::len).collect::<Vec<_>>()
    );
    assert_eq!(dropped, 0, "the receiver's UD buffers refused them");
    assert_eq!(cl.tun[1], packets);
    let c0 = cl.ep(0).expect("up").counters();
    assert_eq!((c0.tx_packets, c0.tx_established), (3, 0), "over UD");
    // One byte more than the sender's UD MTU: an ICMP to the sender's host, nothing sent.
    cl.inject(0, &ping4(0, 1, 4093 - 28));
    cl.run(Duration::from_millis(10));
    assert_eq!(cl.ep(0).expect("up").counters().icmp_too_big_sent, 1);
    assert_eq!(cl.tun[1].len(), 3);
}
