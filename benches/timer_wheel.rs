//! Rough ns/op figures for [`TimerWheel`] against a `BinaryHeap` with lazy cancellation.
//!
//! Run with `cargo bench --bench timer_wheel`. Plain `fn main` (no harness). `cargo test
//! --all-targets` also builds and runs it, but without the `--bench` flag that `cargo bench`
//! passes, so it returns at once.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use ipoib_cm::timer::{TimerId, TimerWheel};

const TICK: Duration = Duration::from_millis(1);
/// Deadlines are spread over this many ticks (30 s at 1 ms, like an RX reap timeout).
const SPREAD_TICKS: u64 = 30_000;

fn deadlines(n: usize, seed: u64) -> Vec<u64> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % SPREAD_TICKS
        })
        .collect()
}

fn per_op(start: Instant, ops: usize) -> f64 {
    start.elapsed().as_nanos() as f64 / ops as f64
}

fn bench_wheel(n: usize) -> [f64; 4] {
    let t0 = Instant::now();
    let ds = deadlines(n, 0x1234_5678);
    let at = |tick: u64| t0 + TICK * tick as u32;
    let mut w = TimerWheel::new(t0, TICK);

    let s = Instant::now();
    let mut ids: Vec<TimerId> = ds.iter().map(|&d| w.insert(at(d), d)).collect();
    let insert = per_op(s, n);

    // Activity stamps: move every timer 1 s later.
    let s = Instant::now();
    for id in &mut ids {
        let d = w.deadline(*id).unwrap_or(t0) + Duration::from_secs(1);
        *id = w.reschedule(*id, d).unwrap_or(*id);
    }
    let reschedule = per_op(s, n);

    let s = Instant::now();
    for id in ids.iter().rev() {
        black_box(w.cancel(*id));
    }
    let cancel = per_op(s, n);

    for &d in &ds {
        w.insert(at(d), d);
    }
    let mut out = Vec::with_capacity(n);
    let s = Instant::now();
    for tick in 0..=SPREAD_TICKS {
        out.clear();
        w.expire(at(tick), &mut out);
        black_box(&out);
        black_box(w.poll_timeout());
    }
    let expire = per_op(s, n);
    assert!(w.is_empty());
    [insert, reschedule, cancel, expire]
}

/// `BinaryHeap<Reverse<(tick, seq, slot)>>` with cancellation by generation (lazy).
fn bench_heap(n: usize) -> [f64; 4] {
    let ds = deadlines(n, 0x1234_5678);
    let mut heap = BinaryHeap::new();
    let mut live: Vec<u64> = Vec::with_capacity(n);
    let mut seq = 0u64;

    let s = Instant::now();
    for (i, &d) in ds.iter().enumerate() {
        heap.push(Reverse((d, seq, i, seq)));
        live.push(seq);
        seq += 1;
    }
    let insert = per_op(s, n);

    let s = Instant::now();
    for (i, &d) in ds.iter().enumerate() {
        heap.push(Reverse((d + 1_000, seq, i, seq)));
        live[i] = seq;
        seq += 1;
    }
    let reschedule = per_op(s, n);

    let s = Instant::now();
    for g in live.iter_mut().rev() {
        *g = u64::MAX;
    }
    let cancel = per_op(s, n);

    heap.clear();
    for (i, &d) in ds.iter().enumerate() {
        heap.push(Reverse((d, seq, i, seq)));
        live[i] = seq;
        seq += 1;
    }
    let mut out = Vec::with_capacity(n);
    let s = Instant::now();
    for tick in 0..=SPREAD_TICKS {
        out.clear();
        while let Some(Reverse((d, _, i, g))) = heap.peek().copied() {
            if d > tick {
                break;
            }
            heap.pop();
            if live[i] == g {
                out.push(i);
            }
        }
        black_box(&out);
        black_box(heap.peek());
    }
    let expire = per_op(s, n);
    [insert, reschedule, cancel, expire]
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("timer_wheel: skipped (run it with `cargo bench --bench timer_wheel`)");
        return;
    }
    println!("ns/op          insert  resched   cancel   expire (expire: 1 ms steps over 30 s, per timer)");
    for n in [10_000, 100_000] {
        let w = bench_wheel(n);
        let h = bench_heap(n);
        println!(
            "wheel {n:>7} {:>8.1} {:>8.1} {:>8.1} {:>8.1}",
            w[0], w[1], w[2], w[3]
        );
        println!(
            "heap  {n:>7} {:>8.1} {:>8.1} {:>8.1} {:>8.1}",
            h[0], h[1], h[2], h[3]
        );
    }
}
