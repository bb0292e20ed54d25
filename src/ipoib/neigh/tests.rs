use super::*;
use crate::verbs::{Gid, QpNum};
use proptest::prelude::*;
use std::net::Ipv4Addr;

fn hw_at(node: u8, q: u32) -> HwAddr {
    HwAddr::new(
        0x80,
        QpNum::new(q),
        Gid::from(Ipv4Addr::new(198, 18, 0, node)),
    )
}

fn hw(q: u32) -> HwAddr {
    hw_at(2, q)
}

fn ip(last: u16) -> IpAddr {
    let [a, b] = last.to_be_bytes();
    IpAddr::V4(Ipv4Addr::new(198, 19, a, b))
}

fn idle(_: HwAddr) -> bool {
    false
}

fn table() -> Neighbours {
    Neighbours::new(1024, 16)
}

fn resolved(l: Learned) -> Vec<Vec<u8>> {
    match l {
        Learned::Resolved { queued, .. } => queued,
        other => panic!("not resolved: {other:?}"),
    }
}

#[test]
fn resolve_then_conflict_is_ignored() {
    let t = Instant::now();
    let c = &mut Counters::default();
    let ip = ip(2);
    let mut n = table();
    assert!(matches!(n.start(ip, t, 3, idle, c), Started::New(None)));
    assert!(n.enqueue(&ip, &[1], 3));
    assert_eq!(
        resolved(n.learn(ip, hw(5), None, t, Claim::Request, idle, c)),
        vec![vec![1]]
    );
    assert!(matches!(
        n.learn(ip, hw(6), None, t, Claim::Request, idle, c),
        Learned::Replaced { old } if old == hw(5)
    ));
    assert_eq!(n.get(&ip).unwrap().hw(), Some(hw(6)));
    let other_node = hw_at(9, 6);
    assert!(matches!(
        n.learn(ip, other_node, None, t, Claim::Request, idle, c),
        Learned::Conflict
    ));
    assert_eq!(n.get(&ip).unwrap().hw(), Some(hw(6)));
    assert_eq!(n.forget_hw(&hw(6)), vec![ip]);
    assert!(n.get(&ip).is_none());
    n.check();
}

#[test]
fn unsolicited_unknown_is_ignored_and_static_never_replaced() {
    let t = Instant::now();
    let c = &mut Counters::default();
    let ip = ip(3);
    let mut n = table();
    assert!(matches!(
        n.learn(ip, hw(5), None, t, Claim::Other, idle, c),
        Learned::Ignored
    ));
    n.add_static(ip, hw(7), t);
    assert!(matches!(
        n.learn(ip, hw(5), None, t, Claim::Request, idle, c),
        Learned::Conflict
    ));
    assert!(n.forget_hw(&hw(7)).is_empty(), "static entries stay");
    n.check();
}

#[test]
fn resolution_retries_run_out_and_a_used_entry_is_rechecked() {
    let t = Instant::now();
    let c = &mut Counters::default();
    let ip = ip(4);
    let mut wheel = crate::timer::TimerWheel::new(t, Duration::from_millis(1));
    let mut timer = || wheel.insert(t, ());
    let mut n = table();
    assert!(matches!(n.start(ip, t, 2, idle, c), Started::New(None)));
    let (first, second, stray) = (timer(), timer(), timer());
    n.set_timer(&ip, first);
    assert_eq!(n.resolve_timer_fired(&ip, stray), Retry::Nothing);
    assert_eq!(n.resolve_timer_fired(&ip, first), Retry::Resend);
    n.set_timer(&ip, second);
    assert_eq!(n.resolve_timer_fired(&ip, second), Retry::GiveUp);

    let timeout = Duration::from_secs(3);
    assert!(resolved(n.learn(ip, hw(5), None, t, Claim::Request, idle, c)).is_empty());
    let age = timer();
    n.set_timer(&ip, age);
    n.get_mut(&ip).unwrap().last_used = t + Duration::from_secs(1);
    assert_eq!(
        n.age_timer_fired(&ip, age, t + timeout, timeout),
        Ageing::Recheck(t + Duration::from_secs(4))
    );
    let again = timer();
    n.set_timer(&ip, again);
    let other = self::ip(5);
    n.add_static(other, hw(5), t);
    assert_eq!(
        n.age_timer_fired(&ip, again, t + Duration::from_secs(4), timeout),
        Ageing::Nothing,
        "another neighbour still uses the address"
    );
    assert!(n.get(&ip).is_none());
    n.check();
}

