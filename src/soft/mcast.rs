//! Multicast: the group memberships of UD QPs, the IP multicast group each MGID crosses the
//! underlay as, the unicast peers a multicast send is also copied to, and the duplicate filter
//! for packets that arrive both ways.
//!
//! A multicast UD send leaves as one IP multicast datagram to [`group_addr`] of its MGID (when
//! [`SoftConfig::multicast`](super::SoftConfig::multicast) is on and the MGID has an address on
//! the underlay's family) and as one unicast copy per fan-out peer. A receiver that hears both
//! (a listed peer on the same L2 segment) delivers the first and drops the second: the copies
//! carry the same sender IP, source QPN and PSN, which [`Multicast::first_copy`] remembers for
//! [`DUPLICATE_WINDOW`].

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::verbs::{Gid, QpNum, VerbsError};

/// How long a received multicast packet's (sender, source QPN, PSN) is remembered to drop the
/// same packet arriving the other way (IP multicast and unicast fan-out). The two copies leave
/// one after the other, so they arrive well within it; a UD QP's PSN moves on with every send.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(2);

/// Most multicast packets remembered for the duplicate check (the oldest is forgotten first).
pub(super) const DUPLICATE_MEMORY: usize = 64;

/// The IP multicast group that carries `mgid` over an underlay of `underlay`'s family, or
/// `None` when it has none there: [`Gid::multicast_group`] (rdma_rxe's mapping, and
/// `239.255.<P_Key>` for the IPoIB groups on IPv4).
pub fn group_addr(mgid: Gid, underlay: IpAddr) -> Option<IpAddr> {
    mgid.multicast_group(underlay)
}

/// Group memberships, fan-out peers and the fanned-out copies not yet transmitted.
#[derive(Debug, Default)]
pub(super) struct Multicast {
    /// Multicast group memberships of UD QPs (`attach_mcast`).
    groups: HashMap<Gid, Vec<QpNum>>,
    /// The MLID each group was attached with, where one was given (an InfiniBand link
    /// addresses and takes multicast by it).
    mlids: HashMap<Gid, u16>,
    /// Bumped whenever `groups` gains or loses a group, so that the provider knows when to
    /// open or close group sockets ([`Multicast::generation`]).
    generation: u64,
    /// Underlay addresses a multicast UD send is fanned out to (never the local address).
    pub(super) peers: Vec<IpAddr>,
    /// Fanned-out copies of a multicast send waiting for `poll_transmit`.
    pub(super) fanout: VecDeque<(SocketAddr, Vec<u8>)>,
    /// (arrival, sender IP, source QPN, PSN) of the last multicast packets delivered, newest
    /// last, at most [`DUPLICATE_MEMORY`].
    recent: VecDeque<(Instant, IpAddr, u32, u32)>,
}

impl Multicast {
    /// Sets the fan-out peers: `peers` without `local`.
    pub(super) fn set_peers(&mut self, local: IpAddr, peers: Vec<IpAddr>) {
        self.peers = peers.into_iter().filter(|p| *p != local).collect();
    }

    /// The QPs a multicast packet sent to `dst` goes to, once each, in QPN order: with `dst`
    /// an IP multicast group, those attached to a group that [`group_addr`] maps there; with
    /// `dst` a unicast address (a fan-out copy, which does not tell the group), those attached
    /// to any group.
    pub(super) fn members_for(&self, dst: IpAddr, underlay: IpAddr) -> Vec<QpNum> {
        let mut members: Vec<QpNum> = self
            .groups
            .iter()
            .filter(|(mgid, _)| !dst.is_multicast() || group_addr(**mgid, underlay) == Some(dst))
            .flat_map(|(_, qps)| qps.iter().copied())
            .collect();
        members.sort_unstable();
        members.dedup();
        members
    }

    /// The IP multicast groups the attached MGIDs map to on `underlay`'s family, sorted, once
    /// each: the groups the underlay socket must have joined.
    pub(super) fn ip_groups(&self, underlay: IpAddr) -> Vec<IpAddr> {
        let mut ips: Vec<IpAddr> = self
            .groups
            .keys()
            .filter_map(|g| group_addr(*g, underlay))
            .collect();
        ips.sort_unstable();
        ips.dedup();
        ips
    }

    /// Changes whenever a group is added or forgotten.
    pub(super) fn generation(&self) -> u64 {
        self.generation
    }

    /// True the first time the multicast packet (`src`, `src_qp`, `psn`) is seen within
    /// [`DUPLICATE_WINDOW`]; false for its second copy. Remembers it.
    pub(super) fn first_copy(&mut self, now: Instant, src: IpAddr, src_qp: u32, psn: u32) -> bool {
        while self
            .recent
            .front()
            .is_some_and(|(at, ..)| now.saturating_duration_since(*at) > DUPLICATE_WINDOW)
        {
            self.recent.pop_front();
        }
        if self
            .recent
            .iter()
            .any(|(_, s, q, p)| *s == src && *q == src_qp && *p == psn)
        {
            return false;
        }
        if self.recent.len() >= DUPLICATE_MEMORY {
            self.recent.pop_front();
        }
        self.recent.push_back((now, src, src_qp, psn));
        true
    }

    /// The QPs attached to `mgid`, in attach order.
    pub(super) fn members_of(&self, mgid: Gid) -> Vec<QpNum> {
        self.groups.get(&mgid).cloned().unwrap_or_default()
    }

    /// Whether a group is attached with `mlid`.
    pub(super) fn has_mlid(&self, mlid: u16) -> bool {
        self.mlids.values().any(|m| *m == mlid)
    }

    /// The MLIDs groups are attached with, sorted, once each.
    pub(super) fn mlids(&self) -> Vec<u16> {
        let mut m: Vec<u16> = self.mlids.values().copied().collect();
        m.sort_unstable();
        m.dedup();
        m
    }

    /// Adds `qpn` to group `mgid` (a no-op if it is a member already), the group known by
    /// `mlid` where that is nonzero.
    pub(super) fn attach(&mut self, qpn: QpNum, mgid: Gid, mlid: u16) {
        if mlid != 0 && self.mlids.insert(mgid, mlid) != Some(mlid) {
            self.generation += 1;
        }
        let members = self.groups.entry(mgid).or_default();
        if members.is_empty() {
            self.generation += 1;
        }
        if !members.contains(&qpn) {
            members.push(qpn);
        }
    }

    /// Removes `qpn` from group `mgid`; a group left empty is forgotten.
    pub(super) fn detach(&mut self, qpn: QpNum, mgid: Gid) -> Result<(), VerbsError> {
        let members = self
            .groups
            .get_mut(&mgid)
            .ok_or(VerbsError::NoSuchObject("multicast group"))?;
        let before = members.len();
        members.retain(|q| *q != qpn);
        if members.len() == before {
            return Err(VerbsError::NoSuchObject("multicast attachment"));
        }
        if members.is_empty() {
            self.groups.remove(&mgid);
            self.mlids.remove(&mgid);
            self.generation += 1;
        }
        Ok(())
    }

    /// Removes `qpn` from every group (it was destroyed).
    pub(super) fn forget(&mut self, qpn: QpNum) {
        let before = self.groups.len();
        self.groups.retain(|_, members| {
            members.retain(|q| *q != qpn);
            !members.is_empty()
        });
        let groups = &self.groups;
        self.mlids.retain(|g, _| groups.contains_key(g));
        if self.groups.len() != before {
            self.generation += 1;
        }
    }
}

#[cfg(test)]
mod tests;
