//! A sans-IO Subnet Administration client: PathRecord queries with a bounded cache, expiry and
//! a negative cache, and MCMemberRecord joins and leaves with retransmission, for one port.
//!
//! The caller owns the clock and the transport (umad on hardware: `sys::umad`). Each turn it
//! hands the client what arrived ([`SaClient::handle_mad`]), the port's events
//! ([`SaClient::port_event`]) and the time ([`SaClient::poll_timeout`] once
//! [`SaClient::next_deadline`] has passed), then sends what [`SaClient::pop_transmit`] returns
//! (to QP1 of the SM's LID, Q_Key `0x8001_0000`) and acts on [`SaClient::pop_event`].
//!
//! # Invariants
//!
//! - Every table is bounded by [`SaConfig`]: cached paths, negative entries, groups and
//!   outstanding requests; hitting a cap is counted in [`SaCounters`], never an allocation.
//! - A request is matched by the low 32 bits of its transaction ID only: the kernel's umad
//!   (and ibsim's `umad2sim`) rewrite the high bits with their agent ID.
//! - A request is retransmitted every [`SaConfig::request_timeout`] at most
//!   [`SaConfig::max_retries`] times, then fails; a failed join is tried again after
//!   [`SaConfig::rejoin_backoff`].
//! - The broadcast group of the configured P_Key is joined without create fields; every
//!   group joined with `create` waits for it and takes its Q_Key, MTU, SL, rate, traffic
//!   class, flow label and hop limit, as kernel ipoib does.
//! - A group the caller marks `shared` (kernel ipoib on the same port is a member too) is
//!   never DELETEd: SA membership is per port, and the DELETE would remove the kernel's.
//! - Every port event flushes the path caches and re-sends every join.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use crate::wire::cm::MAD_LEN;
use crate::wire::ipoib::mcast::broadcast_mgid;
use crate::wire::sa::{
    JoinState, McMemberRecord, McMemberRecordMask, PathRecord, PathRecordMask, SaHeader, SaMad,
    SaMethod, SaStatus, Selected, Selector, ATTR_MCMEMBER_RECORD, ATTR_PATH_RECORD,
};
use crate::wire::{Gid, PathMtu};

#[cfg(test)]
mod tests;

pub mod port;

pub use port::{PortSnapshot, PortWatch, PortWatchConfig, PortWatchCounters};

/// Limits and timers of an [`SaClient`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaConfig {
    /// The port's GID (the SGID of every query and the PortGID of every join).
    pub port_gid: Gid,
    /// The partition, with the full-membership bit as the port holds it (0xFFFF default).
    pub pkey: u16,
    /// How long a resolved path is used before it is asked for again.
    pub path_ttl: Duration,
    /// How long a destination the SA had no path to is not asked for again.
    pub negative_ttl: Duration,
    /// Most cached paths; the one closest to expiry goes first.
    pub max_paths: usize,
    /// Most negative entries.
    pub max_negative: usize,
    /// Most groups joined or wanted at once.
    pub max_groups: usize,
    /// Most requests awaiting an answer.
    pub max_outstanding: usize,
    /// Time between sends of one request.
    pub request_timeout: Duration,
    /// Retransmissions of one request before it fails.
    pub max_retries: u32,
    /// Wait before a failed join is sent again.
    pub rejoin_backoff: Duration,
    /// How often the SA is asked whether it still lists the port in the broadcast group
    /// once joined; `None` (the default) never. A port whose SM can say it lost the
    /// registrations (ClientReregister) needs none; a simulated one does: an answer of no
    /// record raises [`SaEvent::MembershipLost`].
    pub membership_check: Option<Duration>,
}

