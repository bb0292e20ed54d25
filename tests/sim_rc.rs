//! Deterministic simulated-fabric tests of the software RC/UD engine.
//!
//! Every test runs [`SoftVerbs`] nodes on [`sim::Fabric`]: an in-memory wire with a virtual
//! clock, so retransmit timeouts and RNR back-offs cost no wall time, and per-node seeded
//! [`FaultConfig`]s, so every lossy run replays exactly. Every loop is bounded in steps and
//! in virtual time. Fault scenarios print one figure line each (run with `--nocapture`).

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use ipoib_cm::sim::{Fabric, LinkImpairment};
use ipoib_cm::soft::{FaultConfig, Quirks, SoftConfig, SoftStats, SoftVerbs};
use ipoib_cm::verbs::conformance::{self as cf, ConformancePair, Endpoint, RcParams, RecvTarget};
use ipoib_cm::verbs::{
    AsyncEvent, Completion, PathMtu, Psn, QpAttr, QpNum, QpState, SendWr, SrqInit, Verbs, WcStatus,
    WrId,
};
use ipoib_cm::wire::{Bth, IpHeaderInfo, Opcode, RoceRepr};
use proptest::prelude::*;
use proptest::test_runner::{Config as PropConfig, RngSeed};

// -------------------------------------------------------------------------------------------
// Harness
// -------------------------------------------------------------------------------------------

/// The virtual clock's origin. Only differences of virtual instants are ever used.
fn origin() -> Instant {
    Instant::now()
}

/// One transfer scenario: messages both ways over one RC connection.
#[derive(Debug, Clone)]
struct Scenario {
    name: String,
    mtu: PathMtu,
    /// Transmit faults of node 0 (a) and node 1 (b).
    faults: [FaultConfig; 2],
    /// Message sizes sent a→b and b→a, in order.
    sizes: [Vec<usize>; 2],
    /// Most send WRs outstanding per direction.
    depth: usize,
    /// First PSN a and b send.
    psn: (u32, u32),
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    min_rnr_timer: u8,
    /// Receivers post no receive before this much virtual time has passed.
    recv_delay: Duration,
    /// Most receives a receiver keeps posted.
    recv_depth: usize,
    /// The link impaired both ways (b→a with another seed), as by a netem between the nodes.
    link: Option<LinkImpairment>,
}

impl Scenario {
    fn new(name: impl Into<String>, sizes_ab: Vec<usize>) -> Self {
        Self {
            name: name.into(),
            mtu: PathMtu::Mtu1024,
            faults: [FaultConfig::default(); 2],
            sizes: [sizes_ab, Vec::new()],
            depth: 16,
            psn: (0x00_1000, 0x40_0000),
            timeout: 10,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            recv_delay: Duration::ZERO,
            recv_depth: 24,
            link: None,
        }
    }

    /// The same seeded faults on both nodes (b's seed differs from a's).
    fn faults(mut self, f: FaultConfig) -> Self {
        self.faults = [
            f,
            FaultConfig {
                seed: f.seed ^ 0x5A5A_5A5A,
                ..f
            },
        ];
        self
    }
}

fn faults(loss: f64, dup: f64, reorder: f64, corrupt: f64, seed: u64) -> FaultConfig {
    FaultConfig {
        loss_pct: loss,
        dup_pct: dup,
        reorder_pct: reorder,
        corrupt_pct: corrupt,
        seed,
        device_fatal_after: None,
    }
}

/// What a transfer did.
#[derive(Debug, Clone, Copy)]
struct Outcome {
    a: SoftStats,
    b: SoftStats,
    elapsed: Duration,
    steps: usize,
    messages: usize,
    bytes: usize,
}

/// Message `i` of direction `dir`: pseudo-random bytes whose first eight name it.
fn message(dir: usize, i: usize, len: usize) -> Vec<u8> {
    let mut m = cf::pattern(((dir as u64) << 32) | i as u64, len);
    for (d, s) in m.iter_mut().zip((i as u64).to_be_bytes()) {
        *d = s;
    }
    m
}

/// One direction of a transfer.
#[derive(Debug)]
struct Flow {
    from: usize,
    sizes: Vec<usize>,
    next_send: usize,
    sent_done: usize,
    next_recv: usize,
    received: usize,
    tx_crc: crc32fast::Hasher,
    rx_crc: crc32fast::Hasher,
}

impl Flow {
    fn done(&self) -> bool {
        self.received == self.sizes.len() && self.sent_done == self.sizes.len()
    }
}

/// (sender, receiver) of a flow from `from`.
fn by_dir(f: &mut Fabric, from: usize) -> (&mut SoftVerbs, &mut SoftVerbs) {
    let (a, b) = f.providers();
    if from == 0 {
        (a, b)
    } else {
        (b, a)
    }
}

const MAX_STEPS: usize = 4_000_000;
const MAX_VIRTUAL: Duration = Duration::from_secs(3600);

/// Runs `sc` to completion and checks everything arrived intact, in order, exactly once, that
/// every send completed successfully in order, and that no buffer leaked.
fn transfer(sc: &Scenario) -> Outcome {
    let t0 = origin();
    let mut fab = Fabric::with_nodes(2, t0, |i, c| {
        c.port_mtu = PathMtu::Mtu4096;
        c.faults = sc.faults[i];
    });
    if let Some(l) = sc.link {
        fab.impair(0, 1, l);
        fab.impair(
            1,
            0,
            LinkImpairment {
                seed: l.seed ^ 0x5A5A_5A5A,
                ..l
            },
        );
    }
    let max = sc.sizes.iter().flatten().copied().max().unwrap_or(0).max(1);
    let per_node = sc.depth + sc.recv_depth;
    let eps: Vec<Endpoint> = {
        let (a, b) = fab.providers();
        vec![
            cf::open_endpoint(a, max, per_node, 1 << 14).unwrap(),
            cf::open_endpoint(b, max, per_node, 1 << 14).unwrap(),
        ]
    };
    let p = RcParams {
        path_mtu: Some(sc.mtu),
        timeout: sc.timeout,
        retry_cnt: sc.retry_cnt,
        rnr_retry_a: sc.rnr_retry,
        rnr_retry_b: sc.rnr_retry,
        min_rnr_timer: sc.min_rnr_timer,
        psn_a: Psn::new(sc.psn.0),
        psn_b: Psn::new(sc.psn.1),
        max_send_wr: sc.depth as u32,
        max_recv_wr: sc.recv_depth as u32,
        ..RcParams::default()
    };
    let qps = {
        let (a, b) = fab.providers();
        let (qa, qb) = cf::connect_rc(a, &eps[0], b, &eps[1], &p).unwrap();
        [qa, qb]
    };
    let mut flows: Vec<Flow> = (0..2)
        .map(|from| Flow {
            from,
            sizes: sc.sizes[from].clone(),
            next_send: 0,
            sent_done: 0,
            next_recv: 0,
            received: 0,
            tx_crc: crc32fast::Hasher::new(),
            rx_crc: crc32fast::Hasher::new(),
        })
        .collect();
    let name = &sc.name;
    let mut steps = 0;
    let mut cs: Vec<Completion> = Vec::new();
    let mut early_sends = 0;
    while !flows.iter().all(Flow::done) {
        assert!(
            steps < MAX_STEPS && fab.now() - t0 < MAX_VIRTUAL,
            "{name}: no progress bound hit after {steps} steps, {:?} virtual: {flows:?}",
            fab.now() - t0
        );
        let recv_open = fab.now() - t0 >= sc.recv_delay;
        for fl in &mut flows {
            let (from, n) = (fl.from, fl.sizes.len());
            let (tx, rx) = by_dir(&mut fab, from);
            while fl.next_send < n && fl.next_send - fl.sent_done < sc.depth {
                let m = message(from, fl.next_send, fl.sizes[fl.next_send]);
                fl.tx_crc.update(&m);
                cf::post_send_data(tx, qps[from], eps[from].pool, fl.next_send as u64, &m)
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                fl.next_send += 1;
            }
            while recv_open && fl.next_recv < n && fl.next_recv - fl.received < sc.recv_depth {
                let to = 1 - from;
                cf::post_recvs(
                    rx,
                    RecvTarget::Qp(qps[to]),
                    eps[to].pool,
                    fl.next_recv as u64,
                    1,
                )
                .unwrap_or_else(|e| panic!("{name}: {e}"));
                fl.next_recv += 1;
            }
        }
        assert!(
            fab.step(),
            "{name}: the fabric went idle before the transfer finished: {flows:?}"
        );
        steps += 1;
        for fl in &mut flows {
            let from = fl.from;
            let to = 1 - from;
            let (tx, rx) = by_dir(&mut fab, from);
            cs.clear();
            cf::poll_into(tx, eps[from].send_cq, &mut cs);
            for c in &cs {
                assert_eq!(
                    (c.wr_id.0, c.status),
                    (fl.sent_done as u64, WcStatus::Success),
                    "{name}: send completion {c:?} out of order or failed (dir {from})"
                );
                if !recv_open {
                    early_sends += 1;
                }
                tx.pools_mut().free(c.buf.expect("send buffer")).unwrap();
                fl.sent_done += 1;
            }
            cs.clear();
            cf::poll_into(rx, eps[to].recv_cq, &mut cs);
            for c in &cs {
                let i = fl.received;
                assert_eq!(
                    (c.wr_id.0, c.status),
                    (i as u64, WcStatus::Success),
                    "{name}: receive completion {c:?} out of order or failed (dir {from})"
                );
                let want = message(from, i, fl.sizes[i]);
                let buf = c.buf.expect("receive buffer");
                let got = &rx.pools().get(buf).unwrap()[..c.byte_len as usize];
                assert!(
                    got == want.as_slice(),
                    "{name}: message {i} (dir {from}) corrupted: {} bytes received, {} sent",
                    got.len(),
                    want.len()
                );
                fl.rx_crc.update(got);
                rx.pools_mut().free(buf).unwrap();
                fl.received += 1;
            }
        }
    }
    assert_eq!(early_sends, 0, "{name}: sends completed before any receive");
    let elapsed = fab.now() - t0;
    // Exactly once: once the fabric quiesces, nothing more completes anywhere.
    fab.run_idle(200_000, Duration::from_secs(60));
    let (a, b) = fab.providers();
    for (v, ep, who) in [(&mut *a, eps[0], "a"), (&mut *b, eps[1], "b")] {
        cs.clear();
        cf::poll_into(v, ep.send_cq, &mut cs);
        cf::poll_into(v, ep.recv_cq, &mut cs);
        assert!(cs.is_empty(), "{name}: {who} got extra completions {cs:?}");
        assert_eq!(v.pools().posted_count(), 0, "{name}: {who} leaked buffers");
        assert_eq!(
            v.pools().free_count(ep.pool),
            per_node,
            "{name}: {who}'s pool"
        );
    }
    assert_eq!(a.query_qp_state(qps[0]).unwrap(), QpState::Rts);
    assert_eq!(b.query_qp_state(qps[1]).unwrap(), QpState::Rts);
    for fl in flows {
        assert_eq!(
            fl.tx_crc.finalize(),
            fl.rx_crc.finalize(),
            "{name}: checksum of the stream"
        );
    }
    let o = Outcome {
        a: a.stats(),
        b: b.stats(),
        elapsed,
        steps,
        messages: sc.sizes.iter().map(Vec::len).sum(),
        bytes: sc.sizes.iter().flatten().sum(),
    };
    // Corrupted frames never pass: every corruption is caught by the ICRC check.
    let dup = |f: &FaultConfig| f.dup_pct > 0.0;
    for (rx, tx, f) in [(&o.b, &o.a, &sc.faults[0]), (&o.a, &o.b, &sc.faults[1])] {
        assert_eq!(rx.rx_malformed, 0, "{name}: malformed frames {rx:?}");
        if dup(f) {
            assert!(rx.rx_bad_icrc >= tx.faults.corrupted, "{name}: {rx:?}");
        } else {
            assert_eq!(rx.rx_bad_icrc, tx.faults.corrupted, "{name}: ICRC count");
        }
    }
    o
}

