//! Multicast groups joined through a Subnet Administrator (a native InfiniBand port), as
//! kernel ipoib's `ipoib_multicast.c` holds them.
//!
//! Off by default: on RoCE and the software provider there is no SA, the UD QP is attached
//! to its groups at set-up with MLID 0 and everything below is inert. The driver that owns
//! an SA client turns it on with [`Endpoint::use_sa_groups`]; from then on:
//!
//! - the endpoint asks for joins, leaves and path queries through
//!   [`Endpoint::poll_sa_request`], and is told the answers through
//!   [`Endpoint::set_group_joined`] and [`Endpoint::set_sa_path`];
//! - nothing is sent over UD (multicast, broadcast or unicast) until the broadcast group's
//!   join is answered, as kernel ipoib keeps its carrier off until then;
//! - the broadcast group's record sets the UD QP's Q_Key and clamps the UD MTU
//!   ([`Endpoint::broadcast_group`]);
//! - the full-member groups of [`ud_groups`](super::ud::ud_groups) are attached with the
//!   MLID their record gives, once joined; a group only sent to gets a send-only join before
//!   its first send, and the packets before that join answered are dropped (counted in
//!   `tx_dropped`);
//! - a port event (LID, SM, P_Key change, client reregister, port down or up) detaches every
//!   group and forgets every record and path, then hands the event on: the SA client rejoins,
//!   and each answer re-attaches with the new MLID;
//! - unicast UD messages and new TX connections wait for their destination's PathRecord
//!   (`path_wait.rs`).
//!
//! # Bounds
//! Send-only groups by [`MAX_SEND_ONLY`] (the rest are dropped unjoined), queued requests by
//! [`MAX_SA_REQUESTS`] (the oldest path query gives way first, failing what waited for it;
//! joins and leaves are never dropped, being bounded by the group tables, and a port event
//! already queued is not queued again), paths asked for by `neigh_max`, messages waiting for
//! paths by `path_wait.rs`'s bounds.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use std::time::Instant;

use super::path_wait::PathWait;
use super::Endpoint;
use super::TxCloseReason;
use crate::sa::GroupParams;
use crate::verbs::{
    AddressVector, Gid, Grh, Lid, Path, QKey, QpAttr, QpNum, QpState, Rate, Sl, Verbs,
};
use crate::wire::ipoib::broadcast_mgid;
use crate::wire::sa::PathRecord;

/// Most groups the endpoint holds send-only joins for at once.
pub const MAX_SEND_ONLY: usize = 32;

/// Most requests queued for the driver.
pub const MAX_SA_REQUESTS: usize = 256;

/// A port event the SA client must see (paths and memberships are void).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortChange {
    /// `IBV_EVENT_PORT_ACTIVE`.
    Active,
    /// `IBV_EVENT_PORT_ERR`.
    Down,
    /// `IBV_EVENT_LID_CHANGE`.
    LidChange,
    /// `IBV_EVENT_SM_CHANGE`.
    SmChange,
    /// `IBV_EVENT_CLIENT_REREGISTER`.
    ClientReregister,
    /// `IBV_EVENT_PKEY_CHANGE`.
    PkeyChange,
}

/// What the endpoint asks of the SA client ([`Endpoint::poll_sa_request`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaRequest {
    /// Join `mgid`: as a full member (the groups the UD QP is attached to), or send-only.
    Join {
        /// The group.
        mgid: Gid,
        /// A send-only join (a group the endpoint only sends to).
        send_only: bool,
    },
    /// Leave `mgid` (the client sends no DELETE for a group kernel ipoib holds too).
    Leave {
        /// The group.
        mgid: Gid,
    },
    /// Ask for the PathRecord to a peer's GID.
    Path {
        /// The peer's GID.
        dgid: Gid,
    },
    /// Flush paths and rejoin.
    Port(PortChange),
}

/// The endpoint's side of SA-held groups; see the [module docs](self).
#[derive(Debug, Default)]
pub(super) struct SaGroups {
    /// An SA client feeds this endpoint.
    enabled: bool,
    /// The broadcast group's record, once joined.
    broadcast: Option<GroupParams>,
    /// Groups joined, with their record and whether the join was send-only.
    joined: BTreeMap<Gid, (GroupParams, bool)>,
    /// Groups the UD QP is attached to now, with the MLID it was attached with.
    attached: BTreeMap<Gid, u16>,
    /// Send-only joins asked for (answered or not), at most [`MAX_SEND_ONLY`].
    send_only: BTreeSet<Gid>,
    /// Requests for the driver.
    requests: VecDeque<SaRequest>,
    /// Path queries asked for and not answered.
    asked_paths: BTreeSet<Gid>,
    /// Messages waiting for their destination's path.
    pub(super) waiting: PathWait,
}

