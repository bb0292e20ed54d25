use super::*;

use std::collections::HashMap;

type Cache = AhCache<u32, u32>;

/// Takes `key` in as the provider does: the cached handle, else room and a new handle `key`.
fn use_key(c: &mut Cache, key: u32) -> Room {
    if c.get(&key).is_some() {
        return Room::Free;
    }
    let room = c.make_room();
    if room != Room::Full {
        c.insert(key, key);
    }
    room
}

fn reap(c: &mut Cache, completed: &HashMap<QpKey, u64>) -> Vec<u32> {
    let mut out = Vec::new();
    c.reap(|q| completed.get(&q).copied(), &mut out);
    out.sort_unstable();
    out
}

/// A flood of new destinations keeps at most the cap live; the least recently used goes.
#[test]
fn the_cache_is_bounded_and_evicts_the_least_recently_used() {
    let mut c = Cache::new(3, 10);
    for k in 0..3 {
        assert_eq!(use_key(&mut c, k), Room::Free);
    }
    assert_eq!(c.get(&0), Some(0)); // 1 is now the oldest
    assert_eq!(use_key(&mut c, 3), Room::Evicted);
    assert_eq!(c.get(&1), None);
    assert!(c.get(&0).is_some() && c.get(&2).is_some() && c.get(&3).is_some());
    // Nothing was posted with 1: it is destroyed at the next reap.
    assert_eq!(reap(&mut c, &HashMap::new()), vec![1]);
    assert_eq!(c.retired_len(), 0);
}

/// An evicted handle is destroyed only once its QP completed every send posted with it.
#[test]
fn a_retired_handle_waits_for_its_sends_to_complete() {
    let mut c = Cache::new(1, 10);
    use_key(&mut c, 7);
    c.note_post(&7, 1, 5); // QP 1's fifth send
    c.note_post(&7, 2, 9); // QP 2's ninth send
    assert_eq!(use_key(&mut c, 8), Room::Evicted);
    let mut done = HashMap::from([(1, 4), (2, 100)]);
    assert!(
        reap(&mut c, &done).is_empty(),
        "QP 1's fifth send may be pending"
    );
    done.insert(1, 5);
    assert_eq!(reap(&mut c, &done), vec![7]);
}

/// A destroyed QP counts as all its sends completed, also when its number comes back.
#[test]
fn a_destroyed_qp_counts_as_all_sends_completed() {
    let mut c = Cache::new(1, 10);
    use_key(&mut c, 7);
    c.note_post(&7, 1, 50);
    use_key(&mut c, 8);
    c.note_post(&8, 1, 51);
    // The QP is destroyed and a new QP with the same number starts counting from zero.
    c.qp_gone(1);
    let reused = HashMap::from([(1, 0)]);
    assert_eq!(reap(&mut c, &reused), vec![7]);
    // The live handle forgot the old QP too: once evicted it goes at once.
    use_key(&mut c, 9);
    assert_eq!(reap(&mut c, &reused), vec![8]);
    // A QP missing from the counts is gone as well.
    c.note_post(&9, 3, 1);
    use_key(&mut c, 10);
    assert_eq!(reap(&mut c, &HashMap::new()), vec![9]);
}

/// With the retired list full, no new destination gets a handle: the total stays bounded.
#[test]
fn a_full_retired_list_refuses_new_destinations() {
    let mut c = Cache::new(2, 2);
    let pending = HashMap::from([(1, 0)]);
    for k in 0..4 {
        use_key(&mut c, k);
        c.note_post(&k, 1, k as u64 + 1);
    }
    assert_eq!(c.retired_len(), 2);
    assert_eq!(use_key(&mut c, 4), Room::Full);
    assert_eq!(c.get(&4), None);
    // Cached destinations are still served.
    assert_eq!(c.get(&3), Some(3));
    assert!(reap(&mut c, &pending).is_empty());
    // Completions free the list again.
    assert_eq!(reap(&mut c, &HashMap::from([(1, 2)])), vec![0, 1]);
    assert_eq!(use_key(&mut c, 4), Room::Evicted);
}

/// Closing hands out every handle, live and retired, once.
#[test]
fn drain_returns_every_handle_once() {
    let mut c = Cache::new(2, 5);
    for k in 0..4 {
        use_key(&mut c, k);
        c.note_post(&k, 1, 1);
    }
    let mut all = c.drain();
    all.sort_unstable();
    assert_eq!(all, vec![0, 1, 2, 3]);
    assert!(c.drain().is_empty());
    assert_eq!(c.get(&3), None);
}