/// Prints one line of figures for a scenario.
fn figure(name: &str, o: &Outcome) {
    let f = |s: &SoftStats| {
        format!(
            "drop {} dup {} reord {} corrupt {}",
            s.faults.dropped, s.faults.duplicated, s.faults.reordered, s.faults.corrupted
        )
    };
    println!(
        "[{name}] {} msgs, {} B, {:.2} ms virtual, {} steps | pkts {}+{} retransmits {}+{} \
         timeouts {}+{} seq-NAKs {}+{} RNR-NAKs {}+{} dup-rx {}+{} ooo-rx {}+{} bad-ICRC {}+{} \
         | faults a: {} / b: {}",
        o.messages,
        o.bytes,
        o.elapsed.as_secs_f64() * 1e3,
        o.steps,
        o.a.tx_packets,
        o.b.tx_packets,
        o.a.tx_retransmits,
        o.b.tx_retransmits,
        o.a.retransmit_timeouts,
        o.b.retransmit_timeouts,
        o.a.tx_seq_naks,
        o.b.tx_seq_naks,
        o.a.tx_rnr_naks,
        o.b.tx_rnr_naks,
        o.a.rx_duplicate,
        o.b.rx_duplicate,
        o.a.rx_out_of_sequence,
        o.b.rx_out_of_sequence,
        o.a.rx_bad_icrc,
        o.b.rx_bad_icrc,
        f(&o.a),
        f(&o.b),
    );
}

fn run(sc: &Scenario) -> Outcome {
    let o = transfer(sc);
    figure(&sc.name, &o);
    o
}

/// A mix of sizes around packet boundaries, up to 64 KiB.
fn mixed_sizes(n: usize, mtu: usize, seed: u64) -> Vec<usize> {
    let r = cf::pattern(seed, 2 * n);
    (0..n)
        .map(|i| match (r[2 * i] % 8, r[2 * i + 1] as usize) {
            (0, x) => x % 4,
            (1, _) => mtu,
            (2, _) => mtu + 1,
            (3, _) => mtu - 1,
            (4, x) => (x + 1) * 257,
            (5, _) => 65_536,
            (6, x) => 65_536 - x,
            (_, x) => x * 31 + 1,
        })
        .collect()
}

// -------------------------------------------------------------------------------------------
// Clean transfers
// -------------------------------------------------------------------------------------------

#[test]
fn msgs_64k_at_every_path_mtu() {
    for mtu in [
        PathMtu::Mtu256,
        PathMtu::Mtu512,
        PathMtu::Mtu1024,
        PathMtu::Mtu2048,
        PathMtu::Mtu4096,
    ] {
        let mut sc = Scenario::new(format!("64KiB mtu {}", mtu.bytes()), vec![65_536; 8]);
        sc.mtu = mtu;
        sc.depth = 4;
        let o = run(&sc);
        let pkts_per_msg = 65_536 / mtu.bytes() as u64;
        assert_eq!(
            o.a.tx_packets,
            8 * pkts_per_msg,
            "clean: no packet sent twice"
        );
        assert_eq!(o.a.tx_retransmits + o.b.tx_retransmits, 0);
        assert_eq!(o.a.retransmit_timeouts + o.b.retransmit_timeouts, 0);
    }
}

#[test]
fn bidirectional_mixed_sizes() {
    let mut sc = Scenario::new("bidirectional", mixed_sizes(60, 1024, 1));
    sc.sizes[1] = mixed_sizes(60, 1024, 2);
    run(&sc);
}

#[test]
fn pipelined_1200_messages_many_outstanding() {
    let sizes: Vec<usize> = cf::pattern(77, 1200)
        .iter()
        .map(|b| usize::from(*b) * 9)
        .collect();
    let mut sc = Scenario::new("pipelined 1200", sizes.clone());
    sc.depth = 128;
    sc.recv_depth = 160;
    let o = run(&sc);
    assert_eq!(o.a.retransmit_timeouts, 0);
    // The same with loss and reordering on both sides.
    let mut sc = Scenario::new("pipelined 1200, 3% loss 5% reorder", sizes)
        .faults(faults(3.0, 0.0, 5.0, 0.0, 0xFEED));
    sc.depth = 128;
    sc.recv_depth = 160;
    run(&sc);
}

// -------------------------------------------------------------------------------------------
// Faults
// -------------------------------------------------------------------------------------------

fn fault_scenario(name: &str, f: FaultConfig) -> Outcome {
    let mut sc = Scenario::new(name, mixed_sizes(48, 1024, f.seed)).faults(f);
    sc.sizes[1] = mixed_sizes(16, 1024, f.seed + 1);
    run(&sc)
}

#[test]
fn loss_5_percent() {
    let o = fault_scenario("loss 5%", faults(5.0, 0.0, 0.0, 0.0, 1));
    assert!(o.a.faults.dropped > 0 && o.a.tx_retransmits > 0);
}

#[test]
fn loss_20_percent() {
    let o = fault_scenario("loss 20%", faults(20.0, 0.0, 0.0, 0.0, 2));
    assert!(o.a.faults.dropped > 0 && o.a.retransmit_timeouts > 0);
}

#[test]
fn reorder() {
    let o = fault_scenario("reorder 10%", faults(0.0, 0.0, 10.0, 0.0, 3));
    assert!(o.a.faults.reordered > 0 && o.b.rx_out_of_sequence > 0);
    fault_scenario("reorder 40%", faults(0.0, 0.0, 40.0, 0.0, 4));
}

#[test]
fn duplication() {
    let o = fault_scenario("dup 10%", faults(0.0, 10.0, 0.0, 0.0, 5));
    assert!(o.a.faults.duplicated > 0 && o.b.rx_duplicate > 0);
    fault_scenario("dup 50%", faults(0.0, 50.0, 0.0, 0.0, 6));
}

#[test]
fn corruption_is_caught_by_icrc() {
    let o = fault_scenario("corrupt 5%", faults(0.0, 0.0, 0.0, 5.0, 7));
    assert!(o.a.faults.corrupted > 0);
    assert_eq!(o.b.rx_bad_icrc, o.a.faults.corrupted);
    assert_eq!(o.a.rx_bad_icrc, o.b.faults.corrupted);
    fault_scenario("corrupt 20%", faults(0.0, 0.0, 0.0, 20.0, 8));
}

