//! Unit tests of the soft provider that need its internals; the behavioural tests run over
//! the simulated fabric in `tests/sim_rc.rs` and `tests/conformance_soft.rs`.

use std::time::{Duration, Instant};

use crate::sim::Fabric;
use crate::verbs::conformance::{self as cf, ConformancePair, RcParams, RecvTarget};
use crate::verbs::{Completion, Verbs};

/// A busy QP cancels its retransmit timer whenever everything is acknowledged and re-arms it
/// with the next send. The timer heap must not keep an entry per cycle: one live entry per QP
/// timer (plus briefly a superseded one) is all there may be, however long the stream.
#[test]
fn timer_heap_stays_bounded_on_a_busy_qp() {
    let mut fab = Fabric::with_nodes(2, Instant::now(), |_, _| {});
    let (a, b) = fab.providers();
    let ea = cf::open_endpoint(a, 256, 4, 64).unwrap();
    let eb = cf::open_endpoint(b, 256, 4, 64).unwrap();
    let p = RcParams {
        timeout: 8, // 1 ms: many expiries of stale entries during the stream
        ..RcParams::default()
    };
    let (qa, qb) = cf::connect_rc(a, &ea, b, &eb, &p).unwrap();
    let mut cs: Vec<Completion> = Vec::new();
    let mut most = 0;
    for i in 0..2000u64 {
        let (a, b) = fab.providers();
        cf::post_recvs(b, RecvTarget::Qp(qb), eb.pool, i, 1).unwrap();
        cf::post_send_data(a, qa, ea.pool, i, &[7; 100]).unwrap();
        let done = fab.run_until(100, Duration::from_secs(1), |f| {
            f.nodes[0].pools().posted_count() == 0
        });
        assert!(done, "message {i} did not complete");
        most = most.max(
            fab.nodes
                .iter()
                .map(|n| n.sh.timers.len())
                .max()
                .unwrap_or(0),
        );
        for (v, cq) in fab.nodes.iter_mut().zip([ea.send_cq, eb.recv_cq]) {
            cs.clear();
            cf::poll_into(v, cq, &mut cs);
            cf::free_bufs(v, &cs);
        }
    }
    assert!(most <= 2, "the timer heap grew to {most} entries");
    // Once idle, stale entries drain away.
    fab.run_idle(1000, Duration::from_secs(1));
    assert!(fab.nodes.iter().all(|n| n.sh.timers.is_empty()));
}
