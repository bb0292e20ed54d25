//! The bookkeeping of the address handles of UD sends: a cache bounded at [`MAX_CACHED_AHS`]
//! with least-recently-used eviction, and a bounded list of evicted ("retired") handles that
//! are destroyed only once no posted send can still use them.
//!
//! Pure logic, generic over the key and the handle, so it is tested without a device; the
//! provider does the creating and destroying.
//!
//! Invariant: a handle is handed out for destruction (by [`AhCache::reap`] or
//! [`AhCache::drain`]) only when, for every QP that posted a send with it, that QP's completed
//! sends reached the number of sends the QP had posted right after its last send with the
//! handle, or the QP is gone. This holds because a QP's send queue completes in order (flushes
//! included), so once `completed >= posted` every send up to that one was processed, and a
//! destroyed QP processes nothing more. Each handle records one `(qp, posted)` pair per QP that
//! used it (only UD QPs do, and their number is set by the configuration, not by the wire).
//!
//! Bound: a retired handle with a send still pending needs one of the QP's send queue slots;
//! after a [`AhCache::reap`] at most the sum of the UD QPs' send queue depths (`ud_depth`, 256
//! by default) are pending, below [`MAX_RETIRED_AHS`]. When the list is full anyway, a new destination is
//! refused ([`Room::Full`]) rather than grown past the bound.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// Address handles kept for reuse (one per (PD, destination) sent to): every node of an
/// 8,192-node partition, so that datagram mode in a cluster of that size creates each once.
pub(super) const MAX_CACHED_AHS: usize = 8192;
/// Evicted address handles waiting for their posted sends to complete: above the UD send
/// queue's default depth.
pub(super) const MAX_RETIRED_AHS: usize = 512;

/// A provider QP number, as the cache records it.
pub(super) type QpKey = u32;

/// One QP's use of a handle: the QP and its posted-send count after its last send with it.
type Posted = Vec<(QpKey, u64)>;

#[derive(Debug)]
struct Live<H> {
    handle: H,
    last_use: u64,
    posted: Posted,
}

#[derive(Debug)]
struct Retired<H> {
    handle: H,
    posted: Posted,
}

/// Whether [`AhCache::make_room`] made room for one more handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Room {
    /// There was room.
    Free,
    /// The least recently used handle was retired to make room.
    Evicted,
    /// The cache is full and so is the retired list: no room.
    Full,
}

/// See the [module documentation](self).
#[derive(Debug)]
pub(super) struct AhCache<K, H> {
    live: HashMap<K, Live<H>>,
    /// `last_use` → key, oldest first; one entry per live handle.
    lru: BTreeMap<u64, K>,
    next_use: u64,
    retired: Vec<Retired<H>>,
    cap: usize,
    retired_cap: usize,
}

impl<K: Hash + Eq + Clone, H: Copy> AhCache<K, H> {
    pub(super) fn new(cap: usize, retired_cap: usize) -> Self {
        Self {
            live: HashMap::new(),
            lru: BTreeMap::new(),
            next_use: 0,
            retired: Vec::new(),
            cap: cap.max(1),
            retired_cap,
        }
    }

    /// The cached handle of `key`, now the most recently used.
    pub(super) fn get(&mut self, key: &K) -> Option<H> {
        let e = self.live.get_mut(key)?;
        self.lru.remove(&e.last_use);
        e.last_use = self.next_use;
        self.next_use += 1;
        self.lru.insert(e.last_use, key.clone());
        Some(e.handle)
    }

    /// Makes room for one more handle, retiring the least recently used one if the cache is
    /// full.
    pub(super) fn make_room(&mut self) -> Room {
        if self.live.len() < self.cap {
            return Room::Free;
        }
        if self.retired.len() >= self.retired_cap {
            return Room::Full;
        }
        let Some((_, key)) = self.lru.pop_first() else {
            return Room::Full;
        };
        if let Some(e) = self.live.remove(&key) {
            self.retired.push(Retired {
                handle: e.handle,
                posted: e.posted,
            });
        }
        Room::Evicted
    }

    /// Caches `handle` for `key` as the most recently used; call after [`Self::make_room`]
    /// answered other than [`Room::Full`].
    pub(super) fn insert(&mut self, key: K, handle: H) {
        let last_use = self.next_use;
        self.next_use += 1;
        if let Some(old) = self.live.insert(
            key.clone(),
            Live {
                handle,
                last_use,
                posted: Vec::new(),
            },
        ) {
            self.lru.remove(&old.last_use);
            self.retired.push(Retired {
                handle: old.handle,
                posted: old.posted,
            });
        }
        self.lru.insert(last_use, key);
    }

    /// Records that `qp` posted a send with `key`'s handle, its `posted`-th send.
    pub(super) fn note_post(&mut self, key: &K, qp: QpKey, posted: u64) {
        let Some(e) = self.live.get_mut(key) else {
            return;
        };
        match e.posted.iter_mut().find(|(q, _)| *q == qp) {
            Some(p) => p.1 = p.1.max(posted),
            None => e.posted.push((qp, posted)),
        }
    }

    /// Forgets `qp`'s sends (the QP was destroyed: they will never be processed).
    pub(super) fn qp_gone(&mut self, qp: QpKey) {
        for e in self.live.values_mut() {
            e.posted.retain(|(q, _)| *q != qp);
        }
        for r in &mut self.retired {
            r.posted.retain(|(q, _)| *q != qp);
        }
    }

    /// Moves every retired handle whose sends all completed into `out`; `completed` gives a
    /// QP's completed-send count, `None` for a QP that no longer exists.
    pub(super) fn reap(&mut self, completed: impl Fn(QpKey) -> Option<u64>, out: &mut Vec<H>) {
        self.retired.retain(|r| {
            let done = r
                .posted
                .iter()
                .all(|&(q, p)| completed(q).is_none_or(|c| c >= p));
            if done {
                out.push(r.handle);
            }
            !done
        });
    }

    /// Every handle, live and retired, emptying the cache (for closing the device, after its
    /// QPs were destroyed).
    pub(super) fn drain(&mut self) -> Vec<H> {
        self.lru.clear();
        let mut all: Vec<H> = self.live.drain().map(|(_, e)| e.handle).collect();
        all.extend(self.retired.drain(..).map(|r| r.handle));
        all
    }

    pub(super) fn retired_len(&self) -> usize {
        self.retired.len()
    }
}

#[cfg(test)]
mod tests;