#[test]
fn combined_faults() {
    fault_scenario("combo 5/5/10/3", faults(5.0, 5.0, 10.0, 3.0, 9));
    fault_scenario("combo 20/10/20/5", faults(20.0, 10.0, 20.0, 5.0, 10));
    // Faults on one side only: a lossy request path with a clean ACK path, and vice versa.
    let mut sc = Scenario::new("a→b path 15% loss only", mixed_sizes(40, 2048, 11));
    sc.mtu = PathMtu::Mtu2048;
    sc.faults[0] = faults(15.0, 0.0, 10.0, 2.0, 11);
    run(&sc);
    let mut sc = Scenario::new("ACK path 30% loss only", mixed_sizes(40, 1024, 12));
    sc.faults[1] = faults(30.0, 5.0, 10.0, 2.0, 12);
    run(&sc);
}

#[test]
fn faults_at_every_path_mtu() {
    for (k, mtu) in [
        PathMtu::Mtu256,
        PathMtu::Mtu512,
        PathMtu::Mtu1024,
        PathMtu::Mtu2048,
        PathMtu::Mtu4096,
    ]
    .into_iter()
    .enumerate()
    {
        let f = faults(5.0, 2.0, 5.0, 2.0, 100 + k as u64);
        let mut sc =
            Scenario::new(format!("64KiB mtu {} combo", mtu.bytes()), vec![65_536; 6]).faults(f);
        sc.mtu = mtu;
        sc.depth = 3;
        run(&sc);
    }
}

// -------------------------------------------------------------------------------------------
// Impaired paths: delay, jitter, reordering and loss between the nodes (a netem on the link)
// -------------------------------------------------------------------------------------------

/// A bulk transfer a→b of 64 KiB messages at path MTU 4096 over a link impaired both ways,
/// with the daemon's default local ACK timeout (`qp_timeout` 12: 16.8 ms), as many messages
/// in flight as IPoIB-CM keeps. Returns the outcome and the request packets the transfer
/// needs (each PSN once).
fn bulk_over(name: &str, link: LinkImpairment, messages: usize) -> (Outcome, u64) {
    let mut sc = Scenario::new(name, vec![65_536; messages]);
    sc.mtu = PathMtu::Mtu4096;
    sc.timeout = 12;
    sc.depth = 128;
    sc.recv_depth = 256;
    sc.link = Some(link);
    let o = run(&sc);
    let packets = (messages * 65_536 / 4096) as u64;
    println!(
        "[{name}] {packets} packets needed, {} retransmitted ({:.3}x), {} timeouts, {} NAKs \
         ({} spurious, wait {} µs), {} held, {:.1} ms virtual ({:.0} Mbit/s)",
        o.a.tx_retransmits,
        o.a.tx_retransmits as f64 / packets as f64,
        o.a.retransmit_timeouts,
        o.b.tx_seq_naks,
        o.b.naks_spurious,
        o.b.nak_wait_us,
        o.b.rx_held,
        o.elapsed.as_secs_f64() * 1e3,
        o.bytes as f64 * 8.0 / o.elapsed.as_secs_f64() / 1e6,
    );
    (o, packets)
}

/// A round trip (40 ms) longer than the local ACK timeout (16.8 ms) costs no spurious
/// resends once the RTT is measured: the retransmit timer follows it. Only the first window,
/// sent before any RTT was measured, may be resent when the timer first fires.
#[test]
fn delay_20ms_over_the_default_timeout_resends_almost_nothing() {
    let link = LinkImpairment {
        delay: Duration::from_millis(20),
        seed: 20,
        ..LinkImpairment::default()
    };
    let (o, packets) = bulk_over("delay 20 ms", link, 1600);
    assert!(
        o.a.tx_retransmits * 50 <= packets,
        "more than 2% resent: {} of {packets}",
        o.a.tx_retransmits
    );
    assert!(o.a.retransmit_timeouts <= 3, "{:?}", o.a);
}

/// [`bulk_over`], asserting the packets retransmitted are at most twice the packets the
/// transfer needs.
fn bulk_resending_at_most_twice(name: &str, link: LinkImpairment, messages: usize) -> Outcome {
    let (o, packets) = bulk_over(name, link, messages);
    assert!(
        o.a.tx_retransmits <= 2 * packets,
        "{name}: {} resent for {packets}",
        o.a.tx_retransmits
    );
    o
}

/// The same transfer over the link with its delay only, in order: how long (virtual) it
/// takes when nothing is reordered, next to which a reordering run's time is read.
fn in_order_reference(name: &str, link: LinkImpairment, messages: usize) -> Duration {
    let plain = LinkImpairment {
        delay: link.delay,
        seed: link.seed,
        ..LinkImpairment::default()
    };
    bulk_over(&format!("{name}, in order"), plain, messages)
        .0
        .elapsed
}

/// Asserts a reordering run took at most four times as long (virtual) as the in-order
/// reference: at least 0.25x of its throughput.
fn at_least_a_quarter_of(name: &str, o: &Outcome, reference: Duration) {
    let ratio = reference.as_secs_f64() / o.elapsed.as_secs_f64();
    println!("[{name}] {ratio:.2}x the in-order throughput");
    assert!(ratio >= 0.25, "{name}: {ratio:.3}x the in-order throughput");
}

/// 25 % of the packets overtake everything sent in the last 5 ms (netem's `reorder`): the
/// transfer completes with retransmitted packets at most twice the packets delivered, and
/// at least a quarter of the throughput of the same link in order (the receiver holds what
/// arrives early instead of dropping it, and learns to wait before NAKing a gap).
#[test]
fn reorder_25_percent_at_5ms_retransmits_at_most_twice_what_it_delivers() {
    let name = "reorder 25% at 5 ms";
    let link = LinkImpairment {
        delay: Duration::from_millis(5),
        reorder_pct: 25.0,
        seed: 25,
        ..LinkImpairment::default()
    };
    let o = bulk_resending_at_most_twice(name, link, 800);
    assert!(
        o.b.rx_held > 0 && o.b.rx_held_delivered == o.b.rx_held,
        "{:?}",
        o.b
    );
    at_least_a_quarter_of(name, &o, in_order_reference(name, link, 800));
}

/// 20 ms ± 10 ms of jitter reorders nearly every packet: the transfer (100 MiB, as the
/// benchmark's) completes with retransmitted packets at most twice the packets delivered,
/// and at least a quarter of the throughput of the same link without the jitter. The
/// receiver drops what arrives early until a NAK proves spurious (as rxe, so that a blind
/// sender's guess must hit the one expected PSN on a path that does not reorder), which
/// costs the first second or so of the transfer; it holds from then on.
#[test]
fn jitter_20ms_plus_minus_10ms_retransmits_at_most_twice_what_it_delivers() {
    let name = "jitter 20 ± 10 ms";
    let link = LinkImpairment {
        delay: Duration::from_millis(20),
        jitter: Duration::from_millis(10),
        seed: 2010,
        ..LinkImpairment::default()
    };
    let o = bulk_resending_at_most_twice(name, link, 1600);
    at_least_a_quarter_of(name, &o, in_order_reference(name, link, 1600));
}

/// 5 % loss both ways on a 5 ms link: the send window shrinks, so each go-back-N resends a
/// few packets rather than the whole window, and the transfer completes.
#[test]
fn loss_5_percent_on_a_5ms_link_retransmits_at_most_twice_what_it_delivers() {
    let link = LinkImpairment {
        delay: Duration::from_millis(5),
        loss_pct: 5.0,
        seed: 5,
        ..LinkImpairment::default()
    };
    bulk_resending_at_most_twice("loss 5% at 5 ms", link, 400);
}

// -------------------------------------------------------------------------------------------
// PSN wrap-around
// -------------------------------------------------------------------------------------------

#[test]
fn psn_wraps_around() {
    let mut sizes = vec![65_536; 4];
    sizes.extend(mixed_sizes(20, 256, 13));
    let mut sc = Scenario::new("PSN wrap, clean", sizes.clone());
    sc.mtu = PathMtu::Mtu256;
    sc.psn = (0xFF_FFF0, 0xFF_FFFA);
    sc.sizes[1] = mixed_sizes(20, 256, 14);
    let o = run(&sc);
    assert!(o.a.tx_packets > 0x10, "the PSN space wrapped");
    let mut sc = Scenario::new("PSN wrap, 10% loss + reorder", sizes)
        .faults(faults(10.0, 2.0, 10.0, 1.0, 15));
    sc.mtu = PathMtu::Mtu256;
    sc.psn = (0xFF_FF80, 0xFF_FFFF);
    sc.sizes[1] = mixed_sizes(20, 256, 16);
    run(&sc);
}

// -------------------------------------------------------------------------------------------
// RNR
// -------------------------------------------------------------------------------------------

#[test]
fn rnr_then_success() {
    let mut sc = Scenario::new("RNR then success", mixed_sizes(30, 1024, 17));
    sc.recv_delay = Duration::from_millis(30);
    sc.min_rnr_timer = 14; // 1.28 ms
    let o = run(&sc);
    assert!(o.b.tx_rnr_naks > 5, "{:?}", o.b);
    assert_eq!(o.a.rx_rnr_naks, o.b.tx_rnr_naks);
    assert!(o.elapsed >= Duration::from_millis(30));
    // With faults as well, and a receiver that keeps only two receives posted.
    let mut sc = Scenario::new("RNR trickle + faults", mixed_sizes(30, 1024, 18))
        .faults(faults(5.0, 5.0, 5.0, 2.0, 18));
    sc.recv_delay = Duration::from_millis(5);
    sc.recv_depth = 2;
    run(&sc);
}

