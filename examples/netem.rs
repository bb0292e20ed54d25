//! A userspace netem: the IP packets routed into a TUN device come back out of it late,
//! jittered, reordered or not at all, as Linux's `sch_netem` would treat them (for hosts
//! without that module). It exists for `scripts/bench/impaired.sh`, which routes the traffic
//! between two lab namespaces through it.
//!
//! ```text
//! netem IFNAME [--delay MS] [--jitter MS] [--reorder PCT] [--loss PCT] [--limit PACKETS]
//!              [--seed N]
//! ```
//!
//! Creates the TUN interface (its MTU, link state and the routes into it are left to the
//! caller) and, until SIGTERM or SIGINT, writes every packet read from it back into it:
//!
//! - `--loss PCT`: that share of packets is dropped;
//! - `--reorder PCT`: that share is written back at once, without the delay (netem's
//!   `reorder`: they overtake everything delayed);
//! - the others after `--delay MS`, plus a uniform draw from `-jitter..=jitter` (never below
//!   zero); packets leave in the order of their times, so a jitter wider than their spacing
//!   reorders them, as netem's does;
//! - at most `--limit` packets wait (default 1000, netem's); more are dropped.
//!
//! Every draw comes from a ChaCha RNG seeded with `--seed`. On exit it prints one JSON line
//! of counters. Timers have the event loop's millisecond resolution. Needs `CAP_NET_ADMIN`.

#![forbid(unsafe_code)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const TUN: Token = Token(0);
/// Packets read per turn before the due ones are written.
const BATCH: usize = 256;
/// The longest sleep, so that a signal is noticed.
const MAX_SLEEP: Duration = Duration::from_millis(100);
/// Packets are written up to this early (the loop wakes to the millisecond).
const SLACK: Duration = Duration::from_micros(500);

/// What to do to the packets.
#[derive(Debug, Clone, Copy, Default)]
struct Impairment {
    delay: Duration,
    jitter: Duration,
    reorder_pct: f64,
    loss_pct: f64,
    limit: usize,
    seed: u64,
}

/// Counters printed on exit.
#[derive(Debug, Default)]
struct Counters {
    received: u64,
    forwarded: u64,
    lost: u64,
    reordered: u64,
    overflow: u64,
    write_errors: u64,
}

fn main() {
    if let Err(e) = run() {
        eprintln!("netem: {e}");
        std::process::exit(1);
    }
}

fn usage(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{what}\nusage: netem IFNAME [--delay MS] [--jitter MS] [--reorder PCT] \
             [--loss PCT] [--limit PACKETS] [--seed N]"
        ),
    )
}

fn parse_args() -> io::Result<(String, Impairment)> {
    let mut args = std::env::args().skip(1);
    let ifname = args.next().ok_or_else(|| usage("no IFNAME"))?;
    let mut imp = Impairment {
        limit: 1000,
        ..Impairment::default()
    };
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .ok_or_else(|| usage(&format!("{flag} needs a value")))?;
        let num = |v: &str| {
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| usage(&format!("{flag} {v}: not a number >= 0")))
        };
        let pct = |v: &str| {
            num(v).and_then(|x| {
                if x <= 100.0 {
                    Ok(x)
                } else {
                    Err(usage(&format!("{flag} {v}: more than 100")))
                }
            })
        };
        match flag.as_str() {
            "--delay" => imp.delay = Duration::from_secs_f64(num(&value)? / 1e3),
            "--jitter" => imp.jitter = Duration::from_secs_f64(num(&value)? / 1e3),
            "--reorder" => imp.reorder_pct = pct(&value)?,
            "--loss" => imp.loss_pct = pct(&value)?,
            "--limit" => imp.limit = num(&value)? as usize,
            "--seed" => imp.seed = num(&value)? as u64,
            _ => return Err(usage(&format!("unknown flag {flag}"))),
        }
    }
    Ok((ifname, imp))
}

/// The extra delay of the next packet (`Some(ZERO)`: reordered to the front), or `None`
/// when it is lost.
fn draw(imp: &Impairment, rng: &mut ChaCha8Rng, c: &mut Counters) -> Option<Duration> {
    if imp.loss_pct > 0.0 && rng.gen::<f64>() * 100.0 < imp.loss_pct {
        c.lost += 1;
        return None;
    }
    if imp.reorder_pct > 0.0 && rng.gen::<f64>() * 100.0 < imp.reorder_pct {
        c.reordered += 1;
        return Some(Duration::ZERO);
    }
    if imp.jitter.is_zero() {
        return Some(imp.delay);
    }
    let j = imp.jitter.as_secs_f64();
    let d = imp.delay.as_secs_f64() + rng.gen_range(-j..=j);
    Some(Duration::from_secs_f64(d.max(0.0)))
}

fn run() -> io::Result<()> {
    let (ifname, imp) = parse_args()?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }
    let tun = tun_tap::Iface::without_packet_info(&ifname, tun_tap::Mode::Tun)?;
    tun.set_non_blocking()?;
    let mut poll = Poll::new()?;
    let fd = tun.as_raw_fd();
    poll.registry()
        .register(&mut SourceFd(&fd), TUN, Interest::READABLE)?;
    let mut events = Events::with_capacity(8);
    let mut rng = ChaCha8Rng::seed_from_u64(imp.seed);
    let mut c = Counters::default();
    // Waiting packets by (due, arrival order); their buffers come back to `spare`.
    let mut queue: BinaryHeap<Reverse<(Instant, u64, Vec<u8>)>> = BinaryHeap::new();
    let mut spare: Vec<Vec<u8>> = Vec::new();
    let mut seq = 0u64;
    let mut buf = vec![0u8; 65_536];
    let mut readable = true;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let sleep = if readable {
            Duration::ZERO
        } else {
            queue
                .peek()
                .map_or(MAX_SLEEP, |Reverse((due, ..))| {
                    due.saturating_duration_since(now)
                })
                .min(MAX_SLEEP)
        };
        if let Err(e) = poll.poll(&mut events, Some(sleep)) {
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        let now = Instant::now();
        // Edge-triggered: read until the device is empty (bounded per turn; `readable` says
        // the bound was hit).
        readable = false;
        for _ in 0..BATCH {
            let n = match tun.recv(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            readable = true;
            c.received += 1;
            let Some(extra) = draw(&imp, &mut rng, &mut c) else {
                continue;
            };
            if queue.len() >= imp.limit {
                c.overflow += 1;
                continue;
            }
            let mut p = spare.pop().unwrap_or_default();
            p.clear();
            p.extend_from_slice(buf.get(..n).unwrap_or_default());
            seq += 1;
            queue.push(Reverse((now + extra, seq, p)));
        }
        while let Some(Reverse((due, ..))) = queue.peek() {
            if *due > now + SLACK {
                break;
            }
            let Some(Reverse((_, _, p))) = queue.pop() else {
                break;
            };
            match tun.send(&p) {
                Ok(_) => c.forwarded += 1,
                Err(_) => c.write_errors += 1,
            }
            spare.push(p);
        }
    }
    println!(
        "{{\"received\": {}, \"forwarded\": {}, \"lost\": {}, \"reordered\": {}, \
         \"overflow\": {}, \"write_errors\": {}, \"waiting\": {}}}",
        c.received,
        c.forwarded,
        c.lost,
        c.reordered,
        c.overflow,
        c.write_errors,
        queue.len()
    );
    Ok(())
}
