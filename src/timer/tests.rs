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
