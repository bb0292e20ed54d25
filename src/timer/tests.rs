use super::*;

const MS: Duration = Duration::from_millis(1);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn wheel() -> (Instant, TimerWheel<u32>) {
    let t0 = Instant::now();
    (t0, TimerWheel::new(t0, MS))
}

fn expire<T>(w: &mut TimerWheel<T>, now: Instant) -> Vec<T> {
    let mut out = Vec::new();
    w.expire(now, &mut out);
    out.into_iter().map(|(_, v)| v).collect()
}

#[test]
fn deadlines_round_up_to_the_next_tick() {
    let (t0, mut w) = wheel();
    w.insert(t0 + ms(10) + Duration::from_micros(200), 1);
    w.insert(t0 + ms(10), 2);
    w.insert(t0 + Duration::from_nanos(1), 3);
    assert_eq!(w.poll_timeout(), Some(t0 + ms(1)));
    assert!(expire(&mut w, t0 + Duration::from_micros(999)).is_empty());
    assert_eq!(expire(&mut w, t0 + ms(1)), [3]);
    assert_eq!(w.poll_timeout(), Some(t0 + ms(10)));
    assert_eq!(expire(&mut w, t0 + ms(10)), [2]);
    assert_eq!(w.poll_timeout(), Some(t0 + ms(11)));
    assert!(expire(&mut w, t0 + ms(10) + Duration::from_micros(999)).is_empty());
    assert_eq!(expire(&mut w, t0 + ms(11)), [1]);
    assert_eq!(w.poll_timeout(), None);
}

#[test]
fn same_tick_fires_in_insertion_order_and_ticks_in_deadline_order() {
    let (t0, mut w) = wheel();
    // Same rounded tick (5 ms), different sub-tick deadlines, inserted out of order.
    w.insert(t0 + ms(5), 1);
    w.insert(t0 + ms(4) + Duration::from_micros(1), 2);
    w.insert(t0 + ms(4) + Duration::from_micros(900), 3);
    // Earlier ticks inserted later, in several levels.
    w.insert(t0 + ms(3), 4);
    w.insert(t0 + ms(200), 5);
    w.insert(t0 + ms(70), 6);
    w.insert(t0 + ms(70), 7);
    assert_eq!(expire(&mut w, t0 + ms(1000)), [4, 1, 2, 3, 6, 7, 5]);
}

#[test]
fn reschedule_moves_behind_timers_of_the_same_tick() {
    let (t0, mut w) = wheel();
    let a = w.insert(t0 + ms(100), 1);
    w.insert(t0 + ms(100), 2);
    let a2 = w.reschedule(a, t0 + ms(100)).unwrap();
    assert_ne!(a, a2);
    assert_eq!(w.deadline(a), None);
    assert_eq!(w.deadline(a2), Some(t0 + ms(100)));
    assert_eq!(w.reschedule(a, t0 + ms(5)), None);
    assert_eq!(w.len(), 2);
    assert_eq!(expire(&mut w, t0 + ms(100)), [2, 1]);
}

#[test]
fn reschedule_changes_when_it_fires() {
    let (t0, mut w) = wheel();
    let a = w.insert(t0 + ms(10), 1);
    let a = w.reschedule(a, t0 + ms(5000)).unwrap();
    assert!(expire(&mut w, t0 + ms(4999)).is_empty());
    let a = w.reschedule(a, t0 + ms(6000)).unwrap();
    assert!(expire(&mut w, t0 + ms(5999)).is_empty());
    let mut out = Vec::new();
    w.expire(t0 + ms(6000), &mut out);
    assert_eq!(out, [(a, 1)]);
}

#[test]
fn cancel_after_fire_or_cancel_returns_none() {
    let (t0, mut w) = wheel();
    let a = w.insert(t0 + ms(3), 1);
    let b = w.insert(t0 + ms(3), 2);
    assert_eq!(w.cancel(b), Some(2));
    assert_eq!(w.cancel(b), None);
    assert_eq!(w.len(), 1);
    let mut out = Vec::new();
    w.expire(t0 + ms(3), &mut out);
    assert_eq!(out, [(a, 1)]);
    assert_eq!(w.cancel(a), None);
    assert_eq!(w.deadline(a), None);
    assert_eq!(w.reschedule(a, t0 + ms(9)), None);
    assert!(w.is_empty());
}

