//! Paths to neighbours' ports, by GID, and the LIDs they name: where the endpoint's address
//! vectors (UD sends, RC RTR) and REQs take their LIDs, SL, MTU, rate and GRH from, and how a
//! UD message without a GRH (IB unicast) is attributed to a port.
//!
//! # Invariants
//!
//! - [`Endpoint::set_path`] is the one place a path is set for a GID; a GID with none gets
//!   [`Path::roce`] from the port's GID and the configured MTU, which reproduces the address
//!   vectors and REQs of a RoCE port exactly.
//! - The tables are bounded by `cap` (the neighbour cache's `neigh_max`): a new GID beyond
//!   it replaces the smallest GID's path (and its LID entry), so memory stays bounded
//!   whatever the caller sets (or the peers' REJs say).
//! - A peer's MTU cap comes only from its own REJ 26 (invalid path MTU) naming the largest
//!   path MTU it accepts, and lasts until the peer disconnects one of our connections to it
//!   (its MTU may have changed since) or restarts: [`Endpoint::path_mtu_to`] is never above
//!   it, so every later REQ to that peer carries an MTU it takes.
//! - A LID names at most one GID: a path that gives a known LID to another GID takes it over.

use std::collections::BTreeMap;

use super::Endpoint;
use crate::verbs::{AddressVector, Gid, Lid, Path, PathMtu};

/// The paths set for neighbours' GIDs and the unicast LIDs they name.
#[derive(Debug)]
pub(super) struct Paths {
    by_gid: BTreeMap<Gid, Path>,
    by_lid: BTreeMap<Lid, Gid>,
    /// The largest path MTU each peer said (REJ 26) it accepts.
    mtu_caps: BTreeMap<Gid, PathMtu>,
    cap: usize,
    /// Changes whenever a path is set, replaced or forgotten.
    generation: u64,
}

impl Paths {
    pub(super) fn new(cap: usize) -> Self {
        Self {
            by_gid: BTreeMap::new(),
            by_lid: BTreeMap::new(),
            mtu_caps: BTreeMap::new(),
            cap: cap.max(1),
            generation: 0,
        }
    }

    /// Sets `gid`'s path (pushing out the smallest GID's at the cap).
    pub(super) fn set(&mut self, gid: Gid, path: Path) {
        self.generation += 1;
        if !self.by_gid.contains_key(&gid) && self.by_gid.len() >= self.cap {
            if let Some((&old, _)) = self.by_gid.iter().next() {
                self.remove(old);
            }
        }
        if let Some(prev) = self.by_gid.insert(gid, Path { dgid: gid, ..path }) {
            if self.by_lid.get(&prev.dlid) == Some(&gid) {
                self.by_lid.remove(&prev.dlid);
            }
        }
        if path.dlid.is_unicast() {
            if let Some(other) = self.by_lid.insert(path.dlid, gid) {
                if other != gid {
                    // The LID moved to another port (the SM reassigned it): the old GID's
                    // path is stale.
                    self.by_gid.remove(&other);
                }
            }
        }
    }

    /// Caps the path MTU towards `gid` at `mtu`, what the peer said it accepts (pushing out
    /// the smallest GID's cap at the table's bound).
    pub(super) fn cap_mtu(&mut self, gid: Gid, mtu: PathMtu) {
        if !self.mtu_caps.contains_key(&gid) && self.mtu_caps.len() >= self.cap {
            self.mtu_caps.pop_first();
        }
        self.mtu_caps.insert(gid, mtu);
    }

    /// Forgets the MTU cap of `gid`; whether it had one.
    pub(super) fn uncap_mtu(&mut self, gid: Gid) -> bool {
        self.mtu_caps.remove(&gid).is_some()
    }

    /// The MTU cap of `gid`, if its REJ set one.
    pub(super) fn mtu_cap(&self, gid: &Gid) -> Option<PathMtu> {
        self.mtu_caps.get(gid).copied()
    }

    /// Forgets every path (a port event: the SA's answers no longer hold).
    pub(super) fn clear(&mut self) {
        self.generation += 1;
        self.by_gid.clear();
        self.by_lid.clear();
    }

    /// Forgets `gid`'s path.
    pub(super) fn remove(&mut self, gid: Gid) {
        if let Some(p) = self.by_gid.remove(&gid) {
            self.generation += 1;
            if self.by_lid.get(&p.dlid) == Some(&gid) {
                self.by_lid.remove(&p.dlid);
            }
        }
    }

    /// The path set for `gid`.
    pub(super) fn get(&self, gid: &Gid) -> Option<&Path> {
        self.by_gid.get(gid)
    }

    /// Changes whenever a path is set, replaced or forgotten.
    pub(super) const fn generation(&self) -> u64 {
        self.generation
    }

