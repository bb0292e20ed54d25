//! Daemons on our CM and daemons on the kernel's CM, on the simulated fabric. A stand-in for
//! a kernel-CM daemon listens only on the rdma_cm service (`listen_ipoib_service = false`:
//! rdma_cm cannot listen on IPoIB's service ID), so a REQ to its standard service ID draws REJ
//! 8 there as from `ib_cm`. Node 1 advertises it (`advertise_rdma_cm`, flag `0x20`); node 2
//! does not (an old neighbour entry, a lost flag). Node 0 is a plain daemon of ours.

use std::time::{Duration, Instant};

use ipoib_cm::sim::cluster::{ping4, ping6, Cluster, BASELINE_QPS};

/// Node 0 plain; node 1 a kernel-CM stand-in advertising `0x20`; node 2 one that does not.
fn cluster() -> Cluster {
    Cluster::new(
        3,
        Instant::now(),
        |_, _| {},
        |i, c| {
            c.rx_timeout = Duration::from_secs(2);
            if i > 0 {
                c.listen_ipoib_service = false;
                c.advertise_rdma_cm = i == 1;
            }
        },
    )
    .expect("cluster")
}

/// `from` pings `to` (IPv4 and IPv6, the first packets waiting for ARP/ND and the CM); whether
/// both arrived.
fn pings_cross(cl: &mut Cluster, from: usize, to: usize) -> bool {
    let (p4, p6) = (ping4(from, to, 1000), ping6(from, to, 3000));
    cl.inject(from, &p4);
    cl.inject(from, &p6);
    cl.run(Duration::from_millis(200));
    cl.tun[to].contains(&p4) && cl.tun[to].contains(&p6)
}

#[test]
fn a_plain_node_and_a_kernel_cm_node_connect_both_ways() {
    let mut cl = cluster();
    let hw1 = cl.ep(1).expect("up").hwaddr();
    assert!(hw1.rdma_cm() && hw1.connected_mode());
    assert!(!cl.ep(0).expect("up").hwaddr().rdma_cm());
    // 0 -> 1: the flag sends the REQ straight to the rdma_cm service.
    assert!(pings_cross(&mut cl, 0, 1), "0 -> 1");
    let c0 = cl.ep(0).expect("up").counters();
    assert_eq!((c0.tx_established, c0.tx_rdma_cm_retries), (1, 0), "{c0:?}");
    assert_eq!(cl.ep(0).expect("up").cm_stats().rej_received, 0);
    let c1 = cl.ep(1).expect("up").counters();
    assert_eq!((c1.rx_accepted, c1.rx_bad_cma_hdr), (1, 0), "{c1:?}");
    // 1 -> 0: node 0 has no flag; its standard service ID takes the REQ.
    assert!(pings_cross(&mut cl, 1, 0), "1 -> 0");
    assert_eq!(cl.ep(1).expect("up").counters().tx_established, 1);
    assert_eq!(cl.ep(0).expect("up").counters().rx_accepted, 1);
    // Both connections are reaped as every other when idle: node 1's RX QP included.
    cl.run(Duration::from_secs(10));
    for i in 0..2 {
        let ep = cl.ep(i).expect("up");
        assert_eq!((ep.rx_count(), ep.tx_count()), (0, 0), "node {i}");
        assert_eq!(cl.qp_live(i), BASELINE_QPS, "node {i}");
    }
    assert!(pings_cross(&mut cl, 0, 1), "0 -> 1 again");
}

#[test]
fn a_kernel_cm_node_without_the_flag_costs_one_rej_then_is_remembered() {
    let mut cl = cluster();
    assert!(!cl.ep(2).expect("up").hwaddr().rdma_cm());
    // 0 -> 2: REJ 8 from the standard service ID, the retry at the rdma_cm service connects.
    assert!(pings_cross(&mut cl, 0, 2), "0 -> 2");
    let c0 = cl.ep(0).expect("up").counters();
    assert_eq!(
        (c0.tx_established, c0.tx_rdma_cm_retries, c0.tx_failed),
        (1, 1, 0),
        "{c0:?}"
    );
    assert_eq!(cl.ep(0).expect("up").cm_stats().rej_received, 1);
    // Idle: node 2 reaps its RX QP (a DREQ closes node 0's TX connection); the neighbour
    // entry stays, and remembers: the next connection goes straight to the rdma_cm service.
    cl.run(Duration::from_secs(5));
    assert_eq!(cl.ep(0).expect("up").tx_count(), 0);
    assert!(pings_cross(&mut cl, 0, 2), "0 -> 2 again");
    let c0 = cl.ep(0).expect("up").counters();
    assert_eq!((c0.tx_established, c0.tx_rdma_cm_retries), (2, 1), "{c0:?}");
    assert_eq!(cl.ep(0).expect("up").cm_stats().rej_received, 1);
    // 2 -> 0 on node 0's standard service ID.
    assert!(pings_cross(&mut cl, 2, 0), "2 -> 0");
    assert_eq!(cl.ep(2).expect("up").counters().tx_established, 1);
}