impl SaGroups {
    /// Queues `r`; returns the destination of a path query that did not fit (the oldest
    /// queued one, or `r` itself), which is no longer asked for.
    fn push(&mut self, r: SaRequest) -> Option<Gid> {
        if matches!(r, SaRequest::Port(_)) && self.requests.contains(&r) {
            return None;
        }
        let mut dropped = None;
        let mut keep = true;
        if self.requests.len() >= MAX_SA_REQUESTS {
            // Path queries are asked again by the next message to the peer; groups are not.
            if let Some(i) = self
                .requests
                .iter()
                .position(|q| matches!(q, SaRequest::Path { .. }))
            {
                if let Some(SaRequest::Path { dgid }) = self.requests.remove(i) {
                    dropped = Some(dgid);
                }
            } else if let SaRequest::Path { dgid } = r {
                dropped = Some(dgid);
                keep = false;
            }
        }
        if let Some(d) = dropped {
            self.asked_paths.remove(&d);
        }
        if keep {
            self.requests.push_back(r);
        }
        dropped
    }
}

impl Endpoint {
    /// Hands the multicast groups to an SA client (a native InfiniBand port): the UD QP is
    /// detached from the groups set-up attached it to (with no MLID), one full-member join
    /// is queued for each, and UD traffic waits for the broadcast group's join. Call it once,
    /// right after [`Endpoint::new`].
    pub fn use_sa_groups<V: Verbs>(&mut self, v: &mut V) {
        if self.sa.enabled {
            return;
        }
        self.sa.enabled = true;
        let Some(qp) = self.ud_qp() else {
            return;
        };
        for g in self.ud_groups().to_vec() {
            if let Err(e) = v.detach_mcast(qp, g) {
                tracing::debug!(group = %g, error = %e, "detach_mcast failed");
            }
            self.push_sa(SaRequest::Join {
                mgid: g,
                send_only: false,
            });
        }
    }

    /// Queues a request for the SA client; a path query pushed out fails what waited for it.
    fn push_sa(&mut self, r: SaRequest) {
        if let Some(dgid) = self.sa.push(r) {
            self.fail_path_wait(dgid);
        }
    }

    /// Whether an SA client holds the groups ([`Endpoint::use_sa_groups`]).
    pub fn uses_sa_groups(&self) -> bool {
        self.sa.enabled
    }

    /// The next request for the SA client.
    pub fn poll_sa_request(&mut self) -> Option<SaRequest> {
        self.sa.requests.pop_front()
    }

    /// The broadcast group's record, once its join was answered (`None` without an SA).
    pub fn broadcast_group(&self) -> Option<GroupParams> {
        self.sa.broadcast
    }

    /// The group's record, once its join was answered.
    pub fn group(&self, mgid: Gid) -> Option<GroupParams> {
        self.sa.joined.get(&mgid).map(|(p, _)| *p)
    }

    /// The MLID the UD QP is attached to `mgid` with, if it is.
    pub fn attached_mlid(&self, mgid: Gid) -> Option<u16> {
        self.sa.attached.get(&mgid).copied()
    }

    /// The SA answered the join of `mgid` with `params`. The broadcast group's record sets
    /// the Q_Key of the UD QP and clamps the UD MTU; a full-member group is attached with its
    /// MLID (again, if the MLID changed).
    pub fn set_group_joined<V: Verbs>(&mut self, v: &mut V, mgid: Gid, params: GroupParams) {
        if !self.sa.enabled {
            return;
        }
        let Some(qp) = self.ud_qp() else {
            return;
        };
        let full = self.ud_groups().contains(&mgid);
        if !full && !self.sa.send_only.contains(&mgid) {
            // Not ours (any more): nothing to hold.
            return;
        }
        if mgid == broadcast_mgid(self.cfg.mgid_pkey()) {
            self.apply_broadcast(v, params);
        }
        self.sa.joined.insert(mgid, (params, !full));
        if full && self.sa.attached.get(&mgid) != Some(&params.mlid) {
            if self.sa.attached.remove(&mgid).is_some() {
                let _ = v.detach_mcast(qp, mgid);
            }
            match v.attach_mcast(qp, mgid, params.mlid) {
                Ok(()) => {
                    self.sa.attached.insert(mgid, params.mlid);
                }
                Err(e) => {
                    tracing::warn!(group = %mgid, mlid = params.mlid, error = %e, "attach_mcast failed");
                }
            }
        }
    }