#[test]
fn stale_id_does_nothing_after_slot_reuse() {
    let (t0, mut w) = wheel();
    let a = w.insert(t0 + ms(10), 1);
    assert_eq!(w.cancel(a), Some(1));
    let b = w.insert(t0 + ms(20), 2);
    assert_eq!(b.index, a.index, "the slab slot is reused");
    assert_ne!(a, b);
    assert_eq!(w.cancel(a), None);
    assert_eq!(w.reschedule(a, t0 + ms(1)), None);
    assert_eq!(w.deadline(a), None);
    assert_eq!(w.deadline(b), Some(t0 + ms(20)));
    // Reuse after firing, too.
    assert_eq!(expire(&mut w, t0 + ms(20)), [2]);
    let c = w.insert(t0 + ms(30), 3);
    assert_eq!(c.index, b.index);
    assert_eq!(w.cancel(b), None);
    assert_eq!(w.len(), 1);
    assert_eq!(expire(&mut w, t0 + ms(30)), [3]);
}

#[test]
fn far_future_timers_fire_at_the_right_tick() {
    let (t0, mut w) = wheel();
    let day = ms(86_400_000);
    // 2^36 ms is about 795 days: the last two are beyond the wheel's span and clamp.
    let deadlines = [
        ms(1),
        ms(65),
        day * 3 + ms(7),
        day * 400 + ms(1),
        day * 1000 + ms(3),
        day * 3650 + ms(11),
    ];
    for (i, d) in deadlines.iter().enumerate() {
        w.insert(t0 + *d, i as u32);
    }
    for (i, d) in deadlines.iter().enumerate() {
        // Just before: nothing (a big jump), at the tick: exactly this one.
        assert!(expire(&mut w, t0 + *d - MS).is_empty(), "timer {i} early");
        assert!(w.poll_timeout().unwrap() <= t0 + *d);
        assert_eq!(expire(&mut w, t0 + *d), [i as u32]);
    }
    assert!(w.is_empty());
}

#[test]
fn clamped_timers_survive_many_top_level_rotations() {
    let (t0, mut w) = wheel();
    let span = ms(1 << 36);
    let a = t0 + span * 5 + ms(12_345);
    let b = t0 + span * 2 - ms(1);
    w.insert(a, 1);
    w.insert(b, 2);
    // Walk forward in steps of a third of the span.
    let mut now = t0;
    let mut fired = Vec::new();
    while now < a + span {
        now += span / 3;
        for v in expire(&mut w, now) {
            fired.push((v, now));
        }
    }
    assert_eq!(fired.len(), 2);
    assert_eq!(fired[0].0, 2);
    assert!(fired[0].1 >= b && fired[0].1 < b + span / 3);
    assert_eq!(fired[1].0, 1);
    assert!(fired[1].1 >= a && fired[1].1 < a + span / 3);
}

#[test]
fn one_big_jump_fires_everything_in_order() {
    let (t0, mut w) = wheel();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut expect = Vec::new();
    for i in 0..5_000u32 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let d = x % 10_000_000;
        w.insert(t0 + ms(d), i);
        expect.push((d, i));
    }
    expect.sort_unstable();
    let fired = expire(&mut w, t0 + ms(10_000_000));
    assert_eq!(fired, expect.iter().map(|&(_, i)| i).collect::<Vec<_>>());
    assert!(w.is_empty());
    assert_eq!(w.poll_timeout(), None);
}

#[test]
fn past_deadlines_fire_at_the_next_expire_in_deadline_order() {
    let (t0, mut w) = wheel();
    w.insert(t0 - ms(5), 1);
    w.insert(t0, 2);
    assert_eq!(w.poll_timeout(), Some(t0));
    assert_eq!(expire(&mut w, t0), [1, 2]);

    w.insert(t0 + ms(20_000), 9);
    assert!(expire(&mut w, t0 + ms(10_000)).is_empty());
    w.insert(t0 + ms(5_000), 3);
    w.insert(t0 + ms(3_000), 4);
    w.insert(t0 + ms(10_000), 5);
    let p = w.poll_timeout().unwrap();
    assert!(
        p <= t0 + ms(3_000),
        "overdue timers make poll_timeout due now"
    );
    // Same `now` as before (and even an earlier one): they still fire.
    assert_eq!(expire(&mut w, t0 + ms(9_000)), [4, 3, 5]);
    // 20 s sits in level 2 (4096 ms slots): the bound is that slot's start.
    assert_eq!(w.poll_timeout(), Some(t0 + ms(4 * 4096)));
    assert_eq!(w.len(), 1);
}

