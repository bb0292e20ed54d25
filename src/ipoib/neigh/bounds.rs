//! The table's bounds: `neigh_max` learned entries and `neigh_max_per_source` resolved ones
//! per sender GID, the room a new entry needs, and the evictions that make it (least recently
//! used, never an entry in use), with the per-source lists they keep in step.

use std::net::IpAddr;

use super::{Evicted, Neigh, Neighbours, SlotId, EVICT_SCAN};
use crate::ipoib::Counters;
use crate::verbs::Gid;
use crate::wire::ipoib::HwAddr;

impl Neighbours {
    pub(super) fn source_full(&self, gid: Gid) -> bool {
        self.by_gid
            .get(&gid)
            .is_some_and(|ips| ips.len() >= self.per_source)
    }

    /// Makes room for one more learned entry charged to `gid` (if it has one): evicts within
    /// its source when that is full, else from the whole table when it is full: `Some` with
    /// the entry evicted, if one was; `None` when a cap is reached and nothing can be evicted.
    pub(super) fn room(
        &mut self,
        gid: Option<Gid>,
        in_use: &impl Fn(HwAddr) -> bool,
        c: &mut Counters,
    ) -> Option<Option<Evicted>> {
        if let Some(g) = gid.filter(|g| self.source_full(*g)) {
            c.neigh_source_full += 1;
            return self.evict_from_source(g, in_use, c).map(Some);
        }
        if self.learned < self.max {
            return Some(None);
        }
        c.neigh_table_full += 1;
        self.evict_lru(in_use, c).map(Some)
    }

    /// Evicts the least recently used entry not in use, looking at most at [`EVICT_SCAN`]
    /// entries; those in use move to the most recently used end.
    pub(super) fn evict_lru(
        &mut self,
        in_use: &impl Fn(HwAddr) -> bool,
        c: &mut Counters,
    ) -> Option<Evicted> {
        for _ in 0..EVICT_SCAN {
            let id = self.slots.lru()?;
            let busy = self
                .slots
                .get(id)
                .and_then(Neigh::resolved)
                .is_some_and(in_use);
            if !busy {
                return self.evict(id, c);
            }
            self.slots.touch(id);
        }
        None
    }

    /// Evicts `gid`'s least recently used entry not in use.
    pub(super) fn evict_from_source(
        &mut self,
        gid: Gid,
        in_use: &impl Fn(HwAddr) -> bool,
        c: &mut Counters,
    ) -> Option<Evicted> {
        let victim = self
            .by_gid
            .get(&gid)?
            .iter()
            .filter_map(|ip| Some((self.find(ip)?, self.get(ip)?)))
            .filter(|(_, n)| !n.hw.is_some_and(in_use))
            .min_by_key(|(_, n)| n.last_used)
            .map(|(id, _)| id)?;
        self.evict(victim, c)
    }

    pub(super) fn evict(&mut self, id: SlotId, c: &mut Counters) -> Option<Evicted> {
        let ip = self.slots.ip(id)?;
        let n = self.remove(&ip)?;
        c.neigh_evicted += 1;
        Some(Evicted(n))
    }

    pub(super) fn insert_learned(&mut self, ip: IpAddr, n: Neigh) {
        let id = self.slots.insert(ip, n, true);
        self.index.insert(ip, id);
        self.learned += 1;
    }

    pub(super) fn charge(&mut self, gid: Gid, ip: IpAddr) {
        self.by_gid.entry(gid).or_default().push(ip);
    }

    pub(super) fn uncharge(&mut self, gid: Gid, ip: &IpAddr) {
        if let Some(ips) = self.by_gid.get_mut(&gid) {
            if let Some(at) = ips.iter().position(|i| i == ip) {
                ips.swap_remove(at);
            }
            if ips.is_empty() {
                self.by_gid.remove(&gid);
            }
        }
    }
}