    /// The address vector of a UD send to group `mgid` once the SA answered its join
    /// (`ipoib_mcast_join_finish`): DLID the MLID, the record's SL and rate, and a GRH to the
    /// MGID with its flow label, hop limit and traffic class (multicast always carries one).
    pub(super) fn group_av(&self, mgid: Gid) -> Option<AddressVector> {
        let (p, _) = self.sa.joined.get(&mgid)?;
        Some(AddressVector {
            dlid: Lid(p.mlid),
            sl: Sl::from_bits(p.sl),
            src_path_bits: 0,
            static_rate: Rate(p.rate),
            grh: Some(Grh {
                dgid: mgid,
                sgid_index: None,
                flow_label: p.flow_label & 0x000F_FFFF,
                hop_limit: p.hop_limit,
                traffic_class: p.tclass,
            }),
        })
    }

    fn apply_broadcast<V: Verbs>(&mut self, v: &mut V, params: GroupParams) {
        self.sa.broadcast = Some(params);
        let qkey = QKey(params.qkey);
        let Some(qp) = self.ud_qp() else {
            return;
        };
        if qkey != self.cfg.qkey {
            // RTS to RTS with the Q_Key, the one UD attribute that may change there.
            let attr = QpAttr {
                qkey: Some(qkey),
                ..QpAttr::to_state(QpState::Rts)
            };
            match v.modify_qp(qp, &attr) {
                Ok(()) => self.cfg.qkey = qkey,
                Err(e) => {
                    tracing::warn!(qkey = params.qkey, error = %e, "could not set the broadcast group's Q_Key on the UD QP");
                }
            }
        }
    }

    /// The path the SA gave for `dgid` (a [`SaRequest::Path`] answered): set as the
    /// neighbour's [`Path`] ([`Endpoint::set_path`]), which every later address vector and
    /// REQ towards it uses; replaced by a later answer. What waited for it goes out now, in
    /// order (`path_wait.rs`): the driver sends the CM's MADs after this. An answer nobody
    /// asked for is dropped.
    pub fn set_sa_path<V: Verbs>(&mut self, now: Instant, v: &mut V, dgid: Gid, rec: &PathRecord) {
        if !self.sa.asked_paths.remove(&dgid) && self.paths.get(&dgid).is_none() {
            return;
        }
        let path = Path::from_record(rec);
        self.set_path(dgid, path);
        // A connection on the old LID carries nothing any more: closed, the next packet
        // opens one on this path.
        let moved: Vec<QpNum> = self
            .tx
            .to_node(dgid)
            .into_iter()
            .filter(|q| self.tx.get(q).is_some_and(|t| t.dlid != path.dlid))
            .collect();
        for q in moved {
            self.close_tx(now, v, q, TxCloseReason::PathMoved, None);
        }
        self.release_path_wait(now, v, dgid);
    }

    /// The SA had no path to `dgid`: what waited for it is dropped (counted in
    /// `path_failed_drops`), and the next message to it asks again.
    pub fn path_failed(&mut self, dgid: Gid) {
        self.sa.asked_paths.remove(&dgid);
        self.fail_path_wait(dgid);
    }

    /// The path set for `dgid` (by the SA or [`Endpoint::set_path`]), if any.
    pub fn path(&self, dgid: Gid) -> Option<Path> {
        self.paths.get(&dgid).copied()
    }

    /// Asks the SA for the path to a peer's GID once (while unanswered), when an SA client
    /// holds the groups; the answer arrives through [`Endpoint::set_sa_path`]. The endpoint asks
    /// by itself for every neighbour it resolves and for every message that waits for a path.
    /// Bounded: at most `neigh_max` GIDs. Returns whether a query for `dgid` is outstanding
    /// (false with a path known, without an SA, or at the bound).
    pub fn want_path(&mut self, dgid: Gid) -> bool {
        if !self.sa.enabled || self.paths.get(&dgid).is_some() {
            return false;
        }
        if self.sa.asked_paths.contains(&dgid) {
            return true;
        }
        if self.sa.asked_paths.len() >= self.cfg.neigh_max {
            return false;
        }
        self.sa.asked_paths.insert(dgid);
        self.push_sa(SaRequest::Path { dgid });
        self.sa.asked_paths.contains(&dgid)
    }