#[test]
fn earlier_now_does_not_rewind() {
    let (t0, mut w) = wheel();
    w.insert(t0 + ms(150), 1);
    assert!(expire(&mut w, t0 + ms(100)).is_empty());
    assert!(expire(&mut w, t0 + ms(50)).is_empty());
    assert!(expire(&mut w, t0).is_empty());
    // 150 ms sits in level 1 (64 ms slots) relative to 100 ms.
    assert_eq!(w.poll_timeout(), Some(t0 + ms(128)));
    assert!(expire(&mut w, t0 + ms(149)).is_empty());
    assert_eq!(w.poll_timeout(), Some(t0 + ms(150)));
    assert_eq!(expire(&mut w, t0 + ms(150)), [1]);
}

#[test]
fn expire_appends_and_returns_the_ids() {
    let (t0, mut w) = wheel();
    let a = w.insert(t0 + ms(1), 10);
    let b = w.insert(t0 + ms(2), 20);
    let mut out = vec![(a, 0)];
    w.expire(t0 + ms(5), &mut out);
    assert_eq!(out, [(a, 0), (a, 10), (b, 20)]);
}

#[test]
fn zero_tick_is_one_nanosecond() {
    let t0 = Instant::now();
    let mut w = TimerWheel::new(t0, Duration::ZERO);
    assert_eq!(w.tick(), Duration::from_nanos(1));
    w.insert(t0 + Duration::from_nanos(1500), 1);
    assert!(expire(&mut w, t0 + Duration::from_nanos(1499)).is_empty());
    assert_eq!(expire(&mut w, t0 + Duration::from_nanos(1500)), [1]);
}

#[test]
fn coarse_tick_rounds_up() {
    let t0 = Instant::now();
    let mut w = TimerWheel::new(t0, ms(100));
    w.insert(t0 + ms(101), 1);
    assert_eq!(w.poll_timeout(), Some(t0 + ms(200)));
    assert!(expire(&mut w, t0 + ms(199)).is_empty());
    assert_eq!(expire(&mut w, t0 + ms(200)), [1]);
}

#[test]
fn poll_timeout_is_exact_in_level_zero_and_a_lower_bound_above() {
    let (t0, mut w) = wheel();
    w.insert(t0 + ms(5_000), 1);
    let p = w.poll_timeout().unwrap();
    // 5000 ms sits in level 2 (slot of 4096 ms): the bound is that slot's start.
    assert_eq!(p, t0 + ms(4096));
    assert!(expire(&mut w, p).is_empty());
    let p = w.poll_timeout().unwrap();
    assert_eq!(p, t0 + ms(4992));
    assert!(expire(&mut w, p).is_empty());
    assert_eq!(w.poll_timeout(), Some(t0 + ms(5_000)));
    assert_eq!(expire(&mut w, t0 + ms(5_000)), [1]);
}

/// Drives the wheel the way the event loop does (sleep until `poll_timeout`, then expire) and
/// checks that timers fire exactly at their tick and that empty wake-ups are bounded.
#[test]
fn event_loop_wakes_at_most_levels_minus_one_times_per_fire() {
    let (t0, mut w) = wheel();
    let mut x: u64 = 12345;
    let mut deadline_of = Vec::new();
    for i in 0..2_000u32 {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let d = (x >> 20) % (1 << 34);
        w.insert(t0 + ms(d), i);
        deadline_of.push(d);
    }
    let mut empty_wakes = 0;
    let mut fired = 0;
    let mut out = Vec::new();
    while let Some(next) = w.poll_timeout() {
        out.clear();
        w.expire(next, &mut out);
        if out.is_empty() {
            empty_wakes += 1;
            assert!(empty_wakes < NUM_LEVELS, "too many empty wake-ups");
        } else {
            empty_wakes = 0;
        }
        for &(_, i) in &out {
            assert_eq!(
                t0 + ms(deadline_of[i as usize]),
                next,
                "fired at the wrong tick"
            );
            fired += 1;
        }
    }
    assert_eq!(fired, 2_000);
}

