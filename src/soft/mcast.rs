//! Multicast over a unicast underlay: the group memberships of UD QPs, and the underlay peers
//! a multicast send is copied to.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};

use crate::verbs::{Gid, QpNum, VerbsError};

/// Group memberships, fan-out peers and the fanned-out copies not yet transmitted.
#[derive(Debug, Default)]
pub(super) struct Multicast {
    /// Multicast group memberships of UD QPs (`attach_mcast`).
    groups: HashMap<Gid, Vec<QpNum>>,
    /// Underlay addresses a multicast UD send is fanned out to (never the local address).
    pub(super) peers: Vec<IpAddr>,
    /// Fanned-out copies of a multicast send waiting for `poll_transmit`.
    pub(super) fanout: VecDeque<(SocketAddr, Vec<u8>)>,
}

impl Multicast {
    /// Sets the fan-out peers: `peers` without `local`.
    pub(super) fn set_peers(&mut self, local: IpAddr, peers: Vec<IpAddr>) {
        self.peers = peers.into_iter().filter(|p| *p != local).collect();
    }

    /// Every QP attached to any group, once each, in QPN order: the fan-out underlay does not
    /// tell which group a packet was for.
    pub(super) fn members(&self) -> Vec<QpNum> {
        let mut members: Vec<QpNum> = self.groups.values().flatten().copied().collect();
        members.sort_unstable();
        members.dedup();
        members
    }

    /// Adds `qpn` to group `mgid` (a no-op if it is a member already).
    pub(super) fn attach(&mut self, qpn: QpNum, mgid: Gid) {
        let members = self.groups.entry(mgid).or_default();
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
        }
        Ok(())
    }

    /// Removes `qpn` from every group (it was destroyed).
    pub(super) fn forget(&mut self, qpn: QpNum) {
        self.groups.retain(|_, members| {
            members.retain(|q| *q != qpn);
            !members.is_empty()
        });
    }
}