#[test]
fn ageing_out_reports_the_endpoint_unused_only_after_its_last_entry() {
    let t = Instant::now();
    let c = &mut Counters::default();
    let mut wheel = crate::timer::TimerWheel::new(t, Duration::from_millis(1));
    let mut n = table();
    let timeout = Duration::from_secs(1);
    for k in [10, 11] {
        resolved(n.learn(ip(k), hw(5), None, t, Claim::Request, idle, c));
        n.set_timer(&ip(k), wheel.insert(t, ()));
    }
    let later = t + timeout;
    let first = n.get(&ip(10)).unwrap().timer.unwrap();
    assert_eq!(
        n.age_timer_fired(&ip(10), first, later, timeout),
        Ageing::Nothing
    );
    let second = n.get(&ip(11)).unwrap().timer.unwrap();
    assert_eq!(
        n.age_timer_fired(&ip(11), second, later, timeout),
        Ageing::Unused(hw(5))
    );
    assert_eq!(n.len(), 0);
    n.check();
}

#[test]
fn a_full_table_evicts_the_least_recently_used_entry() {
    let t = Instant::now();
    let c = &mut Counters::default();
    let mut n = Neighbours::new(4, 16);
    for k in 0..4u16 {
        let at = t + Duration::from_secs(u64::from(k));
        resolved(n.learn(
            ip(k),
            hw_at(k as u8 + 10, 5),
            None,
            at,
            Claim::Request,
            idle,
            c,
        ));
    }
    // Entry 0 is used again: entry 1 is now the least recently used.
    n.use_entry(&ip(0), t + Duration::from_secs(9));
    let Learned::Resolved {
        evicted: Some(Evicted(gone)),
        ..
    } = n.learn(ip(7), hw_at(20, 5), None, t, Claim::Request, idle, c)
    else {
        panic!("no eviction");
    };
    assert_eq!(gone.hw(), Some(hw_at(11, 5)));
    assert!(n.get(&ip(1)).is_none() && n.get(&ip(0)).is_some());
    assert_eq!(n.learned(), 4);
    assert_eq!((c.neigh_table_full, c.neigh_evicted), (1, 1));
    n.check();
}

#[test]
fn entries_in_use_are_not_evicted_and_a_table_of_them_refuses() {
    let t = Instant::now();
    let c = &mut Counters::default();
    let mut n = Neighbours::new(3, 16);
    for k in 0..3u16 {
        resolved(n.learn(
            ip(k),
            hw_at(k as u8 + 10, 5),
            None,
            t,
            Claim::Request,
            idle,
            c,
        ));
    }
    // The oldest has a connection: the next one goes.
    let conn = hw_at(10, 5);
    let busy = |h: HwAddr| h == conn;
    let Learned::Resolved {
        evicted: Some(Evicted(gone)),
        ..
    } = n.learn(ip(5), hw_at(30, 5), None, t, Claim::Request, busy, c)
    else {
        panic!("no eviction");
    };
    assert_eq!(gone.hw(), Some(hw_at(11, 5)));
    // Everything in use: a new entry is refused, from the wire or from the TUN device.
    let all = |_: HwAddr| true;
    assert!(matches!(
        n.learn(ip(6), hw_at(31, 5), None, t, Claim::Request, all, c),
        Learned::Refused
    ));
    assert!(matches!(n.start(ip(7), t, 3, all, c), Started::Refused));
    assert!(n.get(&ip(0)).is_some() && n.get(&ip(6)).is_none() && n.get(&ip(7)).is_none());
    assert_eq!((c.neigh_table_full, c.neigh_evicted), (3, 1));
    n.check();
}