#[test]
fn hundred_thousand_timers_all_fire() {
    let (t0, mut w) = wheel();
    let n = 100_000u32;
    let mut ids = Vec::with_capacity(n as usize);
    let mut x: u64 = 7;
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Up to ~2 hours, at sub-millisecond granularity.
        let d = Duration::from_micros(x % 7_200_000_000);
        ids.push((w.insert(t0 + d, i), d));
    }
    assert_eq!(w.len(), n as usize);
    // Cancel every tenth.
    let mut cancelled = 0;
    for (id, _) in ids.iter().step_by(10) {
        assert!(w.cancel(*id).is_some());
        cancelled += 1;
    }
    let mut out = Vec::new();
    let mut now = t0;
    let mut last_tick = 0u128;
    let mut fired = 0usize;
    while !w.is_empty() {
        now += Duration::from_secs(97);
        out.clear();
        w.expire(now, &mut out);
        for &(id, i) in &out {
            let d = ids[i as usize].1;
            assert_eq!(ids[i as usize].0, id);
            let tick = d.as_nanos().div_ceil(MS.as_nanos());
            assert!(tick >= last_tick, "out of order");
            assert!(t0 + ms(tick as u64) <= now, "fired early");
            last_tick = tick;
        }
        fired += out.len();
        last_tick = last_tick.max((now - t0).as_nanos() / MS.as_nanos());
    }
    assert_eq!(fired + cancelled, n as usize);
    // The slab is reused: no growth for a second round.
    let capacity = w.nodes.len();
    for i in 0..n {
        w.insert(now + ms(u64::from(i)), i);
    }
    assert_eq!(w.nodes.len(), capacity);
    let fired = expire(&mut w, now + ms(u64::from(n)));
    assert_eq!(fired, (0..n).collect::<Vec<_>>());
}

/// Differential test against a `BTreeMap<(deadline_tick, seq), _>` model.
mod differential {
    use std::collections::{BTreeMap, HashMap};

    use proptest::prelude::*;
    use proptest::sample::Index;

    use super::*;

    const DAY_NS: i64 = 86_400_000_000_000;
    const HOUR_NS: i64 = 3_600_000_000_000;

    #[derive(Debug, Clone)]
    enum Op {
        /// Insert at `now + offset_ns` (may be in the past).
        Insert(i64),
        /// Cancel one of the ids ever issued (possibly stale).
        Cancel(Index),
        /// Reschedule one of the ids ever issued to `now + offset_ns`.
        Reschedule(Index, i64),
        /// Advance `now` by this many ns, then expire.
        Expire(i64),
    }

    fn offset_ns() -> impl Strategy<Value = i64> {
        prop_oneof![
            4 => 0i64..200_000_000,
            3 => 0i64..HOUR_NS,
            1 => 0i64..3_000 * DAY_NS,
            1 => -10_000_000_000i64..0,
            1 => Just(0i64),
        ]
    }

    fn advance_ns() -> impl Strategy<Value = i64> {
        prop_oneof![
            2 => Just(0i64),
            4 => 0i64..100_000_000,
            3 => 0i64..HOUR_NS,
            1 => 0i64..2_000 * DAY_NS,
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            5 => offset_ns().prop_map(Op::Insert),
            2 => any::<Index>().prop_map(Op::Cancel),
            2 => (any::<Index>(), offset_ns()).prop_map(|(i, o)| Op::Reschedule(i, o)),
            3 => advance_ns().prop_map(Op::Expire),
        ]
    }

    fn tick() -> impl Strategy<Value = Duration> {
        prop_oneof![
            4 => Just(Duration::from_millis(1)),
            1 => Just(Duration::from_millis(10)),
            1 => Just(Duration::from_micros(1)),
            1 => Just(Duration::from_nanos(7)),
        ]
    }

    /// The model: pending timers keyed by (rounded-up tick, insertion sequence).
    struct Model {
        start: Instant,
        tick_ns: u128,
        /// Latest `now` seen, in ticks (rounded down).
        elapsed_tick: u64,
        seq: u64,
        pending: BTreeMap<(u64, u64), (TimerId, u32)>,
        by_id: HashMap<TimerId, ((u64, u64), Instant)>,
    }

    impl Model {
        fn tick_up(&self, t: Instant) -> u64 {
            let ns = t.saturating_duration_since(self.start).as_nanos();
            ns.div_ceil(self.tick_ns) as u64
        }

        fn add(&mut self, id: TimerId, deadline: Instant, value: u32) {
            let key = (self.tick_up(deadline), self.seq);
            self.seq += 1;
            self.pending.insert(key, (id, value));
            self.by_id.insert(id, (key, deadline));
        }

        fn remove(&mut self, id: TimerId) -> Option<u32> {
            let (key, _) = self.by_id.remove(&id)?;
            self.pending.remove(&key).map(|(_, v)| v)
        }