    /// A port event: every group is detached and every record forgotten, and the event goes
    /// on to the SA client, which rejoins (each answer re-attaches). Our LID changed: every
    /// TX connection is closed too (its packets name the old LID, which the peer's QP no
    /// longer takes), as Linux ipoib's flush of a `LID_CHANGE` does; on a follower that is
    /// all (control holds the groups and the paths, and its next view brings the new ones).
    pub fn port_changed<V: Verbs>(&mut self, v: &mut V, change: PortChange) {
        if !self.sa.enabled && !self.is_follower() {
            return;
        }
        if change == PortChange::LidChange {
            let all: Vec<QpNum> = self.tx.iter().map(|(q, _)| *q).collect();
            let now = self.last_now;
            for q in all {
                self.close_tx(now, v, q, TxCloseReason::LidChanged, None);
            }
        }
        if !self.sa.enabled {
            return;
        }
        for (g, _) in std::mem::take(&mut self.sa.attached) {
            if let Some(qp) = self.ud_qp() {
                let _ = v.detach_mcast(qp, g);
            }
        }
        self.sa.joined.clear();
        self.sa.broadcast = None;
        // The peers this node sends to: its own connections', and every path it held (the
        // followers' connections run on those, published in the neighbour view).
        let peers: BTreeSet<Gid> = self
            .tx
            .iter()
            .map(|(_, t)| t.peer.gid)
            .chain(self.paths.gids())
            .collect();
        self.paths.clear();
        self.sa.asked_paths.clear();
        // The client voids its outstanding queries: nothing answers for what waited.
        self.fail_every_path_wait();
        self.push_sa(SaRequest::Port(change));
        // Their paths are asked for again now, after the event (the SM may have moved them):
        // a connection whose peer's LID moved is closed when the answer comes (`set_sa_path`,
        // on a follower its next view). Bounded by the TX table and the paths' cap.
        for gid in peers {
            self.want_path(gid);
        }
    }

    /// Whether a UD send to `mgid` (multicast) or to a unicast peer (`None`) may go now: with
    /// an SA, only after the broadcast group's join, and to a group only once joined. A
    /// group neither joined nor asked for gets its send-only join asked for here.
    pub(super) fn ud_send_ready(&mut self, mgid: Option<Gid>) -> bool {
        if !self.sa.enabled {
            return true;
        }
        if self.sa.broadcast.is_none() {
            return false;
        }
        let Some(mgid) = mgid else {
            return true;
        };
        if self.sa.joined.contains_key(&mgid) {
            return true;
        }
        if !self.ud_groups().contains(&mgid)
            && self.sa.send_only.len() < MAX_SEND_ONLY
            && self.sa.send_only.insert(mgid)
        {
            self.push_sa(SaRequest::Join {
                mgid,
                send_only: true,
            });
        }
        false
    }

    /// The UD MTU: the configured one, clamped by the broadcast group's MTU when an SA gave
    /// it (`IPOIB_UD_MTU(mcast_mtu)`).
    pub fn ud_mtu(&self) -> u32 {
        let own = self.cfg.ud_mtu();
        self.sa.broadcast.and_then(|b| b.mtu).map_or(own, |m| {
            own.min(u32::try_from(m.bytes()).unwrap_or(own) - 4)
        })
    }

    /// The interface MTU: 65520 in connected mode, [`ud_mtu`](Self::ud_mtu) in datagram
    /// mode.
    pub fn interface_mtu(&self) -> u32 {
        match self.cfg.mode {
            super::Mode::Connected => self.cfg.interface_mtu(),
            super::Mode::Datagram => self.ud_mtu(),
        }
    }

    /// Queues a leave for every group joined or asked for (at the end of a shutdown, with
    /// [`Endpoint::leave_groups`]).
    pub(super) fn leave_sa_groups<V: Verbs>(&mut self, v: &mut V) {
        if !self.sa.enabled {
            return;
        }
        for (g, _) in std::mem::take(&mut self.sa.attached) {
            if let Some(qp) = self.ud_qp() {
                let _ = v.detach_mcast(qp, g);
            }
        }
        let mut all: BTreeSet<Gid> = self.ud_groups().iter().copied().collect();
        all.extend(std::mem::take(&mut self.sa.send_only));
        self.sa.joined.clear();
        self.sa.broadcast = None;
        for mgid in all {
            self.push_sa(SaRequest::Leave { mgid });
        }
    }
}