#[test]
fn incomplete_entries_count_and_are_evicted_first_when_oldest() {
    let t = Instant::now();
    let c = &mut Counters::default();
    let mut n = Neighbours::new(8, 16);
    for k in 0..100u16 {
        let started = n.start(ip(k), t + Duration::from_millis(u64::from(k)), 3, idle, c);
        if let Started::New(Some(Evicted(e))) = started {
            assert!(e.hw().is_none());
        }
        assert!(n.learned() <= 8);
    }
    assert_eq!(n.counts().incomplete, 8);
    assert!(n.get(&ip(99)).is_some() && n.get(&ip(0)).is_none());
    assert_eq!(c.neigh_evicted, 92);
    n.check();
}

#[test]
fn one_source_is_capped_and_evicts_its_own_oldest_entry() {
    let t = Instant::now();
    let c = &mut Counters::default();
    let mut n = Neighbours::new(1024, 4);
    for k in 0..4u16 {
        let at = t + Duration::from_secs(u64::from(k));
        resolved(n.learn(
            ip(k),
            hw(100 + u32::from(k)),
            None,
            at,
            Claim::Request,
            idle,
            c,
        ));
    }
    resolved(n.learn(ip(50), hw_at(7, 5), None, t, Claim::Request, idle, c));
    let Learned::Resolved {
        evicted: Some(Evicted(gone)),
        ..
    } = n.learn(ip(9), hw(200), None, t, Claim::Request, idle, c)
    else {
        panic!("no eviction");
    };
    assert_eq!(
        gone.hw(),
        Some(hw(100)),
        "the source's oldest, not the table's"
    );
    assert!(n.get(&ip(50)).is_some());
    // Our own resolution answered by a full source evicts the same way.
    assert!(matches!(n.start(ip(60), t, 3, idle, c), Started::New(None)));
    resolved(n.learn(ip(60), hw(300), None, t, Claim::Request, idle, c));
    assert_eq!(n.counts().reachable, 5);
    // A source whose entries are all in use gets no more.
    let all = |_: HwAddr| true;
    assert!(matches!(
        n.learn(ip(10), hw(201), None, t, Claim::Request, all, c),
        Learned::Refused
    ));
    assert_eq!(c.neigh_source_full, 3);
    assert_eq!(c.neigh_table_full, 0);
    n.check();
}

#[test]
fn static_entries_are_neither_counted_nor_evicted() {
    let t = Instant::now();
    let c = &mut Counters::default();
    let mut n = Neighbours::new(2, 1);
    for k in 0..5u16 {
        n.add_static(ip(1000 + k), hw(9), t);
    }
    for k in 0..50u16 {
        let _ = n.learn(ip(k), hw_at(k as u8, 1), None, t, Claim::Request, idle, c);
    }
    assert_eq!(n.learned(), 2);
    assert_eq!(n.counts().permanent, 5);
    for k in 0..5u16 {
        assert_eq!(n.get(&ip(1000 + k)).unwrap().state(), NeighState::Static);
    }
    n.check();
}

#[test]
fn forgetting_a_peer_looks_only_at_its_source() {
    let t = Instant::now();
    let c = &mut Counters::default();
    let mut n = table();
    resolved(n.learn(ip(1), hw(5), None, t, Claim::Request, idle, c));
    resolved(n.learn(ip(2), hw(5), None, t, Claim::Request, idle, c));
    resolved(n.learn(ip(3), hw(6), None, t, Claim::Request, idle, c));
    resolved(n.learn(ip(4), hw_at(3, 5), None, t, Claim::Request, idle, c));
    let mut gone = n.forget_hw(&hw(5));
    gone.sort();
    assert_eq!(gone, vec![ip(1), ip(2)]);
    assert_eq!(n.len(), 2);
    n.check();
}

#[test]
fn queued_packets_are_bounded_per_entry_and_in_all() {
    let t = Instant::now();
    let c = &mut Counters::default();
    let mut n = table();
    let mut queued = 0;
    for k in 0..200u16 {
        assert!(matches!(n.start(ip(k), t, 3, idle, c), Started::New(None)));
        for _ in 0..5 {
            queued += usize::from(n.enqueue(&ip(k), &[0; 64], 3));
        }
    }
    assert_eq!(queued, QUEUED_MAX);
    assert_eq!(n.get(&ip(0)).unwrap().queued(), 3);
    // Resolving one gives its packets back and makes room for as many.
    assert_eq!(
        resolved(n.learn(ip(0), hw(5), None, t, Claim::Request, idle, c)).len(),
        3
    );
    assert!(n.enqueue(&ip(199), &[1], 4));
    n.remove(&ip(1));
    assert!(n.enqueue(&ip(198), &[1], 4));
    n.check();
}

