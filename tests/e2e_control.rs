//! End-to-end: clients of the control socket that misbehave do not stall the event loop.
//!
//! A two-node lab (`scripts/lab.sh`) pings across the tunnel every 10 ms while node 1's
//! control socket is attacked: slowloris clients that send a byte every 100 ms, 200 idle
//! connections, and four threads that connect, stay silent a moment and reconnect as fast as
//! they can. No ping may be lost, at most [`SLOW_ALLOWED`] more replies than in an
//! undisturbed run may take longer than [`SLOW_RTT`], none longer than [`MAX_RTT`], and
//! `ipoib-cm status` still answers during and after every attack. An undisturbed round trip
//! is well under a millisecond on an idle machine, but a loaded one has scheduling spikes of
//! tens of milliseconds, each delaying one reply; a stalled loop delays every ping sent
//! during the stall (a loop that waited for slow clients delayed 100-240 of the 300 by up to
//! 4 s). The figures print with `--nocapture`. Every loop is bounded in count and time.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::lab::Lab;

/// A round trip this long counts as slow.
const SLOW_RTT: Duration = Duration::from_millis(50);
/// Slow replies allowed per attack beyond those of the undisturbed run.
const SLOW_ALLOWED: usize = 5;
/// The longest round trip allowed while the control socket is attacked.
const MAX_RTT: Duration = Duration::from_millis(200);
/// Pings sent per run, one every [`PING_INTERVAL`].
const PINGS: u32 = 300;
/// `ping -i`.
const PING_INTERVAL: &str = "0.01";
/// How long an attack lasts at most (a ping run is about 3 s).
const ATTACK: Duration = Duration::from_secs(4);

/// What one `ping` run measured.
#[derive(Debug)]
struct PingFigures {
    sent: u32,
    received: u32,
    avg_ms: f64,
    max_ms: f64,
    /// Replies slower than [`SLOW_RTT`].
    slow: usize,
}