        fn expire(&mut self, now: Instant) -> Vec<(TimerId, u32)> {
            let ns = now.saturating_duration_since(self.start).as_nanos();
            self.elapsed_tick = self.elapsed_tick.max((ns / self.tick_ns) as u64);
            let later = self.pending.split_off(&(self.elapsed_tick + 1, 0));
            let due = std::mem::replace(&mut self.pending, later);
            for (id, _) in due.values() {
                self.by_id.remove(id);
            }
            due.into_values().collect()
        }
    }

    fn check_poll_timeout(w: &TimerWheel<u32>, m: &Model) -> Result<(), TestCaseError> {
        let p = w.poll_timeout();
        let Some((&(min_tick, _), _)) = m.pending.first_key_value() else {
            prop_assert_eq!(p, None);
            return Ok(());
        };
        let p = p.ok_or_else(|| TestCaseError::fail("poll_timeout None with timers pending"))?;
        let p_ns = p.duration_since(m.start).as_nanos();
        prop_assert_eq!(p_ns % m.tick_ns, 0, "not a tick boundary");
        let p_tick = (p_ns / m.tick_ns) as u64;
        let e = m.elapsed_tick;
        prop_assert!(
            p_tick <= min_tick,
            "poll_timeout later than the earliest deadline"
        );
        if min_tick > e {
            prop_assert!(
                p_tick > e,
                "poll_timeout not after the last expire with nothing due"
            );
            if min_tick >> LEVEL_BITS == e >> LEVEL_BITS {
                prop_assert_eq!(p_tick, min_tick, "level-0 bound not exact");
            }
        } else {
            prop_assert!(
                p_tick <= e,
                "something is due but poll_timeout is in the future"
            );
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn wheel_matches_btreemap_model(tick in tick(), ops in proptest::collection::vec(op(), 1..250)) {
            let t0 = Instant::now() + Duration::from_secs(20);
            let mut w = TimerWheel::new(t0, tick);
            let mut m = Model {
                start: t0,
                tick_ns: tick.as_nanos(),
                elapsed_tick: 0,
                seq: 0,
                pending: BTreeMap::new(),
                by_id: HashMap::new(),
            };
            let mut now = t0;
            let mut issued: Vec<TimerId> = Vec::new();
            let mut next_value = 0u32;
            let at = |now: Instant, off: i64| {
                if off >= 0 {
                    now + Duration::from_nanos(off as u64)
                } else {
                    now.checked_sub(Duration::from_nanos(off.unsigned_abs())).unwrap_or(now)
                }
            };
            for op in ops {
                match op {
                    Op::Insert(off) => {
                        let d = at(now, off);
                        let id = w.insert(d, next_value);
                        prop_assert!(!m.by_id.contains_key(&id), "id reused while live");
                        m.add(id, d, next_value);
                        issued.push(id);
                        next_value += 1;
                    }
                    Op::Cancel(i) => {
                        if issued.is_empty() { continue; }
                        let id = issued[i.index(issued.len())];
                        prop_assert_eq!(w.cancel(id), m.remove(id));
                    }
                    Op::Reschedule(i, off) => {
                        if issued.is_empty() { continue; }
                        let id = issued[i.index(issued.len())];
                        let d = at(now, off);
                        let new = w.reschedule(id, d);
                        match m.remove(id) {
                            None => prop_assert_eq!(new, None),
                            Some(v) => {
                                let new = new.ok_or_else(|| TestCaseError::fail("reschedule lost a live timer"))?;
                                prop_assert_eq!(w.deadline(id), None);
                                m.add(new, d, v);
                                issued.push(new);
                            }
                        }
                    }
                    Op::Expire(adv) => {
                        now = at(now, adv);
                        let mut out = Vec::new();
                        w.expire(now, &mut out);
                        prop_assert_eq!(out, m.expire(now));
                    }
                }
                prop_assert_eq!(w.len(), m.pending.len());
                prop_assert_eq!(w.is_empty(), m.pending.is_empty());
                check_poll_timeout(&w, &m)?;
            }
            for (id, (_, deadline)) in &m.by_id {
                prop_assert_eq!(w.deadline(*id), Some(*deadline));
            }
            // Drain: everything left fires, in model order.
            let end = now + Duration::from_secs(10_000 * 86_400);
            let mut out = Vec::new();
            w.expire(end, &mut out);
            prop_assert_eq!(out, m.expire(end));
            prop_assert!(w.is_empty());
            prop_assert_eq!(w.poll_timeout(), None);
        }
    }
}