impl SaConfig {
    /// Linux-like defaults for a port with `port_gid` in partition `pkey`: paths live 60 s
    /// (ipoib's path timeout is per path record lifetime; 60 s is its neighbour GC), a
    /// negative answer 10 s, requests time out after 1 s and are sent 4 times.
    #[must_use]
    pub fn new(port_gid: Gid, pkey: u16) -> Self {
        Self {
            port_gid,
            pkey,
            path_ttl: Duration::from_secs(60),
            negative_ttl: Duration::from_secs(10),
            max_paths: 1024,
            max_negative: 256,
            max_groups: 64,
            max_outstanding: 64,
            request_timeout: Duration::from_secs(1),
            max_retries: 3,
            rejoin_backoff: Duration::from_secs(4),
            membership_check: None,
        }
    }
}

/// Where SA requests go: the SM's LID and SL, as the port reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SmAddress {
    /// The SM's LID (0: no SM known; nothing is sent).
    pub lid: u16,
    /// The SL to reach it.
    pub sl: u8,
}

/// A port event that invalidates what the SA told us (`ibv_event_type` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortEvent {
    /// `IBV_EVENT_LID_CHANGE`.
    LidChange,
    /// `IBV_EVENT_SM_CHANGE`: the SM moved; the new address is given.
    SmChange(SmAddress),
    /// `IBV_EVENT_CLIENT_REREGISTER`: the SM lost its state and asks for every join again.
    ClientReregister,
    /// `IBV_EVENT_PKEY_CHANGE`.
    PkeyChange,
    /// `IBV_EVENT_PORT_ERR`: nothing is sent until the port is up again.
    PortDown,
    /// `IBV_EVENT_PORT_ACTIVE`, with the SM's address.
    PortUp(SmAddress),
}

/// How a group is joined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GroupOptions {
    /// Join with the create fields copied from the broadcast group (every group but the
    /// broadcast group itself); such a join waits until the broadcast group is joined.
    pub create: bool,
    /// Kernel ipoib on this port holds the membership too: a leave forgets the group here
    /// and sends no DELETE.
    pub shared: bool,
    /// Join as a send-only full member instead of a full member.
    pub send_only: bool,
}

/// What the caller needs from a joined group to send and attach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupParams {
    /// The multicast LID to attach the QP with and address sends to.
    pub mlid: u16,
    /// The group's Q_Key (for the broadcast group: the interface's Q_Key).
    pub qkey: u32,
    /// The group's MTU.
    pub mtu: Option<PathMtu>,
    /// Service level.
    pub sl: u8,
    /// Static rate code.
    pub rate: u8,
    /// Traffic class.
    pub tclass: u8,
    /// Flow label.
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
}

impl GroupParams {
    fn of(r: &McMemberRecord) -> Self {
        Self {
            mlid: r.mlid,
            qkey: r.qkey,
            mtu: r.mtu(),
            sl: r.sl,
            rate: r.rate.value,
            tclass: r.tclass,
            flow_label: r.flow_label,
            hop_limit: r.hop_limit,
        }
    }
}

/// What [`SaClient::path`] knows about a destination now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathLookup {
    /// A cached, unexpired path.
    Known(PathRecord),
    /// A query is outstanding; [`SaEvent::PathResolved`] or [`SaEvent::PathFailed`] follows.
    Pending,
    /// The SA had no path lately; not asked again before the negative entry expires.
    Negative,
    /// No query could be started (no SM known, port down, or the outstanding cap).
    Unavailable,
}

/// What the client reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaEvent {
    /// The SA answered a PathRecord query.
    PathResolved {
        /// The destination asked for.
        dgid: Gid,
        /// The record.
        path: PathRecord,
    },
    /// The SA had no path, or did not answer.
    PathFailed {
        /// The destination.
        dgid: Gid,
        /// The SA's status, or `None` after the last retransmission went unanswered.
        status: Option<SaStatus>,
    },
    /// A join was answered.
    Joined {
        /// The group.
        mgid: Gid,
        /// What to send and attach with.
        params: GroupParams,
    },
    /// A join failed; it is tried again after [`SaConfig::rejoin_backoff`].
    JoinFailed {
        /// The group.
        mgid: Gid,
        /// The SA's status, or `None` after a timeout.
        status: Option<SaStatus>,
    },
    /// The SA answered that the port is no member of a group it holds joined: the SM lost
    /// its registrations ([`SaConfig::membership_check`]). The caller takes it for the
    /// port's `CLIENT_REREGISTER` and hands that back as a [`PortEvent`].
    MembershipLost {
        /// The group.
        mgid: Gid,
    },
    /// A group was left: the DELETE was answered or gave up, or (shared) it was forgotten.
    Left {
        /// The group.
        mgid: Gid,
        /// Whether a DELETE went to the SA.
        deleted: bool,
    },
}