/// Connects a and b on a fresh two-node fabric.
fn pair(p: &RcParams, quirks: Quirks) -> (Fabric, Endpoint, Endpoint, QpNum, QpNum) {
    let mut fab = Fabric::with_nodes(2, origin(), |_, c| {
        c.port_mtu = PathMtu::Mtu4096;
        c.quirks = quirks;
    });
    let (a, b) = fab.providers();
    let ea = cf::open_endpoint(a, 8192, 64, 1024).unwrap();
    let eb = cf::open_endpoint(b, 8192, 64, 1024).unwrap();
    let (qa, qb) = cf::connect_rc(a, &ea, b, &eb, p).unwrap();
    (fab, ea, eb, qa, qb)
}

fn poll(v: &mut SoftVerbs, cq: ipoib_cm::verbs::CqId) -> Vec<(u64, WcStatus)> {
    let mut cs = Vec::new();
    cf::poll_into(v, cq, &mut cs);
    cf::free_bufs(v, &cs);
    cs.iter().map(|c| (c.wr_id.0, c.status)).collect()
}

/// RNR retries are a per-episode budget: an ACK resets them (rxe `reset_retry_counters`),
/// so separate RNR episodes never add up to `RnrRetryExcErr`.
#[test]
fn rnr_retry_budget_resets_on_ack() {
    let p = RcParams {
        rnr_retry_a: 1,
        min_rnr_timer: 1,
        ..RcParams::default()
    };
    let (mut fab, ea, eb, qa, qb) = pair(&p, Quirks::default());
    for i in 0..5u64 {
        let (a, _) = fab.providers();
        cf::post_send_data(a, qa, ea.pool, i, &cf::pattern(i, 100)).unwrap();
        // One RNR NAK (uses the one retry), then a receive appears.
        fab.run_until(1000, Duration::from_secs(1), |f| {
            f.nodes[0].stats().rx_rnr_naks > i
        });
        let (a, b) = fab.providers();
        assert_eq!(a.stats().rx_rnr_naks, i + 1, "episode {i}");
        cf::post_recvs(b, RecvTarget::Qp(qb), eb.pool, i, 1).unwrap();
        fab.settle();
        let (a, b) = fab.providers();
        assert_eq!(
            poll(a, ea.send_cq),
            [(i, WcStatus::Success)],
            "episode {i}: the send failed after one RNR NAK"
        );
        assert_eq!(poll(b, eb.recv_cq), [(i, WcStatus::Success)]);
    }
    println!("[RNR budget reset] {:?}", fab.nodes[0].stats().rx_rnr_naks);
}

#[test]
fn rnr_retry_exhaustion_counts_naks() {
    for rnr_retry in 0..=6u8 {
        let p = RcParams {
            rnr_retry_a: rnr_retry,
            min_rnr_timer: 1,
            ..RcParams::default()
        };
        let (mut fab, ea, _eb, qa, _qb) = pair(&p, Quirks::default());
        let (a, _) = fab.providers();
        for i in 0..3 {
            cf::post_send_data(a, qa, ea.pool, i, &cf::pattern(i, 3000)).unwrap();
        }
        fab.settle();
        let (a, _) = fab.providers();
        let flush = WcStatus::WrFlushErr;
        assert_eq!(
            poll(a, ea.send_cq),
            [(0, WcStatus::RnrRetryExcErr), (1, flush), (2, flush)]
        );
        assert_eq!(a.query_qp_state(qa).unwrap(), QpState::Err);
        assert_eq!(a.stats().rx_rnr_naks, u64::from(rnr_retry) + 1);
        assert_eq!(a.pools().posted_count(), 0);
    }
}

/// A duplicated RNR NAK is one RNR episode, not two: with `rnr_retry` 1 and a wire that
/// duplicates every response, one RNR NAK followed by a receive still succeeds.
#[test]
fn duplicated_rnr_nak_spends_one_retry() {
    let p = RcParams {
        rnr_retry_a: 1,
        min_rnr_timer: 14,
        ..RcParams::default()
    };
    let mut fab = Fabric::with_nodes(2, origin(), |i, c| {
        if i == 1 {
            c.faults = faults(0.0, 100.0, 0.0, 0.0, 1);
        }
    });
    let (a, b) = fab.providers();
    let ea = cf::open_endpoint(a, 8192, 16, 64).unwrap();
    let eb = cf::open_endpoint(b, 8192, 16, 64).unwrap();
    let (qa, qb) = cf::connect_rc(a, &ea, b, &eb, &p).unwrap();
    cf::post_send_data(a, qa, ea.pool, 0, &[1; 300]).unwrap();
    fab.run_until(1000, Duration::from_secs(1), |f| {
        f.nodes[0].stats().rx_rnr_naks >= 2
    });
    let (a, b) = fab.providers();
    assert_eq!((b.stats().tx_rnr_naks, a.stats().rx_rnr_naks), (1, 2));
    cf::post_recvs(b, RecvTarget::Qp(qb), eb.pool, 0, 1).unwrap();
    fab.settle();
    let (a, b) = fab.providers();
    assert_eq!(poll(a, ea.send_cq), [(0, WcStatus::Success)]);
    assert_eq!(poll(b, eb.recv_cq), [(0, WcStatus::Success)]);
}

// -------------------------------------------------------------------------------------------
// Retry exhaustion and flush
// -------------------------------------------------------------------------------------------

#[test]
fn retry_exhaustion_then_everything_flushes() {
    for (retry_cnt, loss) in [(0u8, 0.0), (3, 0.0), (7, 0.0), (5, 10.0)] {
        let p = RcParams {
            timeout: 12, // 16.8 ms
            retry_cnt,
            ..RcParams::default()
        };
        let mut fab = Fabric::with_nodes(2, origin(), |i, c| {
            c.faults = faults(loss, 0.0, 0.0, 0.0, 40 + i as u64);
        });
        let (a, b) = fab.providers();
        let ea = cf::open_endpoint(a, 8192, 64, 1024).unwrap();
        let eb = cf::open_endpoint(b, 8192, 64, 1024).unwrap();
        let (qa, qb) = cf::connect_rc(a, &ea, b, &eb, &p).unwrap();
        cf::post_recvs(b, RecvTarget::Qp(qb), eb.pool, 0, 3).unwrap();
        cf::post_recvs(a, RecvTarget::Qp(qa), ea.pool, 100, 2).unwrap();
        for i in 0..3 {
            cf::post_send_data(a, qa, ea.pool, i, &cf::pattern(i, 5000)).unwrap();
        }
        let ok = fab.run_until(100_000, Duration::from_secs(60), |f| {
            f.nodes[0].stats().tx_packets > 0 && f.nodes[1].pools().posted_count() == 0
        });
        assert!(ok, "the first three messages did not arrive");
        fab.settle();
        let (a, b) = fab.providers();
        assert_eq!(poll(a, ea.send_cq).len(), 3);
        assert_eq!(poll(b, eb.recv_cq).len(), 3);
        let before = a.stats();
        // b vanishes: everything it sends is lost.
        fab.partitioned[1] = true;
        let (a, _) = fab.providers();
        for i in 3..8 {
            cf::post_send_data(a, qa, ea.pool, i, &cf::pattern(i, 3000)).unwrap();
        }
        let t0 = fab.now();
        fab.run_until(100_000, Duration::from_secs(60), |f| {
            f.nodes[0].query_qp_state(qa) == Ok(QpState::Err)
        });
        let took = fab.now() - t0;
        let (a, _) = fab.providers();
        let flush = WcStatus::WrFlushErr;
        let mut want = vec![(3, WcStatus::RetryExcErr)];
        want.extend((4..8).map(|i| (i, flush)));
        assert_eq!(poll(a, ea.send_cq), want, "retry_cnt {retry_cnt}");
        assert_eq!(poll(a, ea.recv_cq), [(100, flush), (101, flush)]);
        let timeouts = a.stats().retransmit_timeouts - before.retransmit_timeouts;
        assert_eq!(timeouts, u64::from(retry_cnt) + 1, "retry_cnt {retry_cnt}");
        let interval = Duration::from_nanos(4096 << 12);
        assert!(took >= interval * (u32::from(retry_cnt) + 1), "{took:?}");
        // Later WRs are flushed too, in order, signaled or not.
        cf::post_send_data(a, qa, ea.pool, 8, &[1, 2, 3]).unwrap();
        a.post_send(
            qa,
            &SendWr {
                signaled: false,
                ..SendWr::empty(WrId(9))
            },
        )
        .unwrap();
        cf::post_recvs(a, RecvTarget::Qp(qa), ea.pool, 102, 1).unwrap();
        fab.settle();
        let (a, _) = fab.providers();
        assert_eq!(poll(a, ea.send_cq), [(8, flush), (9, flush)]);
        assert_eq!(poll(a, ea.recv_cq), [(102, flush)]);
        assert_eq!(a.pools().posted_count(), 0);
        println!(
            "[retry exhaustion retry_cnt {retry_cnt} loss {loss}%] failed after {:.1} ms \
             virtual, {timeouts} timeouts, {} retransmits",
            took.as_secs_f64() * 1e3,
            a.stats().tx_retransmits
        );
    }
}

