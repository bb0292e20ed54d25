//! Rough ns/packet figures for the software provider's IPv4 ICRC check on receive: a datagram
//! from one of our own peers (IP ID 0, the fast path), a later segment of one of their UDP
//! GSO trains (ID 1..64), and one from a sender that picks its own IDs, as Linux rxe does
//! (any ID), each through [`SoftVerbs::handle_datagram`] up to the unknown-QPN drop; then the
//! parts: the ICRC with ID 0, the solve for the ID (cached per length), and building the
//! per-length table (a cache miss).
//!
//! Run with `cargo bench --bench icrc_check`. Plain `fn main` (no harness). `cargo test
//! --all-targets` also builds and runs it, but without the `--bench` flag that `cargo bench`
//! passes, so it returns at once.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Instant;

use ipoib_cm::soft::{SoftConfig, SoftVerbs};
use ipoib_cm::wire::icrc::{
    append_icrc, icrc_difference, verify_icrc, IpHeaderInfo, Ipv4IdShift, Ipv4IdShiftCache,
};

const LOCAL: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const PEER: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);

fn ip(id: u16) -> IpHeaderInfo {
    IpHeaderInfo::V4 {
        src: PEER,
        dst: LOCAL,
        identification: id,
        dont_fragment: true,
    }
}

/// An RC SEND_ONLY of `payload` bytes to QPN 0x123456 (none exists), sent with IP ID `id`.
fn datagram(payload: usize, id: u16) -> Vec<u8> {
    let mut d = vec![0x04, 0, 0xFF, 0xFF, 0, 0x12, 0x34, 0x56, 0, 0, 0, 1];
    d.extend((0..payload).map(|i| i as u8));
    append_icrc(&ip(id), 4791, 4791, &mut d);
    d
}

/// The best of five runs of `n` calls of `f`, in ns per call (the machine may be busy).
fn best_ns(n: u32, mut f: impl FnMut(u32)) -> f64 {
    (0..5)
        .map(|_| {
            let s = Instant::now();
            for i in 0..n {
                f(i);
            }
            s.elapsed().as_nanos() as f64 / f64::from(n)
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("icrc_check: skipped (run it with `cargo bench --bench icrc_check`)");
        return;
    }
    let n = 200_000u32;
    let src = SocketAddr::new(IpAddr::V4(PEER), 4791);
    println!("ns/packet   bytes   id0-path  gso-id5  rxe-ids  | icrc(id0)    solve  table(miss)");
    for payload in [0usize, 1024, 4096] {
        let mut row = Vec::new();
        for ids in [[0u16; 4], [5; 4], [0x1234, 0xBEEF, 0x0F00, 0x8001]] {
            let pkts: Vec<Vec<u8>> = ids.iter().map(|&id| datagram(payload, id)).collect();
            let mut v = SoftVerbs::new(SoftConfig::new(IpAddr::V4(LOCAL)));
            let now = Instant::now();
            row.push(best_ns(n, |i| {
                let p = &pkts[i as usize % pkts.len()];
                v.handle_datagram(now, src, IpAddr::V4(LOCAL), black_box(p));
            }));
            assert_eq!(v.stats().rx_datagrams, 5 * u64::from(n));
        }
        let d = datagram(payload, 0xBEEF);
        let icrc = best_ns(n, |_| {
            black_box(verify_icrc(&ip(0), 4791, 4791, black_box(&d)));
        });
        let diff = icrc_difference(&ip(0), 4791, 4791, &d).unwrap_or(0);
        let mut cache = Ipv4IdShiftCache::default();
        let solve = best_ns(n, |_| {
            black_box(cache.solve(d.len(), black_box(diff)));
        });
        let table = best_ns(n / 20, |_| {
            black_box(Ipv4IdShift::new(black_box(d.len())));
        });
        println!(
            "          {:>7} {:>9.1} {:>8.1} {:>8.1}  | {:>9.1} {:>8.1} {:>12.1}",
            d.len(),
            row[0],
            row[1],
            row[2],
            icrc,
            solve,
            table
        );
    }
}