/// One step of the property test.
#[derive(Debug, Clone)]
enum Op {
    Start(u16),
    Learn {
        ip: u16,
        node: u8,
        qpn: u32,
        for_us: bool,
    },
    Use(u16),
    Age(u16, u64),
    Resolve(u16),
    GiveUp(u16),
    Forget(u8, u32),
    /// A binding fails (its connection, or a probe), then is resolved again.
    Fail(u16),
    Enqueue(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..64u16).prop_map(Op::Start),
        (0..64u16, 0..6u8, 0..3u32, any::<bool>()).prop_map(|(ip, node, qpn, for_us)| Op::Learn {
            ip,
            node,
            qpn,
            for_us
        }),
        (0..64u16).prop_map(Op::Use),
        (0..64u16, 0..20u64).prop_map(|(ip, s)| Op::Age(ip, s)),
        (0..64u16).prop_map(Op::Resolve),
        (0..64u16).prop_map(Op::GiveUp),
        (0..6u8, 0..3u32).prop_map(|(node, qpn)| Op::Forget(node, qpn)),
        (0..64u16).prop_map(Op::Fail),
        (0..64u16).prop_map(Op::Enqueue),
    ]
}

proptest! {
    /// Whatever learn/resolve/use/expire sequence arrives, the caps hold, static entries stay,
    /// the indexes agree with the entries, and no evicted or expired entry lingers.
    #[test]
    fn the_table_stays_within_its_caps(
        max in 1..12usize,
        per_source in 1..5usize,
        ops in proptest::collection::vec(op(), 1..200),
        busy_node in 0..6u8,
    ) {
        let t0 = Instant::now();
        let c = &mut Counters::default();
        let mut wheel = crate::timer::TimerWheel::new(t0, Duration::from_millis(1));
        let mut n = Neighbours::new(max, per_source);
        n.add_static(ip(500), hw_at(0, 1), t0);
        let in_use = |h: HwAddr| h.gid == Gid::from(Ipv4Addr::new(198, 18, 0, busy_node));
        let timeout = Duration::from_secs(5);
        for (step, op) in ops.into_iter().enumerate() {
            let now = t0 + Duration::from_millis(step as u64 * 100);
            match op {
                Op::Start(k) => {
                    if let Started::New(_) = n.start(ip(k), now, 2, in_use, c) {
                        n.set_timer(&ip(k), wheel.insert(now, ()));
                    }
                }
                Op::Learn { ip: k, node, qpn, for_us } => {
                    let had = n.learned();
                    let claim = if for_us { Claim::Request } else { Claim::Answer };
                    let learned = n.learn(ip(k), hw_at(node, qpn), None, now, claim, in_use, c);
                    if let Learned::Resolved { evicted: Some(_), .. } = learned {
                        prop_assert!(n.learned() <= had + 1);
                    }
                    if n.get(&ip(k)).is_some_and(|e| e.state() == NeighState::Reachable) {
                        n.set_timer(&ip(k), wheel.insert(now, ()));
                    }
                }
                Op::Use(k) => {
                    n.use_entry(&ip(k), now);
                }
                Op::Age(k, secs) => {
                    if let Some(id) = n.get(&ip(k)).and_then(|e| e.timer) {
                        let at = now + Duration::from_secs(secs);
                        if let Ageing::Recheck(_) = n.age_timer_fired(&ip(k), id, at, timeout) {
                            n.set_timer(&ip(k), wheel.insert(now, ()));
                        }
                    }
                }
                Op::Resolve(k) => {
                    if let Some(id) = n.get(&ip(k)).and_then(|e| e.timer) {
                        if n.resolve_timer_fired(&ip(k), id) == Retry::GiveUp {
                            n.remove(&ip(k));
                        } else {
                            n.set_timer(&ip(k), wheel.insert(now, ()));
                        }
                    }
                }
                Op::GiveUp(k) => {
                    if n.get(&ip(k)).is_some_and(|e| e.state() != NeighState::Static) {
                        n.remove(&ip(k));
                    }
                }
                Op::Enqueue(k) => {
                    let was = n.get(&ip(k)).map_or(0, Neigh::queued);
                    if n.enqueue(&ip(k), &[7], 2) {
                        prop_assert_eq!(n.get(&ip(k)).map(Neigh::queued), Some(was + 1));
                    }
                }
                Op::Fail(k) => {
                    if let Some((hw, _)) = n.fail_bound(&ip(k), now, 2) {
                        let again = n.learn(ip(k), hw, None, now, Claim::Answer, in_use, c);
                        prop_assert!(matches!(again, Learned::Conflict), "{:?}", again);
                        n.set_timer(&ip(k), wheel.insert(now, ()));
                    }
                }
                Op::Forget(node, qpn) => {
                    let gone = n.forget_hw(&hw_at(node, qpn));
                    for k in gone {
                        prop_assert!(n.get(&k).is_none());
                    }
                }
            }
            n.check();
            prop_assert!(n.learned() <= max);
            prop_assert_eq!(n.get(&ip(500)).map(Neigh::state), Some(NeighState::Static));
        }
    }
}