/// A QP moved to ERR in the middle of a long message: the sender's WRs flush; the receiver's
/// half-filled receive completes with `WrFlushErr` when it goes to ERR, and the receives
/// behind it as well.
#[test]
fn flush_mid_message() {
    let p = RcParams {
        path_mtu: Some(PathMtu::Mtu256),
        ..RcParams::default()
    };
    let mut fab = Fabric::with_nodes(2, origin(), |_, _| {});
    let (a, b) = fab.providers();
    let ea = cf::open_endpoint(a, 65_536, 16, 1024).unwrap();
    let eb = cf::open_endpoint(b, 65_536, 16, 1024).unwrap();
    let (qa, qb) = cf::connect_rc(a, &ea, b, &eb, &p).unwrap();
    cf::post_recvs(b, RecvTarget::Qp(qb), eb.pool, 0, 3).unwrap();
    for i in 0..3 {
        cf::post_send_data(a, qa, ea.pool, i, &cf::pattern(i, 65_536)).unwrap();
    }
    // Let a few dozen packets of the first message through.
    fab.run_until(1000, Duration::from_secs(1), |f| {
        f.nodes[1].stats().rx_datagrams >= 40
    });
    let (a, b) = fab.providers();
    assert!(poll(b, eb.recv_cq).is_empty());
    a.modify_qp(qa, &QpAttr::to_state(QpState::Err)).unwrap();
    let flush = WcStatus::WrFlushErr;
    assert_eq!(poll(a, ea.send_cq), [(0, flush), (1, flush), (2, flush)]);
    fab.settle();
    let (_, b) = fab.providers();
    assert!(poll(b, eb.recv_cq).is_empty(), "b is still in RTS");
    b.modify_qp(qb, &QpAttr::to_state(QpState::Err)).unwrap();
    assert_eq!(poll(b, eb.recv_cq), [(0, flush), (1, flush), (2, flush)]);
    let (a, b) = fab.providers();
    assert_eq!(a.pools().posted_count() + b.pools().posted_count(), 0);
}

/// SQD finishes the messages it has begun, recovering their lost packets, starts no new one,
/// and raises `SqDrained` only once the begun ones completed; back in RTS the rest goes out.
#[test]
fn sqd_drains_begun_messages_and_recovers_losses() {
    let p = RcParams {
        timeout: 10,
        ..RcParams::default()
    };
    let mut fab = Fabric::with_nodes(2, origin(), |_, _| {});
    let (a, b) = fab.providers();
    let ea = cf::open_endpoint(a, 8192, 16, 64).unwrap();
    let eb = cf::open_endpoint(b, 8192, 16, 64).unwrap();
    let (qa, qb) = cf::connect_rc(a, &ea, b, &eb, &p).unwrap();
    cf::post_recvs(b, RecvTarget::Qp(qb), eb.pool, 0, 4).unwrap();
    cf::post_send_data(a, qa, ea.pool, 0, &cf::pattern(0, 3000)).unwrap();
    // Everything a sends now (all of message 0) is lost.
    fab.partitioned[0] = true;
    fab.transmit();
    fab.partitioned[0] = false;
    let (a, _) = fab.providers();
    cf::drain_events(a);
    let sqd = QpAttr {
        en_sqd_async_notify: Some(true),
        ..QpAttr::to_state(QpState::Sqd)
    };
    a.modify_qp(qa, &sqd).unwrap();
    assert!(
        cf::drain_events(a).is_empty(),
        "SqDrained with a message in flight"
    );
    // Posted in SQD: not started until RTS again.
    cf::post_send_data(a, qa, ea.pool, 1, &cf::pattern(1, 100)).unwrap();
    fab.settle();
    let (a, b) = fab.providers();
    assert_eq!(poll(a, ea.send_cq), [(0, WcStatus::Success)]);
    assert_eq!(poll(b, eb.recv_cq), [(0, WcStatus::Success)]);
    assert_eq!(cf::drain_events(a), [AsyncEvent::SqDrained(qa)]);
    assert_eq!(a.stats().retransmit_timeouts, 1);
    assert_eq!(a.query_qp_state(qa).unwrap(), QpState::Sqd);
    a.modify_qp(qa, &QpAttr::to_state(QpState::Rts)).unwrap();
    fab.settle();
    let (a, b) = fab.providers();
    assert_eq!(poll(a, ea.send_cq), [(1, WcStatus::Success)]);
    assert_eq!(poll(b, eb.recv_cq), [(1, WcStatus::Success)]);
    // A move to SQD with nothing in flight reports the drain at once.
    a.modify_qp(qa, &sqd).unwrap();
    assert_eq!(cf::drain_events(a), [AsyncEvent::SqDrained(qa)]);
}

/// A message longer than the receive buffer: the receiver completes that receive with
/// `LocLenErr` and goes to ERR (raising `QpReqErr`); the sender gets `RemInvReqErr` (NAK
/// invalid request) and goes to ERR; everything behind flushes on both sides.
#[test]
fn message_longer_than_receive_buffer() {
    let mut fab = Fabric::with_nodes(2, origin(), |_, _| {});
    let (a, b) = fab.providers();
    let ea = cf::open_endpoint(a, 8192, 16, 64).unwrap();
    let eb = cf::open_endpoint(b, 1000, 16, 64).unwrap();
    let (qa, qb) = cf::connect_rc(a, &ea, b, &eb, &RcParams::default()).unwrap();
    cf::post_recvs(b, RecvTarget::Qp(qb), eb.pool, 0, 3).unwrap();
    for (i, len) in [500, 3000, 30].into_iter().enumerate() {
        cf::post_send_data(a, qa, ea.pool, i as u64, &cf::pattern(i as u64, len)).unwrap();
    }
    fab.settle();
    let (a, b) = fab.providers();
    let flush = WcStatus::WrFlushErr;
    assert_eq!(
        poll(a, ea.send_cq),
        [
            (0, WcStatus::Success),
            (1, WcStatus::RemInvReqErr),
            (2, flush)
        ]
    );
    assert_eq!(
        poll(b, eb.recv_cq),
        [(0, WcStatus::Success), (1, WcStatus::LocLenErr), (2, flush)]
    );
    assert_eq!(a.query_qp_state(qa).unwrap(), QpState::Err);
    assert_eq!(b.query_qp_state(qb).unwrap(), QpState::Err);
    assert!(cf::drain_events(b).contains(&AsyncEvent::QpReqErr(qb)));
    assert_eq!(a.pools().posted_count() + b.pools().posted_count(), 0);
}

/// Two senders into one SRQ on a third node, with faults: every message of each sender
/// arrives intact and in that sender's order, and the SRQ limit event fires once.
#[test]
fn srq_fan_in_from_two_peers_with_faults() {
    const N: u64 = 60;
    let mut fab = Fabric::with_nodes(3, origin(), |i, c| {
        c.faults = faults(5.0, 3.0, 5.0, 2.0, 60 + i as u64);
    });
    let eps: Vec<Endpoint> = fab
        .nodes
        .iter_mut()
        .map(|v| cf::open_endpoint(v, 4096, 160, 1024).unwrap())
        .collect();
    let srq = fab.nodes[2]
        .create_srq(&SrqInit {
            pd: eps[2].pd,
            max_wr: 128,
            limit: 0,
        })
        .unwrap();
    let mut qps = Vec::new();
    for s in 0..2 {
        let p = RcParams {
            srq_b: Some(srq),
            timeout: 10,
            ..RcParams::default()
        };
        let (head, tail) = fab.nodes.split_at_mut(2);
        let (qs, qr) = cf::connect_rc(&mut head[s], &eps[s], &mut tail[0], &eps[2], &p).unwrap();
        qps.push((qs, qr));
    }
    cf::post_recvs(
        &mut fab.nodes[2],
        RecvTarget::Srq(srq),
        eps[2].pool,
        0,
        2 * N as usize,
    )
    .unwrap();
    fab.nodes[2].modify_srq(srq, 8).unwrap();
    for s in 0..2 {
        for i in 0..N {
            let m = message(s, i as usize, (i as usize * 61) % 4000);
            cf::post_send_data(&mut fab.nodes[s], qps[s].0, eps[s].pool, i, &m).unwrap();
        }
    }
    let ok = fab.run_until(1_000_000, Duration::from_secs(600), |f| {
        f.nodes[2].pools().posted_count() == 0
            && f.nodes[0].pools().posted_count() == 0
            && f.nodes[1].pools().posted_count() == 0
    });
    assert!(ok, "fan-in did not finish");
    let mut cs = Vec::new();
    cf::poll_into(&mut fab.nodes[2], eps[2].recv_cq, &mut cs);
    assert_eq!(cs.len(), 2 * N as usize);
    let mut next = [0usize; 2];
    for c in &cs {
        assert_eq!(c.status, WcStatus::Success);
        let s = qps.iter().position(|q| q.1 == c.qp).expect("a known QP");
        let want = message(s, next[s], (next[s] * 61) % 4000);
        let got = fab.nodes[2].pools().get(c.buf.unwrap()).unwrap();
        assert_eq!(
            &got[..c.byte_len as usize],
            &want[..],
            "sender {s} message {}",
            next[s]
        );
        next[s] += 1;
    }
    let limit_events = cf::drain_events(&mut fab.nodes[2])
        .into_iter()
        .filter(|e| *e == AsyncEvent::SrqLimitReached(srq))
        .count();
    assert_eq!(limit_events, 1);
    for (node, ep) in fab.nodes.iter_mut().zip(&eps).take(2) {
        assert_eq!(poll(node, ep.send_cq).len(), N as usize);
    }
    let st = fab.nodes[2].stats();
    println!(
        "[SRQ fan-in 2x{N}] receiver: bad-ICRC {} dup-rx {} ooo-rx {} seq-NAKs {} ACKs {}",
        st.rx_bad_icrc, st.rx_duplicate, st.rx_out_of_sequence, st.tx_seq_naks, st.tx_acks
    );
}