/// One MAD for the caller to send to the SM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutMad {
    /// The SM's address at the time of sending.
    pub to: SmAddress,
    /// The MAD.
    pub mad: [u8; MAD_LEN],
}

/// What the client counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct SaCounters {
    /// MADs sent, first sends and retransmissions.
    pub sent: u64,
    /// Retransmissions.
    pub retransmits: u64,
    /// Requests that ran out of retransmissions.
    pub timeouts: u64,
    /// Responses that matched an outstanding request.
    pub answered: u64,
    /// MADs that did not parse, were no response, or matched no request.
    pub unmatched: u64,
    /// Paths evicted to make room (the path cache was full).
    pub path_evictions: u64,
    /// Negative entries evicted to make room.
    pub negative_evictions: u64,
    /// Requests not started because [`SaConfig::max_outstanding`] were outstanding.
    pub outstanding_full: u64,
    /// Joins refused because [`SaConfig::max_groups`] groups were held.
    pub groups_full: u64,
    /// Leaves of shared groups that sent no DELETE.
    pub shared_leaves: u64,
    /// Port events that flushed paths and rejoined.
    pub port_events: u64,
    /// Membership checks sent ([`SaConfig::membership_check`]).
    pub membership_checks: u64,
    /// Checks the SA answered with no record: a membership lost.
    pub memberships_lost: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GroupState {
    /// Waiting for the broadcast group (a `create` join) or for an SM.
    Idle,
    /// A Set is outstanding.
    Joining,
    /// Joined with these parameters.
    Joined(GroupParams),
    /// The last join failed; retry at this time.
    Backoff(Instant),
}