/// The peer kind learnt from a REJ 8 lives as long as some entry maps to the endpoint: it
/// survives a refreshed mapping and one of two addresses going, not the last one or a
/// restart (new UD QPN), and nothing is remembered for an endpoint no entry maps to.
#[test]
fn the_rdma_cm_kind_lives_as_long_as_an_entry_for_the_endpoint() {
    let t = Instant::now();
    let c = &mut Counters::default();
    let mut n = table();
    n.remember_rdma_cm(&hw(5));
    assert!(!n.reached_by_rdma_cm(&hw(5)), "no entry: nothing kept");
    let (a, b) = (ip(2), ip(3));
    let _ = n.learn(a, hw(5), None, t, Claim::Request, idle, c);
    let _ = n.learn(b, hw(5), None, t, Claim::Request, idle, c);
    assert!(!n.reached_by_rdma_cm(&hw(5)));
    n.remember_rdma_cm(&hw(5));
    assert!(n.reached_by_rdma_cm(&hw(5)));
    // The flags of the address do not matter; a refresh without 0x20 keeps it.
    assert!(n.reached_by_rdma_cm(&HwAddr { flags: 0, ..hw(5) }));
    let _ = n.learn(a, hw(5), None, t, Claim::Request, idle, c);
    assert!(n.reached_by_rdma_cm(&hw(5)));
    n.check();
    n.remove(&a);
    assert!(n.reached_by_rdma_cm(&hw(5)), "b still maps to it");
    n.check();
    // A restart: b now maps to a new UD QPN, and the old endpoint is forgotten.
    assert!(matches!(
        n.learn(b, hw(6), None, t, Claim::Request, idle, c),
        Learned::Replaced { .. }
    ));
    assert!(!n.reached_by_rdma_cm(&hw(5)) && !n.reached_by_rdma_cm(&hw(6)));
    n.check();
    // The last entry going forgets it; a flagged address needs no memory.
    n.remember_rdma_cm(&hw(6));
    assert!(n.reached_by_rdma_cm(&hw(6)));
    n.remove(&b);
    assert!(!n.reached_by_rdma_cm(&hw(6)));
    assert!(n.reached_by_rdma_cm(&HwAddr {
        flags: HwAddr::FLAG_RDMA_CM,
        ..hw(6)
    }));
    n.check();
    // A static entry keeps it for its life.
    n.add_static(a, hw(7), t);
    n.remember_rdma_cm(&hw(7));
    assert_eq!(n.forget_hw(&hw(7)), Vec::<IpAddr>::new());
    assert!(n.reached_by_rdma_cm(&hw(7)));
    n.remove(&a);
    assert!(!n.reached_by_rdma_cm(&hw(7)));
    n.check();
}