/// Parses `ping`'s output: the replies' `time=T ms` and the summary ("N packets transmitted,
/// M received, ..." and "rtt min/avg/max/mdev = a/b/c/d ms").
fn ping_figures(out: &str) -> Option<PingFigures> {
    let bound_ms = SLOW_RTT.as_secs_f64() * 1e3;
    let slow = out
        .lines()
        .filter_map(|l| {
            l.split("time=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .filter(|&t: &f64| t > bound_ms)
        .count();
    let counts = out.lines().find(|l| l.contains("packets transmitted"))?;
    let mut words = counts.split(|c: char| c == ',' || c.is_whitespace());
    let sent = words.next()?.parse().ok()?;
    let received = counts
        .split(", ")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let rtt = out.lines().find(|l| l.starts_with("rtt "))?;
    let values: Vec<f64> = rtt
        .split('=')
        .nth(1)?
        .split_whitespace()
        .next()?
        .split('/')
        .filter_map(|v| v.parse().ok())
        .collect();
    Some(PingFigures {
        sent,
        received,
        avg_ms: *values.get(1)?,
        max_ms: *values.get(2)?,
        slow,
    })
}

/// Pings node 2 from node 1 ([`PINGS`] every [`PING_INTERVAL`]) while `attack` runs against
/// node 1's control socket (told to stop when the ping ends), asks `status` halfway through,
/// and returns the ping's figures. `attack` returns how many connections it made.
fn ping_during(
    lab: &Lab,
    what: &str,
    attack: impl FnOnce(&Path, &AtomicBool) -> usize + Send,
) -> PingFigures {
    let stop = AtomicBool::new(false);
    let socket = lab.socket(1);
    let (out, connections, status_during) = std::thread::scope(|s| {
        let attacker = s.spawn(|| attack(&socket, &stop));
        let status = s.spawn(|| {
            std::thread::sleep(Duration::from_millis(1500));
            let t0 = Instant::now();
            let ok = lab.sh(&["status", "1"]).status.success();
            (ok, t0.elapsed())
        });
        let count = PINGS.to_string();
        let out = lab.exec(
            1,
            &[
                "ping",
                "-n",
                "-i",
                PING_INTERVAL,
                "-c",
                &count,
                "-W",
                "1",
                "198.19.0.2",
            ],
            Duration::from_secs(30),
        );
        stop.store(true, Ordering::Relaxed);
        let connections = attacker.join().expect("attacker");
        (out, connections, status.join().expect("status"))
    });
    let text = String::from_utf8_lossy(&out.stdout);
    let f = ping_figures(&text).unwrap_or_else(|| panic!("ping output: {text}\n{}", lab.log(1)));
    println!(
        "{what}: ping avg {:.3} ms max {:.3} ms, {} over {SLOW_RTT:?}, {}/{} received; \
         {connections} connections; status during: {} in {:?}",
        f.avg_ms,
        f.max_ms,
        f.slow,
        f.received,
        f.sent,
        if status_during.0 {
            "answered"
        } else {
            "FAILED"
        },
        status_during.1
    );
    assert!(
        status_during.0,
        "{what}: status did not answer during the attack"
    );
    let after = lab.status(1);
    assert!(
        after["counters"].is_object(),
        "{what}: status after: {after}"
    );
    f
}

/// Slowloris: clients that send one byte every 100 ms and reconnect once closed.
fn slowloris(socket: &Path, stop: &AtomicBool) -> usize {
    const CLIENTS: usize = 10;
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..CLIENTS)
            .map(|_| {
                s.spawn(|| {
                    let end = Instant::now() + ATTACK;
                    let mut made = 0;
                    while !stop.load(Ordering::Relaxed) && Instant::now() < end && made < 1000 {
                        let Ok(mut c) = UnixStream::connect(socket) else {
                            std::thread::sleep(Duration::from_millis(10));
                            continue;
                        };
                        made += 1;
                        let _ = c.set_read_timeout(Some(Duration::from_millis(100)));
                        let mut sink = [0u8; 256];
                        for _ in 0..100 {
                            if stop.load(Ordering::Relaxed) || Instant::now() >= end {
                                break;
                            }
                            if c.write_all(b"x").is_err() {
                                break;
                            }
                            // Waits out the 100 ms between bytes; an answer means closed.
                            match c.read(&mut sink) {
                                Ok(_) => break,
                                Err(e)
                                    if matches!(
                                        e.kind(),
                                        std::io::ErrorKind::WouldBlock
                                            | std::io::ErrorKind::TimedOut
                                    ) => {}
                                Err(_) => break,
                            }
                        }
                    }
                    made
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap_or(0)).sum()
    })
}

/// 200 connections that never send anything, held until the ping ends.
fn idle(socket: &Path, stop: &AtomicBool) -> usize {
    let held: Vec<UnixStream> = (0..200)
        .filter_map(|_| UnixStream::connect(socket).ok())
        .collect();
    let end = Instant::now() + ATTACK;
    while !stop.load(Ordering::Relaxed) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    held.len()
}

/// Four threads that connect, stay silent 2 ms, hang up and reconnect.
fn reconnecting(socket: &Path, stop: &AtomicBool) -> usize {
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let end = Instant::now() + ATTACK;
                    let mut made = 0;
                    while !stop.load(Ordering::Relaxed) && Instant::now() < end && made < 100_000 {
                        if let Ok(c) = UnixStream::connect(socket) {
                            made += 1;
                            std::thread::sleep(Duration::from_millis(2));
                            drop(c);
                        }
                    }
                    made
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap_or(0)).sum()
    })
}

#[test]
fn control_clients_do_not_stall_the_tunnel() {
    let Some(lab) = Lab::up("e2ec", 2, &[]) else {
        return;
    };
    lab.ping_ok(1, "198.19.0.2", &[]);
    let baseline = ping_during(&lab, "undisturbed", |_, _| 0);
    assert_eq!(
        baseline.received, baseline.sent,
        "undisturbed ping lost packets"
    );
    type Attack = fn(&Path, &AtomicBool) -> usize;
    let attacks: [(&str, Attack); 3] = [
        ("slowloris x10", slowloris),
        ("200 idle", idle),
        ("4 reconnecting", reconnecting),
    ];
    let max_ms = MAX_RTT.as_secs_f64() * 1e3;
    let max_slow = baseline.slow + SLOW_ALLOWED;
    let mut failures = Vec::new();
    for (what, attack) in attacks {
        let f = ping_during(&lab, what, attack);
        if f.received != f.sent {
            failures.push(format!(
                "{what}: {} of {} pings lost",
                f.sent - f.received,
                f.sent
            ));
        }
        if f.max_ms >= max_ms || f.slow > max_slow {
            failures.push(format!(
                "{what}: max RTT {:.3} ms (bound {max_ms:.3} ms), {} replies over {SLOW_RTT:?} \
                 (bound {max_slow}); undisturbed max {:.3} ms",
                f.max_ms, f.slow, baseline.max_ms
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}\n{}", lab.log(1));
}