/// ERR → RESET → INIT → RTR → RTS with new PSNs: the QP pair works again, and packets of
/// the old incarnation still on the wire are not taken for new ones.
#[test]
fn reset_and_reconnect() {
    let mut fab = Fabric::with_nodes(2, origin(), |_, _| {});
    let (a, b) = fab.providers();
    let ea = cf::open_endpoint(a, 8192, 16, 64).unwrap();
    let eb = cf::open_endpoint(b, 8192, 16, 64).unwrap();
    let (qa, qb) = cf::connect_rc(a, &ea, b, &eb, &RcParams::default()).unwrap();
    cf::post_recvs(b, RecvTarget::Qp(qb), eb.pool, 0, 2).unwrap();
    cf::post_send_data(a, qa, ea.pool, 0, &cf::pattern(0, 500)).unwrap();
    cf::post_send_data(a, qa, ea.pool, 1, &cf::pattern(1, 5000)).unwrap();
    // Both messages are on the wire when both sides reset; they arrive at the new
    // incarnation, whose PSNs are elsewhere, and must be dropped.
    fab.transmit();
    let (a, b) = fab.providers();
    for (v, q) in [(&mut *a, qa), (&mut *b, qb)] {
        v.modify_qp(q, &QpAttr::to_state(QpState::Err)).unwrap();
        v.modify_qp(q, &QpAttr::to_state(QpState::Reset)).unwrap();
    }
    let flush = WcStatus::WrFlushErr;
    assert_eq!(poll(a, ea.send_cq), [(0, flush), (1, flush)]);
    assert_eq!(poll(b, eb.recv_cq), [(0, flush), (1, flush)]);
    let mtu = PathMtu::Mtu1024;
    let (ga, gb) = (a.port_attr().gid, b.port_attr().gid);
    a.modify_qp(qa, &cf::rc_init_attr()).unwrap();
    b.modify_qp(qb, &cf::rc_init_attr()).unwrap();
    cf::post_recvs(b, RecvTarget::Qp(qb), eb.pool, 10, 2).unwrap();
    a.modify_qp(qa, &cf::rc_rtr_attr((gb, qb), mtu, Psn::new(0x77), 1))
        .unwrap();
    b.modify_qp(qb, &cf::rc_rtr_attr((ga, qa), mtu, Psn::new(0x9000), 1))
        .unwrap();
    a.modify_qp(qa, &cf::rc_rts_attr(10, 7, 7, Psn::new(0x9000)))
        .unwrap();
    b.modify_qp(qb, &cf::rc_rts_attr(10, 7, 7, Psn::new(0x77)))
        .unwrap();
    cf::post_send_data(a, qa, ea.pool, 10, &cf::pattern(10, 4000)).unwrap();
    fab.settle();
    let (a, b) = fab.providers();
    assert_eq!(poll(a, ea.send_cq), [(10, WcStatus::Success)]);
    let mut cs = Vec::new();
    cf::poll_into(b, eb.recv_cq, &mut cs);
    assert_eq!(cs.len(), 1, "{cs:?}");
    assert_eq!(
        &b.pools().get(cs[0].buf.unwrap()).unwrap()[..4000],
        &cf::pattern(10, 4000)[..]
    );
    assert!(b.stats().rx_bad_state + b.stats().rx_out_of_sequence + b.stats().rx_duplicate > 0);
}

// -------------------------------------------------------------------------------------------
// Last WQE Reached and the drain WR, with and without quirks
// -------------------------------------------------------------------------------------------

/// An SRQ-attached QP on b, one message received; then b's QP goes to ERR and a drain WR is
/// posted on it. Returns the Last WQE events for the QP and whether the drain WR completed.
fn srq_err_and_drain(quirks: Quirks) -> (usize, Option<WcStatus>) {
    let mut fab = Fabric::with_nodes(2, origin(), |i, c| {
        if i == 1 {
            c.quirks = quirks;
        }
    });
    let (a, b) = fab.providers();
    let ea = cf::open_endpoint(a, 8192, 16, 1024).unwrap();
    let eb = cf::open_endpoint(b, 8192, 16, 1024).unwrap();
    let srq = b
        .create_srq(&SrqInit {
            pd: eb.pd,
            max_wr: 8,
            limit: 0,
        })
        .unwrap();
    let p = RcParams {
        srq_b: Some(srq),
        ..RcParams::default()
    };
    let (qa, qb) = cf::connect_rc(a, &ea, b, &eb, &p).unwrap();
    cf::post_recvs(b, RecvTarget::Srq(srq), eb.pool, 0, 4).unwrap();
    cf::post_send_data(a, qa, ea.pool, 0, &[7; 100]).unwrap();
    fab.settle();
    let (_, b) = fab.providers();
    assert_eq!(poll(b, eb.recv_cq), [(0, WcStatus::Success)]);
    cf::drain_events(b);
    b.modify_qp(qb, &QpAttr::to_state(QpState::Err)).unwrap();
    b.post_send(qb, &SendWr::empty(WrId(99))).unwrap();
    fab.settle();
    let (_, b) = fab.providers();
    let events = cf::drain_events(b)
        .into_iter()
        .filter(|e| *e == AsyncEvent::QpLastWqeReached(qb))
        .count();
    let drain = poll(b, eb.send_cq).first().map(|c| c.1);
    // Whatever the quirks, destroying the QP and the SRQ returns every buffer.
    b.destroy_qp(qb).unwrap();
    b.destroy_srq(srq).unwrap();
    assert_eq!(b.pools().posted_count(), 0, "{quirks:?}");
    (events, drain)
}

#[test]
fn last_wqe_and_drain_without_quirks() {
    assert_eq!(
        srq_err_and_drain(Quirks::default()),
        (1, Some(WcStatus::WrFlushErr))
    );
}

#[test]
fn quirk_drain_never() {
    let q = Quirks {
        drain_never: true,
        ..Quirks::default()
    };
    assert_eq!(
        srq_err_and_drain(q),
        (1, None),
        "the drain WR never completes"
    );
    // The conformance suite notices.
    let mut fab = Fabric::with_nodes(2, origin(), |_, c| c.quirks = q);
    assert!(cf::run_one(&mut fab, "drain_wr_after_err").is_err());
}

#[test]
fn quirk_no_last_wqe() {
    let q = Quirks {
        no_last_wqe: true,
        ..Quirks::default()
    };
    assert_eq!(srq_err_and_drain(q), (0, Some(WcStatus::WrFlushErr)));
    let mut fab = Fabric::with_nodes(2, origin(), |_, c| c.quirks = q);
    assert!(cf::run_one(&mut fab, "srq_last_wqe_once").is_err());
}

#[test]
fn quirk_dup_last_wqe() {
    let q = Quirks {
        dup_last_wqe: true,
        ..Quirks::default()
    };
    assert_eq!(srq_err_and_drain(q), (2, Some(WcStatus::WrFlushErr)));
    let mut fab = Fabric::with_nodes(2, origin(), |_, c| c.quirks = q);
    assert!(cf::run_one(&mut fab, "srq_last_wqe_once").is_err());
}

// -------------------------------------------------------------------------------------------
// Spoofing and validation
// -------------------------------------------------------------------------------------------

fn ip4(last: u8) -> IpAddr {
    IpAddr::from([198, 18, 0, last])
}

/// A datagram from `src` to `dst` with a correct ICRC for that pair of addresses.
fn datagram(repr: &RoceRepr, payload: &[u8], src: IpAddr, dst: IpAddr) -> Vec<u8> {
    let ip = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => IpHeaderInfo::V4 {
            src: s,
            dst: d,
            identification: 0,
            dont_fragment: true,
        },
        (IpAddr::V6(s), IpAddr::V6(d)) => IpHeaderInfo::V6 { src: s, dst: d },
        _ => unreachable!(),
    };
    let mut out = Vec::new();
    repr.emit(payload, &ip, 4791, 4791, &mut out);
    out
}