    /// The path set for every GID of `gids` that has one.
    pub(super) fn of<'a>(
        &'a self,
        gids: impl Iterator<Item = Gid> + 'a,
    ) -> impl Iterator<Item = (Gid, Path)> + 'a {
        gids.filter_map(|g| self.by_gid.get(&g).map(|p| (g, *p)))
    }

    /// The GIDs with a path.
    pub(super) fn gids(&self) -> impl Iterator<Item = Gid> + '_ {
        self.by_gid.keys().copied()
    }

    /// The GID whose path names LID `lid`.
    pub(super) fn gid_of(&self, lid: Lid) -> Option<Gid> {
        self.by_lid.get(&lid).copied()
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_gid.len()
    }
}

impl Endpoint {
    /// Sets the path to the port with GID `gid` (from the SA's PathRecord on InfiniBand):
    /// every later UD send to it, connection to it and REQ it gets uses the path's LIDs,
    /// SL, rate and GRH, and a UD message without a GRH from its LID is attributed to it.
    /// The path's `dgid` is taken to be `gid`. Connections already set up keep theirs.
    pub fn set_path(&mut self, gid: Gid, path: Path) {
        self.paths.set(gid, path);
    }

    /// Forgets the path to `gid`: it is the RoCE default again ([`Endpoint::path_to`]).
    pub fn clear_path(&mut self, gid: Gid) {
        self.paths.remove(gid);
    }

    /// The path to `gid`: the one set by [`Endpoint::set_path`], else the RoCE default from
    /// this port's GID with the configured path MTU.
    pub fn path_to(&self, gid: Gid) -> Path {
        self.paths
            .get(&gid)
            .copied()
            .unwrap_or_else(|| Path::roce(self.hwaddr.gid, gid, self.cfg.path_mtu))
    }

    /// The address vector of a UD send or RC connection to `gid`. A multicast group the SA
    /// answered a join for is addressed by its member record ([`Endpoint::group_av`]: the
    /// MLID, always with a GRH); any other GID by its path.
    pub(super) fn av_to(&self, gid: Gid) -> AddressVector {
        self.group_av(gid).unwrap_or_else(|| self.path_to(gid).av())
    }

    /// The path MTU towards `gid`: its path's, never above the configured one nor the cap the
    /// peer set with a REJ 26.
    pub(super) fn path_mtu_to(&self, gid: Gid) -> PathMtu {
        let mtu = self.path_to(gid).mtu.min(self.cfg.path_mtu);
        self.paths.mtu_cap(&gid).map_or(mtu, |cap| mtu.min(cap))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::Sl;

    fn gid(n: u8) -> Gid {
        Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, n])
    }

    fn ib(n: u8, lid: u16) -> Path {
        Path {
            dlid: Lid(lid),
            slid: Lid(1),
            sl: Sl::ZERO,
            hop_limit: 0,
            ..Path::roce(gid(0), gid(n), PathMtu::Mtu2048)
        }
    }

    #[test]
    fn lids_name_one_gid_and_the_tables_stay_capped() {
        let mut p = Paths::new(3);
        p.set(gid(1), ib(1, 0x10));
        p.set(gid(2), ib(2, 0x20));
        assert_eq!(p.gid_of(Lid(0x10)), Some(gid(1)));
        // The path's LID changes: the old LID no longer names it.
        p.set(gid(1), ib(1, 0x11));
        assert_eq!(
            (p.gid_of(Lid(0x10)), p.gid_of(Lid(0x11))),
            (None, Some(gid(1)))
        );
        // LID 0x20 moves to gid 3: gid 2's path goes.
        p.set(gid(3), ib(3, 0x20));
        assert_eq!(p.gid_of(Lid(0x20)), Some(gid(3)));
        assert!(p.get(&gid(2)).is_none());
        // RoCE paths have no LID to index.
        p.set(gid(4), Path::roce(gid(0), gid(4), PathMtu::Mtu1024));
        assert_eq!(p.gid_of(Lid::NONE), None);
        for n in 10..100 {
            p.set(gid(n), ib(n, 0x100 + u16::from(n)));
        }
        assert_eq!(p.len(), 3);
        assert!(p.by_lid.len() <= 3);
        assert!(p
            .by_lid
            .iter()
            .all(|(l, g)| p.get(g).is_some_and(|x| x.dlid == *l)));
    }

    #[test]
    fn mtu_caps_stay_capped_and_are_forgotten_on_request() {
        let mut p = Paths::new(2);
        for n in 1..=10 {
            p.cap_mtu(gid(n), PathMtu::Mtu1024);
        }
        assert_eq!(p.mtu_caps.len(), 2);
        assert_eq!(p.mtu_cap(&gid(10)), Some(PathMtu::Mtu1024));
        p.cap_mtu(gid(10), PathMtu::Mtu2048);
        assert_eq!(p.mtu_cap(&gid(10)), Some(PathMtu::Mtu2048));
        assert!(p.uncap_mtu(gid(10)));
        assert!(!p.uncap_mtu(gid(10)));
        assert_eq!(p.mtu_cap(&gid(10)), None);
    }
}