#[derive(Debug, Clone, Copy)]
struct Group {
    opts: GroupOptions,
    state: GroupState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Request {
    Path(Gid),
    Join(Gid),
    Leave(Gid),
    Check(Gid),
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    request: Request,
    mad: [u8; MAD_LEN],
    resend_at: Instant,
    retries_left: u32,
}

/// The SA client of one port; see the [module docs](self).
#[derive(Debug)]
pub struct SaClient {
    cfg: SaConfig,
    sm: SmAddress,
    port_up: bool,
    paths: BTreeMap<Gid, (PathRecord, Instant)>,
    negative: BTreeMap<Gid, Instant>,
    groups: BTreeMap<Gid, Group>,
    pending: BTreeMap<u32, Pending>,
    next_tid: u32,
    out: VecDeque<OutMad>,
    events: VecDeque<SaEvent>,
    counters: SaCounters,
    /// When the next membership check goes out.
    next_check: Option<Instant>,
}

impl SaClient {
    /// A client for a port that is up with its SM at `sm`.
    #[must_use]
    pub fn new(cfg: SaConfig, sm: SmAddress) -> Self {
        Self {
            cfg,
            sm,
            port_up: true,
            paths: BTreeMap::new(),
            negative: BTreeMap::new(),
            groups: BTreeMap::new(),
            pending: BTreeMap::new(),
            next_tid: 1,
            out: VecDeque::new(),
            events: VecDeque::new(),
            counters: SaCounters::default(),
            next_check: None,
        }
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &SaConfig {
        &self.cfg
    }

    /// Sets [`SaConfig::membership_check`]; a check starts a period after the next join of
    /// the broadcast group, or from `now` if it is joined.
    pub fn set_membership_check(&mut self, now: Instant, every: Option<Duration>) {
        self.cfg.membership_check = every;
        let joined = self.group(self.broadcast_mgid()).is_some();
        self.next_check = every.filter(|_| joined).map(|e| now + e);
    }

    /// The counters.
    #[must_use]
    pub fn counters(&self) -> SaCounters {
        self.counters
    }

    /// The broadcast group of the configured partition: its MGID carries the P_Key with the
    /// full-member bit whatever the port's membership (limited and full members share the
    /// partition's groups; the records carry the P_Key as the port holds it).
    #[must_use]
    pub fn broadcast_mgid(&self) -> Gid {
        broadcast_mgid(self.cfg.pkey | 0x8000)
    }

    /// The parameters of a joined group.
    #[must_use]
    pub fn group(&self, mgid: Gid) -> Option<GroupParams> {
        match self.groups.get(&mgid)?.state {
            GroupState::Joined(p) => Some(p),
            _ => None,
        }
    }

    /// The next MAD to send.
    pub fn pop_transmit(&mut self) -> Option<OutMad> {
        self.out.pop_front()
    }

    /// The next event.
    pub fn pop_event(&mut self) -> Option<SaEvent> {
        self.events.pop_front()
    }

    fn can_send(&self) -> bool {
        self.port_up && self.sm.lid != 0
    }

    /// The path to `dgid`: from the cache, or a query is started (at most one per
    /// destination).
    pub fn path(&mut self, now: Instant, dgid: Gid) -> PathLookup {
        if let Some(&(p, until)) = self.paths.get(&dgid) {
            if now < until {
                return PathLookup::Known(p);
            }
            self.paths.remove(&dgid);
        }
        if let Some(&until) = self.negative.get(&dgid) {
            if now < until {
                return PathLookup::Negative;
            }
            self.negative.remove(&dgid);
        }
        if self
            .pending
            .values()
            .any(|p| p.request == Request::Path(dgid))
        {
            return PathLookup::Pending;
        }
        let rec = PathRecord::ipoib_query(self.cfg.port_gid, dgid, self.cfg.pkey);
        let header = |tid| {
            SaHeader::request(
                SaMethod::Get,
                ATTR_PATH_RECORD,
                tid,
                PathRecordMask::IPOIB_QUERY,
            )
        };
        if self.start(now, Request::Path(dgid), header, &rec.to_bytes()) {
            PathLookup::Pending
        } else {
            PathLookup::Unavailable
        }
    }

    /// Joins `mgid` (or changes how it is held). The join goes out now, or once the port
    /// is up, an SM known and (for `create`) the broadcast group joined.
    ///
    /// Returns `false` (and counts) if [`SaConfig::max_groups`] groups are held already.
    pub fn join(&mut self, now: Instant, mgid: Gid, opts: GroupOptions) -> bool {
        if let Some(g) = self.groups.get_mut(&mgid) {
            g.opts = opts;
            return true;
        }
        if self.groups.len() >= self.cfg.max_groups {
            self.counters.groups_full += 1;
            return false;
        }
        self.groups.insert(
            mgid,
            Group {
                opts,
                state: GroupState::Idle,
            },
        );
        self.send_joins(now);
        true
    }

    /// Leaves `mgid`: a DELETE unless the group is `shared`; [`SaEvent::Left`] follows.
    pub fn leave(&mut self, now: Instant, mgid: Gid) {
        let Some(g) = self.groups.remove(&mgid) else {
            return;
        };
        self.pending.retain(|_, p| p.request != Request::Join(mgid));
        let may_be_member = !matches!(g.state, GroupState::Idle | GroupState::Backoff(_));
        if g.opts.shared || !may_be_member {
            if g.opts.shared {
                self.counters.shared_leaves += 1;
            }
            self.events.push_back(SaEvent::Left {
                mgid,
                deleted: false,
            });
            return;
        }
        self.send_delete(now, mgid, g.opts);
    }

    /// DELETEs the port's membership of `mgid` that this client does not hold (one left
    /// by an earlier run): the caller states that no kernel ipoib on the port holds it.
    /// [`SaEvent::Left`] follows.
    pub fn delete_membership(&mut self, now: Instant, mgid: Gid, opts: GroupOptions) {
        self.send_delete(now, mgid, opts);
    }

    fn send_delete(&mut self, now: Instant, mgid: Gid, opts: GroupOptions) {
        let rec = McMemberRecord {
            mgid,
            port_gid: self.cfg.port_gid,
            pkey: self.cfg.pkey,
            join_state: join_state(opts),
            ..McMemberRecord::default()
        };
        let header = |tid| {
            SaHeader::request(
                SaMethod::Delete,
                ATTR_MCMEMBER_RECORD,
                tid,
                McMemberRecordMask::JOIN_EXISTING,
            )
        };
        if !self.start(now, Request::Leave(mgid), header, &rec.to_bytes()) {
            self.events.push_back(SaEvent::Left {
                mgid,
                deleted: false,
            });
        }
    }

    /// A port event: flush the path caches, forget every membership and join again (now,
    /// or once the port is up).
    pub fn port_event(&mut self, now: Instant, ev: PortEvent) {
        self.counters.port_events += 1;
        self.paths.clear();
        self.negative.clear();
        // Outstanding queries and joins are void; leaves stay (the SA may still hold us).
        self.pending
            .retain(|_, p| matches!(p.request, Request::Leave(_)));
        match ev {
            PortEvent::SmChange(sm) => self.sm = sm,
            PortEvent::PortUp(sm) => {
                self.sm = sm;
                self.port_up = true;
            }
            PortEvent::PortDown => {
                self.port_up = false;
                // Leaves cannot go out: each ends here, undeleted.
                for p in std::mem::take(&mut self.pending).into_values() {
                    if let Request::Leave(mgid) = p.request {
                        self.events.push_back(SaEvent::Left {
                            mgid,
                            deleted: false,
                        });
                    }
                }
            }
            PortEvent::LidChange | PortEvent::ClientReregister | PortEvent::PkeyChange => {}
        }
        for g in self.groups.values_mut() {
            g.state = GroupState::Idle;
        }
        self.send_joins(now);
    }

    /// When [`poll_timeout`](Self::poll_timeout) has work next.
    #[must_use]
    pub fn next_deadline(&self) -> Option<Instant> {
        let resend = self.pending.values().map(|p| p.resend_at).min();
        let backoff = self
            .groups
            .values()
            .filter_map(|g| match g.state {
                GroupState::Backoff(t) => Some(t),
                _ => None,
            })
            .min();
        resend
            .into_iter()
            .chain(backoff)
            .chain(self.next_check)
            .min()
    }

    /// Retransmits or fails the requests whose time has come and retries failed joins.
    /// Bounded by the outstanding and group caps.
    pub fn poll_timeout(&mut self, now: Instant) {
        let due: Vec<u32> = self
            .pending
            .iter()
            .filter(|(_, p)| p.resend_at <= now)
            .map(|(&t, _)| t)
            .collect();
        for tid in due {
            let Some(p) = self.pending.get_mut(&tid) else {
                continue;
            };
            if p.retries_left > 0 && self.port_up && self.sm.lid != 0 {
                p.retries_left -= 1;
                p.resend_at = now + self.cfg.request_timeout;
                let mad = p.mad;
                self.counters.retransmits += 1;
                self.transmit(mad);
                continue;
            }
            if let Some(p) = self.pending.remove(&tid) {
                self.counters.timeouts += 1;
                self.fail(now, p.request, None);
            }
        }
        let mut retry = false;
        for g in self.groups.values_mut() {
            if let GroupState::Backoff(t) = g.state {
                if t <= now {
                    g.state = GroupState::Idle;
                    retry = true;
                }
            }
        }
        if retry {
            self.send_joins(now);
        }
        if self.next_check.is_some_and(|t| t <= now) {
            self.check_membership(now);
        }
    }

    /// Asks the SA whether it still lists the port in the broadcast group (a Get of the
    /// port's MCMemberRecord), if joined and no check is outstanding; schedules the next.
    fn check_membership(&mut self, now: Instant) {
        self.next_check = self.cfg.membership_check.map(|every| now + every);
        let mgid = self.broadcast_mgid();
        let outstanding = self
            .pending
            .values()
            .any(|p| matches!(p.request, Request::Check(_)));
        if outstanding || self.group(mgid).is_none() {
            return;
        }
        let rec = McMemberRecord {
            mgid,
            port_gid: self.cfg.port_gid,
            ..McMemberRecord::default()
        };
        let header = |tid| {
            SaHeader::request(
                SaMethod::Get,
                ATTR_MCMEMBER_RECORD,
                tid,
                McMemberRecordMask::MGID | McMemberRecordMask::PORT_GID,
            )
        };
        if self.start(now, Request::Check(mgid), header, &rec.to_bytes()) {
            self.counters.membership_checks += 1;
        }
    }

    /// A MAD that arrived on the SA agent (the umad header already removed).
    pub fn handle_mad(&mut self, now: Instant, buf: &[u8]) {
        let Ok(m) = SaMad::parse(buf) else {
            self.counters.unmatched += 1;
            return;
        };
        let tid = (m.header.mad.transaction_id & 0xFFFF_FFFF) as u32;
        let is_response = m.header.method().is_some_and(SaMethod::is_response);
        let Some(p) = self.pending.get(&tid).filter(|_| is_response) else {
            self.counters.unmatched += 1;
            return;
        };
        let expected_attr = match p.request {
            Request::Path(_) => ATTR_PATH_RECORD,
            Request::Join(_) | Request::Leave(_) | Request::Check(_) => ATTR_MCMEMBER_RECORD,
        };
        if m.header.mad.attr_id != expected_attr {
            self.counters.unmatched += 1;
            return;
        }
        let request = p.request;
        self.pending.remove(&tid);
        self.counters.answered += 1;
        let status = m.header.status();
        if let Request::Check(mgid) = request {
            if status.is_no_records() && self.group(mgid).is_some() {
                self.counters.memberships_lost += 1;
                self.events.push_back(SaEvent::MembershipLost { mgid });
            }
            return;
        }
        if !status.is_ok() {
            self.fail(now, request, Some(status));
            return;
        }
        match request {
            Request::Path(dgid) => {
                let path = m.path_record();
                self.insert_path(now, dgid, path);
                self.events.push_back(SaEvent::PathResolved { dgid, path });
            }
            Request::Join(mgid) => {
                let params = GroupParams::of(&m.mcmember_record());
                if let Some(g) = self.groups.get_mut(&mgid) {
                    g.state = GroupState::Joined(params);
                    self.events.push_back(SaEvent::Joined { mgid, params });
                }
                if mgid == self.broadcast_mgid() {
                    self.next_check = self.cfg.membership_check.map(|every| now + every);
                    self.send_joins(now);
                }
            }
            Request::Leave(mgid) => self.events.push_back(SaEvent::Left {
                mgid,
                deleted: true,
            }),
            Request::Check(_) => {}
        }
    }

    fn fail(&mut self, now: Instant, request: Request, status: Option<SaStatus>) {
        match request {
            Request::Path(dgid) => {
                self.insert_negative(now, dgid);
                self.events.push_back(SaEvent::PathFailed { dgid, status });
            }
            Request::Join(mgid) => {
                if let Some(g) = self.groups.get_mut(&mgid) {
                    g.state = GroupState::Backoff(now + self.cfg.rejoin_backoff);
                    self.events.push_back(SaEvent::JoinFailed { mgid, status });
                }
            }
            Request::Leave(mgid) => self.events.push_back(SaEvent::Left {
                mgid,
                deleted: true,
            }),
            // An unanswered check proves nothing; the next one asks again.
            Request::Check(_) => {}
        }
    }

    fn insert_path(&mut self, now: Instant, dgid: Gid, path: PathRecord) {
        self.negative.remove(&dgid);
        if !self.paths.contains_key(&dgid) && self.paths.len() >= self.cfg.max_paths {
            if let Some(k) = oldest(&self.paths, |v| v.1) {
                self.paths.remove(&k);
                self.counters.path_evictions += 1;
            }
        }
        if self.cfg.max_paths > 0 {
            self.paths.insert(dgid, (path, now + self.cfg.path_ttl));
        }
    }

    fn insert_negative(&mut self, now: Instant, dgid: Gid) {
        if !self.negative.contains_key(&dgid) && self.negative.len() >= self.cfg.max_negative {
            if let Some(k) = oldest(&self.negative, |v| *v) {
                self.negative.remove(&k);
                self.counters.negative_evictions += 1;
            }
        }
        if self.cfg.max_negative > 0 {
            self.negative.insert(dgid, now + self.cfg.negative_ttl);
        }
    }

    /// Sends a join for every idle group that may go now.
    fn send_joins(&mut self, now: Instant) {
        if !self.can_send() {
            return;
        }
        let bcast = self.broadcast_mgid();
        let bcast_params = self.group(bcast);
        let ready: Vec<(Gid, GroupOptions)> = self
            .groups
            .iter()
            .filter(|(_, g)| g.state == GroupState::Idle)
            .filter(|(_, g)| !g.opts.create || bcast_params.is_some())
            .map(|(&m, g)| (m, g.opts))
            .collect();
        for (mgid, opts) in ready {
            let mut rec = McMemberRecord {
                mgid,
                port_gid: self.cfg.port_gid,
                pkey: self.cfg.pkey,
                join_state: join_state(opts),
                ..McMemberRecord::default()
            };
            let mut mask = McMemberRecordMask::JOIN_EXISTING;
            if let (true, Some(b)) = (opts.create, bcast_params) {
                mask = McMemberRecordMask::JOIN_CREATE;
                rec.qkey = b.qkey;
                rec.mtu = Selected::new(Selector::Exactly, b.mtu.map_or(0, PathMtu::to_enum));
                rec.rate = Selected::new(Selector::Exactly, b.rate);
                rec.tclass = b.tclass;
                rec.sl = b.sl;
                rec.flow_label = b.flow_label;
                rec.hop_limit = b.hop_limit;
            }
            let header = |tid| SaHeader::request(SaMethod::Set, ATTR_MCMEMBER_RECORD, tid, mask);
            if self.start(now, Request::Join(mgid), header, &rec.to_bytes()) {
                if let Some(g) = self.groups.get_mut(&mgid) {
                    g.state = GroupState::Joining;
                }
            } else if let Some(g) = self.groups.get_mut(&mgid) {
                g.state = GroupState::Backoff(now + self.cfg.rejoin_backoff);
            }
        }
    }

    /// Sends a new request; `false` (counted when full) if it cannot go now.
    fn start<const N: usize>(
        &mut self,
        now: Instant,
        request: Request,
        header: impl FnOnce(u64) -> SaHeader,
        record: &[u8; N],
    ) -> bool {
        if !self.can_send() {
            return false;
        }
        if self.pending.len() >= self.cfg.max_outstanding {
            self.counters.outstanding_full += 1;
            return false;
        }
        let tid = self.next_tid;
        self.next_tid = self.next_tid.wrapping_add(1).max(1);
        let mad = SaMad::new(header(u64::from(tid)), record).emit();
        self.pending.insert(
            tid,
            Pending {
                request,
                mad,
                resend_at: now + self.cfg.request_timeout,
                retries_left: self.cfg.max_retries,
            },
        );
        self.transmit(mad);
        true
    }

    fn transmit(&mut self, mad: [u8; MAD_LEN]) {
        self.counters.sent += 1;
        self.out.push_back(OutMad { to: self.sm, mad });
    }
}

fn join_state(opts: GroupOptions) -> JoinState {
    if opts.send_only {
        JoinState::SEND_ONLY_FULL_MEMBER
    } else {
        JoinState::FULL_MEMBER
    }
}

/// The key whose `expiry` is earliest.
fn oldest<V>(map: &BTreeMap<Gid, V>, expiry: impl Fn(&V) -> Instant) -> Option<Gid> {
    map.iter().min_by_key(|(_, v)| expiry(v)).map(|(&k, _)| k)
}