#[test]
fn spoofed_and_invalid_datagrams_are_counted_and_dropped() {
    // Three nodes: a and b are connected, c is a third host on the same wire.
    let mut fab = Fabric::with_nodes(3, origin(), |_, _| {});
    let p = RcParams::default();
    let (ea, eb, qa, qb) = {
        let (head, rest) = fab.nodes.split_at_mut(1);
        let (a, b) = (&mut head[0], &mut rest[0]);
        let ea = cf::open_endpoint(a, 4096, 16, 64).unwrap();
        let eb = cf::open_endpoint(b, 4096, 16, 64).unwrap();
        let (qa, qb) = cf::connect_rc(a, &ea, b, &eb, &p).unwrap();
        cf::post_recvs(b, RecvTarget::Qp(qb), eb.pool, 0, 4).unwrap();
        (ea, eb, qa, qb)
    };
    let (a_ip, b_ip, c_ip) = (ip4(1), ip4(2), ip4(3));
    let port = 4791;
    // A perfectly formed SEND_ONLY with the PSN b expects next.
    let send = |qpn: QpNum| {
        let mut bth = Bth::new(Opcode::RC_SEND_ONLY, qpn.get(), p.psn_a.get());
        bth.ack_req = true;
        RoceRepr::new(bth)
    };
    let payload = [0xAA; 64];
    let now = fab.now();
    let b = &mut fab.nodes[1];
    let before = b.stats();
    let feed = |b: &mut SoftVerbs, from: IpAddr, d: &[u8]| {
        b.handle_datagram(now, SocketAddr::new(from, port), b_ip, d);
    };
    // 1. From a host that is not the QP's peer (valid ICRC for c → b).
    feed(b, c_ip, &datagram(&send(qb), &payload, c_ip, b_ip));
    // 2. Wrong P_Key.
    let mut r = send(qb);
    r.bth.pkey = 0x1234;
    feed(b, a_ip, &datagram(&r, &payload, a_ip, b_ip));
    // 3. Unknown QPN.
    feed(
        b,
        a_ip,
        &datagram(&send(QpNum::new(0xABCDE)), &payload, a_ip, b_ip),
    );
    // 4. Bad ICRC: a's packet, one payload bit flipped.
    let mut d = datagram(&send(qb), &payload, a_ip, b_ip);
    d[20] ^= 0x10;
    feed(b, a_ip, &d);
    // 5. The ICRC of a → b, but claiming to come from c (address spoofing breaks the ICRC).
    feed(b, c_ip, &datagram(&send(qb), &payload, a_ip, b_ip));
    // 6. TVer 1.
    let mut r = send(qb);
    r.bth.tver = 1;
    feed(b, a_ip, &datagram(&r, &payload, a_ip, b_ip));
    // 7. Not RoCE at all.
    feed(b, a_ip, &[1, 2, 3]);
    // 8. An RDMA WRITE, which this QP does not accept.
    let w = RoceRepr {
        reth: Some(ipoib_cm::wire::Reth {
            va: 0,
            rkey: 0,
            dma_len: 64,
        }),
        ..RoceRepr::new(Bth::new(
            Opcode::RC_RDMA_WRITE_ONLY,
            qb.get(),
            p.psn_a.get(),
        ))
    };
    feed(b, a_ip, &datagram(&w, &payload, a_ip, b_ip));
    let s = b.stats();
    assert_eq!(s.rx_datagrams - before.rx_datagrams, 8);
    assert_eq!(s.rx_bad_src - before.rx_bad_src, 1, "{s:?}");
    assert_eq!(s.rx_bad_pkey - before.rx_bad_pkey, 1, "{s:?}");
    assert_eq!(s.rx_unknown_qpn - before.rx_unknown_qpn, 1, "{s:?}");
    assert_eq!(s.rx_bad_icrc - before.rx_bad_icrc, 2, "{s:?}");
    assert_eq!(s.rx_bad_tver - before.rx_bad_tver, 1, "{s:?}");
    assert_eq!(s.rx_malformed - before.rx_malformed, 1, "{s:?}");
    assert_eq!(s.rx_bad_state - before.rx_bad_state, 1, "{s:?}");
    assert_eq!(
        s.tx_acks + s.tx_seq_naks + s.tx_other_naks,
        0,
        "nothing answered"
    );
    assert!(poll(b, eb.recv_cq).is_empty(), "nothing delivered");
    assert_eq!(b.pools().posted_count(), 4);
    // A spoofed ACK from c does not retire a's WQE either.
    let ack = RoceRepr {
        aeth: Some(ipoib_cm::wire::Aeth {
            syndrome: ipoib_cm::wire::Syndrome::Ack { credits: 0x1F },
            msn: 1,
        }),
        ..RoceRepr::new(Bth::new(Opcode::RC_ACKNOWLEDGE, qa.get(), p.psn_a.get()))
    };
    let a = &mut fab.nodes[0];
    cf::post_send_data(a, qa, ea.pool, 0, &payload).unwrap();
    let a_before = a.stats();
    a.handle_datagram(
        now,
        SocketAddr::new(c_ip, port),
        a_ip,
        &datagram(&ack, &[], c_ip, a_ip),
    );
    assert_eq!(a.stats().rx_bad_src, a_before.rx_bad_src + 1);
    assert!(poll(a, ea.send_cq).is_empty());
    // The real message from a, with the PSN the spoofed one carried, is delivered intact.
    fab.settle();
    let b = &mut fab.nodes[1];
    let mut cs = Vec::new();
    cf::poll_into(b, eb.recv_cq, &mut cs);
    assert_eq!(cs.len(), 1);
    assert_eq!(cs[0].status, WcStatus::Success);
    assert_eq!(
        &b.pools().get(cs[0].buf.unwrap()).unwrap()[..64],
        &payload[..]
    );
    assert_eq!(
        poll(&mut fab.nodes[0], ea.send_cq),
        [(0, WcStatus::Success)]
    );
    // The third node saw nothing addressed to it.
    assert_eq!(fab.nodes[2].stats().rx_datagrams, 0);
}

/// Once an RC QP has accepted a packet from its peer, packets from the peer's address but
/// another UDP source port are not its peer's QP: dropped and counted, requests and ACKs
/// alike, and the connection carries on.
#[test]
fn rc_packets_from_another_source_port_are_dropped_once_pinned() {
    let mut fab = Fabric::with_nodes(2, origin(), |_, _| {});
    let p = RcParams::default();
    let (a, b) = fab.providers();
    let ea = cf::open_endpoint(a, 4096, 16, 64).unwrap();
    let eb = cf::open_endpoint(b, 4096, 16, 64).unwrap();
    let (qa, qb) = cf::connect_rc(a, &ea, b, &eb, &p).unwrap();
    cf::post_recvs(b, RecvTarget::Qp(qb), eb.pool, 0, 4).unwrap();
    let payload = [0x5A; 64];
    // One message each way of the handshake pins both ends' ports.
    cf::post_send_data(a, qa, ea.pool, 0, &payload).unwrap();
    fab.settle();
    assert_eq!(poll(&mut fab.nodes[1], eb.recv_cq).len(), 1);
    assert_eq!(poll(&mut fab.nodes[0], ea.send_cq).len(), 1);
    let (a_ip, b_ip) = (ip4(1), ip4(2));
    let now = fab.now();
    let off_port = 50_000;
    let from_port = |repr: &RoceRepr, payload: &[u8], src: IpAddr, dst: IpAddr| {
        let (IpAddr::V4(s), IpAddr::V4(d)) = (src, dst) else {
            unreachable!()
        };
        let ip = IpHeaderInfo::V4 {
            src: s,
            dst: d,
            identification: 0,
            dont_fragment: true,
        };
        let mut out = Vec::new();
        repr.emit(payload, &ip, off_port, 4791, &mut out);
        out
    };
    // The next request b expects, right in every way but the port.
    let mut bth = Bth::new(Opcode::RC_SEND_ONLY, qb.get(), p.psn_a.get() + 1);
    bth.ack_req = true;
    let b = &mut fab.nodes[1];
    let before = b.stats();
    b.handle_datagram(
        now,
        SocketAddr::new(a_ip, off_port),
        b_ip,
        &from_port(&RoceRepr::new(bth), &payload, a_ip, b_ip),
    );
    let s = b.stats();
    assert_eq!(s.rx_bad_src_port - before.rx_bad_src_port, 1, "{s:?}");
    assert_eq!(
        s.tx_acks + s.tx_seq_naks,
        before.tx_acks + before.tx_seq_naks
    );
    assert!(poll(b, eb.recv_cq).is_empty(), "nothing delivered");
    // An ACK for a's next message, from b's address but another port, retires nothing.
    let a = &mut fab.nodes[0];
    cf::post_send_data(a, qa, ea.pool, 1, &payload).unwrap();
    let ack = RoceRepr {
        aeth: Some(ipoib_cm::wire::Aeth {
            syndrome: ipoib_cm::wire::Syndrome::Ack { credits: 0x1F },
            msn: 2,
        }),
        ..RoceRepr::new(Bth::new(
            Opcode::RC_ACKNOWLEDGE,
            qa.get(),
            p.psn_a.get() + 1,
        ))
    };
    let a_before = a.stats();
    a.handle_datagram(
        now,
        SocketAddr::new(b_ip, off_port),
        a_ip,
        &from_port(&ack, &[], b_ip, a_ip),
    );
    assert_eq!(a.stats().rx_bad_src_port, a_before.rx_bad_src_port + 1);
    assert!(poll(a, ea.send_cq).is_empty());
    // The real second message goes through.
    fab.settle();
    assert_eq!(poll(&mut fab.nodes[1], eb.recv_cq).len(), 1);
    assert_eq!(
        poll(&mut fab.nodes[0], ea.send_cq),
        [(1, WcStatus::Success)]
    );
}

