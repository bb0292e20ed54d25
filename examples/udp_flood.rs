//! A deterministic 64-byte UDP flood between two endpoints on the simulated fabric, for
//! instruction counts of the per-packet path (`valgrind --tool=callgrind`).
//!
//! ```text
//! udp_flood [PACKETS] [BATCH]
//! ```
//!
//! Node 0 resolves node 1 and opens its RC connection with one ping, then writes PACKETS
//! 64-byte IPv4/UDP packets for node 1 into its TUN side (through the endpoint's send
//! buffers, as the daemon does), BATCH at a time, each batch run until node 1's TUN side
//! received it. The difference between two runs with different PACKETS is the cost of the
//! packets alone (both endpoints, both providers and the fabric), e.g.
//!
//! ```text
//! cargo build --release --example udp_flood
//! valgrind --tool=callgrind --callgrind-out-file=cg.N target/release/examples/udp_flood N
//! callgrind_annotate cg.N
//! ```
//!
//! for N = 2000 and 42000: (Ir(42000) - Ir(2000)) / 40000 is the instructions per packet.

use std::time::{Duration, Instant};

use etherparse::PacketBuilder;
use ipoib_cm::sim::cluster::{node_v4, ping4, Cluster};

fn main() {
    let mut args = std::env::args().skip(1);
    let packets: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let batch: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(32)
        .max(1);
    let mut c = Cluster::new(2, Instant::now(), |_, _| {}, |_, _| {}).expect("cluster");
    c.inject(0, &ping4(0, 1, 56));
    c.run(Duration::from_millis(50));
    assert_eq!(c.tun[1].len(), 1, "the ping did not arrive");
    c.tun[1].clear();
    c.tun[0].clear();
    let mut udp = Vec::new();
    PacketBuilder::ipv4(node_v4(0).octets(), node_v4(1).octets(), 64)
        .udp(40000, 5201)
        .write(&mut udp, &[0x5A; 36])
        .expect("packet");
    assert_eq!(udp.len(), 64);
    let mut delivered = 0usize;
    let mut sent = 0usize;
    while sent < packets {
        let n = batch.min(packets - sent);
        for _ in 0..n {
            c.inject_via_buffer(0, &udp);
        }
        sent += n;
        for _ in 0..1_000_000 {
            c.service();
            delivered += c.tun[1].len();
            c.tun[1].clear();
            if delivered >= sent {
                break;
            }
            if !c.f.step() {
                c.f.advance(Duration::from_micros(1));
            }
        }
        assert_eq!(delivered, sent, "packets lost");
    }
    let k = c.ep(0).expect("node 0").counters();
    println!(
        "{{\"packets\":{packets},\"delivered\":{delivered},\"tx_packets\":{},\"fabric_datagrams\":{}}}",
        k.tx_packets, c.f.delivered
    );
}