#[test]
fn ud_wrong_qkey_and_foreign_sources() {
    let mut fab = Fabric::with_nodes(2, origin(), |_, _| {});
    let (a, b) = fab.providers();
    let ea = cf::open_endpoint(a, 4096, 8, 64).unwrap();
    let eb = cf::open_endpoint(b, 4096, 8, 64).unwrap();
    let qa = cf::create_qp(a, &ea, ipoib_cm::verbs::QpType::Ud, None, (8, 8)).unwrap();
    let qb = cf::create_qp(b, &eb, ipoib_cm::verbs::QpType::Ud, None, (8, 8)).unwrap();
    for (v, q) in [(&mut *a, qa), (&mut *b, qb)] {
        v.modify_qp(
            q,
            &QpAttr {
                pkey_index: Some(0),
                port: Some(1),
                qkey: Some(ipoib_cm::verbs::QKey(7)),
                ..QpAttr::to_state(QpState::Init)
            },
        )
        .unwrap();
        v.modify_qp(q, &QpAttr::to_state(QpState::Rtr)).unwrap();
        v.modify_qp(
            q,
            &QpAttr {
                sq_psn: Some(Psn::new(0)),
                ..QpAttr::to_state(QpState::Rts)
            },
        )
        .unwrap();
    }
    cf::post_recvs(b, RecvTarget::Qp(qb), eb.pool, 0, 2).unwrap();
    let now = fab.now();
    let d = |qkey: u32| {
        let r = RoceRepr {
            deth: Some(ipoib_cm::wire::Deth { qkey, src_qp: 0x99 }),
            ..RoceRepr::new(Bth::new(Opcode::UD_SEND_ONLY, qb.get(), 0))
        };
        datagram(&r, &[5; 32], ip4(9), ip4(2))
    };
    let b = &mut fab.nodes[1];
    b.handle_datagram(now, SocketAddr::new(ip4(9), 4791), ip4(2), &d(8));
    assert_eq!(b.stats().rx_bad_qkey, 1);
    assert!(poll(b, eb.recv_cq).is_empty());
    // UD accepts any source with the right Q_Key (it has no peer).
    b.handle_datagram(now, SocketAddr::new(ip4(9), 4791), ip4(2), &d(7));
    let mut cs = Vec::new();
    cf::poll_into(b, eb.recv_cq, &mut cs);
    assert_eq!(cs.len(), 1);
    assert_eq!(cs[0].src_qp, Some(QpNum::new(0x99)));
    let grh = b.pools().get(cs[0].buf.unwrap()).unwrap();
    assert_eq!(
        ipoib_cm::soft::grh_source_gid(grh),
        Some(ipoib_cm::verbs::Gid::from_ip(ip4(9)))
    );
    let _ = qa;
}

// -------------------------------------------------------------------------------------------
// Property tests
// -------------------------------------------------------------------------------------------

fn prop_config(cases: u32, seed: u64) -> PropConfig {
    PropConfig {
        cases,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(seed),
        ..PropConfig::default()
    }
}

fn mtu_strategy() -> impl Strategy<Value = PathMtu> {
    prop_oneof![
        Just(PathMtu::Mtu256),
        Just(PathMtu::Mtu512),
        Just(PathMtu::Mtu1024),
        Just(PathMtu::Mtu2048),
        Just(PathMtu::Mtu4096),
    ]
}

proptest! {
    #![proptest_config(prop_config(24, 0x51D_0001))]

    /// Random faults, seeds, sizes, MTUs, depths and start PSNs: everything is delivered
    /// intact, in order, exactly once, and no buffer leaks (all checked by `transfer`).
    ///
    /// Loss plus corruption stays at or below 14% per direction: with `retry_cnt` 7 a run
    /// legitimately fails (`RetryExcErr`) when one packet is lost 8 rounds in a row, which at
    /// 25% happens about once per 10^5 stalls and was seen in a 1,500-case exploration; at
    /// 14% it is about once per 10^7.
    #[test]
    fn random_faults_deliver_everything(
        loss in 0.0f64..10.0,
        dup in 0.0f64..15.0,
        reorder in 0.0f64..30.0,
        corrupt in 0.0f64..4.0,
        seed in any::<u64>(),
        mtu in mtu_strategy(),
        sizes_ab in prop::collection::vec(0usize..70_000, 1..12),
        sizes_ba in prop::collection::vec(0usize..9_000, 0..8),
        depth in 1usize..12,
        psn_a in 0u32..0x100_0000,
        psn_b in 0u32..0x100_0000,
    ) {
        let mut sc = Scenario::new("proptest", sizes_ab)
            .faults(faults(loss, dup, reorder, corrupt, seed));
        sc.sizes[1] = sizes_ba;
        sc.mtu = mtu;
        sc.depth = depth;
        sc.psn = (psn_a, psn_b);
        transfer(&sc);
    }
}

/// A valid datagram for the RC QP, used as the base of the mutation fuzzing below.
fn fuzz_target() -> (Fabric, Endpoint, QpNum, Vec<Vec<u8>>) {
    let mut fab = Fabric::with_nodes(2, origin(), |_, c| c.port_mtu = PathMtu::Mtu4096);
    let p = RcParams {
        path_mtu: Some(PathMtu::Mtu256),
        ..RcParams::default()
    };
    let (a, b) = fab.providers();
    let ea = cf::open_endpoint(a, 4096, 8, 64).unwrap();
    let eb = cf::open_endpoint(b, 4096, 8, 64).unwrap();
    let (_qa, qb) = cf::connect_rc(a, &ea, b, &eb, &p).unwrap();
    cf::post_recvs(b, RecvTarget::Qp(qb), eb.pool, 0, 4).unwrap();
    let srq = b
        .create_srq(&SrqInit {
            pd: eb.pd,
            max_wr: 4,
            limit: 1,
        })
        .unwrap();
    cf::post_recvs(b, RecvTarget::Srq(srq), eb.pool, 10, 2).unwrap();
    let mut samples = Vec::new();
    let psn = p.psn_a.get();
    for (op, len) in [
        (Opcode::RC_SEND_ONLY, 10),
        (Opcode::RC_SEND_FIRST, 256),
        (Opcode::RC_SEND_MIDDLE, 256),
        (Opcode::RC_SEND_LAST, 3),
    ] {
        samples.push(datagram(
            &RoceRepr::new(Bth::new(op, qb.get(), psn)),
            &vec![9; len],
            ip4(1),
            ip4(2),
        ));
    }
    (fab, eb, qb, samples)
}

/// Recomputes the ICRC of a (mutated) datagram from a to b so it passes the ICRC gate.
fn fix_icrc(d: &mut Vec<u8>) {
    if d.len() < 4 {
        return;
    }
    d.truncate(d.len() - 4);
    let ip = IpHeaderInfo::V4 {
        src: std::net::Ipv4Addr::new(198, 18, 0, 1),
        dst: std::net::Ipv4Addr::new(198, 18, 0, 2),
        identification: 0,
        dont_fragment: true,
    };
    ipoib_cm::wire::append_icrc(&ip, 4791, 4791, d);
}

proptest! {
    #![proptest_config(prop_config(2000, 0x51D_0002))]

    /// Arbitrary bytes never panic the engine, from the peer's address or any other.
    #[test]
    fn handle_datagram_never_panics_on_arbitrary_bytes(
        bytes in prop::collection::vec(any::<u8>(), 0..300),
        from_peer in any::<bool>(),
    ) {
        let mut v = SoftVerbs::new(SoftConfig::new(ip4(2)));
        let src = if from_peer { ip4(1) } else { ip4(7) };
        v.handle_datagram(origin(), SocketAddr::new(src, 4791), ip4(2), &bytes);
        let mut buf = Vec::new();
        while v.poll_transmit(origin(), &mut buf).is_some() {}
    }
}

proptest! {
    #![proptest_config(prop_config(400, 0x51D_0003))]

    /// Valid packets mutated (bytes flipped, truncated, extended) and given a correct ICRC, so
    /// they reach header parsing and the QP: the engine never panics, keeps its buffer
    /// accounting, and answers with at most a few packets.
    #[test]
    fn mutated_packets_with_valid_icrc_never_panic(
        which in 0usize..4,
        edits in prop::collection::vec((0usize..300, any::<u8>()), 0..6),
        cut in 0usize..40,
        extra in prop::collection::vec(any::<u8>(), 0..8),
        rounds in 1usize..4,
    ) {
        let (mut fab, eb, qb, samples) = fuzz_target();
        let mut d = samples[which].clone();
        for (at, x) in edits {
            let n = d.len().max(1);
            if let Some(b) = d.get_mut(at % n) {
                *b ^= x;
            }
        }
        d.truncate(d.len().saturating_sub(cut));
        d.extend(extra);
        // Keep the destination QP most of the time so the QP logic is reached.
        if d.len() >= 8 && which != 0 {
            d[5..8].copy_from_slice(&qb.get().to_be_bytes()[1..]);
        }
        fix_icrc(&mut d);
        let now = fab.now();
        for _ in 0..rounds {
            fab.nodes[1].handle_datagram(now, SocketAddr::new(ip4(1), 4791), ip4(2), &d);
        }
        fab.settle();
        let posted = fab.nodes[1].pools().posted_count();
        let mut cs = Vec::new();
        for cq in [eb.send_cq, eb.recv_cq] {
            cf::poll_into(&mut fab.nodes[1], cq, &mut cs);
        }
        // Every buffer is either still posted or came back in a completion.
        let returned = cs.iter().filter(|c| c.buf.is_some()).count();
        prop_assert_eq!(posted + returned, 6);
    }
}
