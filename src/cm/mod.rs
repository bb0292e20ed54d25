//! The InfiniBand Communication Manager state machine (IBTA Vol. 1 chapter 12, as Linux
//! `drivers/infiniband/core/cm.c` implements it), sans-IO.
//!
//! One [`Cm`] serves one local port (one GID). It owns every communication ID of that port,
//! active (we sent the REQ) and passive (we received it), and speaks CM MADs through two
//! queues: MADs from QP1 go in through [`Cm::handle_mad`], MADs for the peers' QP1 come out of
//! [`Cm::poll_transmit`]. The CM never touches a QP: it tells its owner what to do through
//! [`CmEvent`]s, and the owner answers through [`Cm::accept`], [`Cm::reject`], [`Cm::rtu`],
//! [`Cm::notify_comm_est`] and [`Cm::disconnect`].
//!
//! # Calling protocol
//!
//! - Inputs are `handle_*(now, …)` and the owner's calls; every one takes `now` from the
//!   caller. Time must not go backwards between calls.
//! - After any input, drain [`Cm::poll_transmit`] (send each MAD to QP1 of the GID it names),
//!   then [`Cm::poll_event`], then sleep until [`Cm::poll_timeout`] and call
//!   [`Cm::handle_timeout`]. `handle_timeout` is idempotent: a spurious or repeated call does
//!   nothing.
//! - The CM reads no clock and does no I/O.
//!
//! # States
//!
//! [`CmState`] uses the IBTA names (`enum ib_cm_state`). This CM never *sends* an MRA, so
//! [`CmState::MraReqSent`] and [`CmState::MraRepSent`] are never entered; [`CmState::DreqRcvd`]
//! is only passed through (the DREP is sent at once).
//!
//! Active side: `connect` → ReqSent (→ MraReqRcvd on MRA) → REP: RepRcvd, event
//! [`CmEvent::RepReceived`] → `rtu` → Established. Passive side: REQ → ReqRcvd, event
//! [`CmEvent::ReqReceived`] → `accept` → RepSent (→ MraRepRcvd on MRA) → RTU (or
//! `notify_comm_est`) → Established. Either side: `disconnect` → DreqSent → DREP (or DREQ
//! retries exhausted) → TimeWait; a DREQ received → DREP sent → TimeWait. TimeWait lasts
//! [`CmConfig::timewait`] and then frees the id ([`CmEvent::TimeWaitExit`]).
//!
//! # Robustness
//!
//! No MAD can make the CM panic. A MAD that does not parse, names no live id, arrives in a
//! state that has no use for it, or names one of our ids but comes from another GID or with
//! the wrong peer comm id / QPN (spoofed) is dropped and counted in [`CmStats`]; it never
//! changes state. The number of live ids is bounded by [`MAX_LIVE_IDS`] and the transmit
//! queue by [`MAX_TX_QUEUE`]. What a REQ may cost (the per-source rate limit, the clamped REP
//! retries and timeout, so that one REQ draws at most [`MAX_MADS_PER_REQ`] MADs back) is
//! written down in [`admission`].

#![deny(clippy::indexing_slicing, clippy::panic_in_result_fn)]

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use crate::timer::{TimerId, TimerWheel};
use crate::verbs::Gid;
use crate::wire::cm::{RejReason, MAD_LEN};

pub mod admission;
mod conn;
pub mod kernel;
mod recv;
mod route;
mod seam;
mod timers;
mod types;

#[cfg(test)]
mod tests;

use admission::{RemoteIndex, ReqLimiter};
pub use admission::{ReqRateLimit, MAX_MADS_PER_REQ, MAX_PASSIVE_CM_RETRIES};
use conn::{Conn, Retx};
pub use kernel::{KcmCommand, KcmInput, KcmTarget, KernelCm, LinkLayer, QpMoves, PASSIVE_ID_BASE};
pub use route::mad_owner;
pub use seam::ConnectionManager;
use types::own_tid;
pub use types::{
    passive_path, AcceptParams, CmConfig, CmEvent, CmState, CmStats, CmUseError, CommId,
    ConnectParams, MadRoute,
};

/// The most communication ids one [`Cm`] holds at once (all states, TimeWait included). A REQ
/// beyond it is rejected with [`RejReason::NoResources`]; [`Cm::connect`] fails with
/// [`CmUseError::NoResources`]; both count in [`CmStats::ids_exhausted`].
pub const MAX_LIVE_IDS: usize = 32_768;

/// The most MADs waiting in the transmit queue. Beyond it a MAD is dropped (as the network
/// might drop it) and counted in [`CmStats::tx_queue_overflow`].
pub const MAX_TX_QUEUE: usize = 4096;

/// Entries the MAD and event queues (and their owner's scratch buffers for MADs and events)
/// keep allocated once drained. A burst of connection set-ups grows them to the burst's size
/// (a queued MAD is 272 bytes); trimmed back to this when empty, they do not hold a burst's
/// worth of slots for good.
pub const QUEUE_KEEP: usize = 64;

/// The Communication Manager of one port. See the [module docs](self) for the calling
/// protocol.
#[derive(Debug)]
pub struct Cm {
    cfg: CmConfig,
    listeners: Vec<(u64, u64)>,
    conns: BTreeMap<u32, Conn>,
    /// Retransmit and TimeWait timers, keyed by comm id, on the crate's hierarchical timer
    /// wheel; created at the first call that knows the time (the wheel counts ticks from a
    /// start instant).
    wheel: Option<TimerWheel<u32>>,
    /// Scratch for expired timers.
    fired: Vec<(TimerId, u32)>,
    next_id: u32,
    tx: VecDeque<(Gid, [u8; MAD_LEN])>,
    events: VecDeque<CmEvent>,
    stats: CmStats,
    /// Per-source REQ token buckets.
    limiter: ReqLimiter,
    /// Ids by the peer's CA GUID and comm id or QPN (the duplicate and stale REQ checks).
    index: RemoteIndex,
}

impl Cm {
    /// A CM with no listener and no id.
    #[must_use]
    pub fn new(cfg: CmConfig) -> Self {
        Self {
            cfg,
            listeners: Vec::new(),
            conns: BTreeMap::new(),
            wheel: None,
            fired: Vec::new(),
            next_id: 1,
            tx: VecDeque::new(),
            events: VecDeque::new(),
            stats: CmStats::default(),
            limiter: ReqLimiter::default(),
            index: RemoteIndex::default(),
        }
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &CmConfig {
        &self.cfg
    }

    /// Delivers REQs whose `sid & mask == service_id & mask` as [`CmEvent::ReqReceived`].
    /// REQs no listener matches are rejected with [`RejReason::InvalidServiceId`]. Listening
    /// twice on the same pair is a no-op.
    pub fn listen(&mut self, service_id: u64, mask: u64) {
        let l = (service_id & mask, mask);
        if !self.listeners.contains(&l) {
            self.listeners.push(l);
        }
    }

    /// Sends a REQ (state ReqSent) and returns the new active id.
    ///
    /// # Errors
    ///
    /// [`CmUseError::PrivateDataTooLong`] beyond 92 bytes; [`CmUseError::NoResources`] when
    /// [`MAX_LIVE_IDS`] ids are live.
    pub fn connect(&mut self, now: Instant, p: ConnectParams) -> Result<CommId, CmUseError> {
        self.start_clock(now);
        let private_data = pad::<92>(&p.private_data)?;
        let Some(id) = self.alloc_id() else {
            self.stats.ids_exhausted += 1;
            return Err(CmUseError::NoResources);
        };
        let tid = own_tid(id);
        let mut c = Conn::new_active(&self.cfg, tid, &p);
        let mad = c.req_mad(&self.cfg, id, &p, private_data);
        c.retx = Some(Retx {
            mad: Box::new(mad),
            retries_left: c.max_retries,
            interval: c.timeout,
        });
        self.conns.insert(id.0, c);
        self.send(p.peer, mad);
        self.set_deadline(id, Some(now + self.cfg.req_timeout()));
        Ok(id)
    }

    /// Passive side: sends the REP for a REQ delivered as [`CmEvent::ReqReceived`] (state
    /// RepSent). The REP is resent until an RTU (or [`Cm::notify_comm_est`]).
    ///
    /// # Errors
    ///
    /// [`CmUseError::NoSuchId`], [`CmUseError::WrongState`] unless ReqRcvd,
    /// [`CmUseError::PrivateDataTooLong`] beyond 196 bytes.
    pub fn accept(&mut self, now: Instant, id: CommId, p: AcceptParams) -> Result<(), CmUseError> {
        self.start_clock(now);
        let c = self.conns.get_mut(&id.0).ok_or(CmUseError::NoSuchId)?;
        if !matches!(c.state, CmState::ReqRcvd | CmState::MraReqSent) {
            return Err(CmUseError::WrongState(c.state));
        }
        let private_data = pad::<196>(&p.private_data)?;
        c.local_qpn = p.local_qpn;
        let mad = c.rep_mad(&self.cfg, id, &p, private_data);
        c.reply = Some(Box::new(mad));
        c.retx = Some(Retx {
            mad: Box::new(mad),
            retries_left: c.max_retries,
            interval: c.timeout,
        });
        c.state = CmState::RepSent;
        let (peer, timeout) = (c.peer, c.timeout);
        self.send(peer, mad);
        self.set_deadline(id, Some(now + timeout));
        Ok(())
    }

    /// Sends a REJ with `reason`. Allowed while the connection is being set up: from ReqRcvd
    /// (refusing a REQ), RepRcvd (refusing a REP), ReqSent/MraReqRcvd (abandoning our REQ):
    /// the id is freed at once. From RepSent/MraRepRcvd the id enters TimeWait (our QPN was
    /// announced). No event follows either way, apart from a later TimeWaitExit.
    ///
    /// # Errors
    ///
    /// [`CmUseError::NoSuchId`]; [`CmUseError::WrongState`] from Established and later.
    pub fn reject(
        &mut self,
        now: Instant,
        id: CommId,
        reason: RejReason,
    ) -> Result<(), CmUseError> {
        self.reject_with_ari(now, id, reason, &[])
    }

    /// Refuses a REQ whose path MTU is above `acceptable` with a REJ
    /// [`RejReason::InvalidMtu`] whose ARI names `acceptable` ([`Rej::invalid_mtu_ari`]), so
    /// that the requester can try again at it; as [`Cm::reject`] otherwise.
    ///
    /// # Errors
    ///
    /// As [`Cm::reject`].
    ///
    /// [`Rej::invalid_mtu_ari`]: crate::wire::cm::Rej::invalid_mtu_ari
    pub fn reject_mtu(
        &mut self,
        now: Instant,
        id: CommId,
        acceptable: crate::verbs::PathMtu,
    ) -> Result<(), CmUseError> {
        let ari = crate::wire::cm::Rej::invalid_mtu_ari(acceptable);
        self.reject_with_ari(now, id, RejReason::InvalidMtu, &ari)
    }

    fn reject_with_ari(
        &mut self,
        now: Instant,
        id: CommId,
        reason: RejReason,
        ari: &[u8],
    ) -> Result<(), CmUseError> {
        self.start_clock(now);
        let c = self.conns.get(&id.0).ok_or(CmUseError::NoSuchId)?;
        match c.state {
            CmState::ReqSent
            | CmState::MraReqRcvd
            | CmState::ReqRcvd
            | CmState::MraReqSent
            | CmState::RepRcvd
            | CmState::MraRepSent
            | CmState::RepSent
            | CmState::MraRepRcvd => {
                self.send_rej_locked(now, id, reason, ari);
                Ok(())
            }
            s => Err(CmUseError::WrongState(s)),
        }
    }

    /// Active side: sends the RTU after [`CmEvent::RepReceived`]; the id is Established and an
    /// [`CmEvent::Established`] event follows.
    ///
    /// # Errors
    ///
    /// [`CmUseError::NoSuchId`], [`CmUseError::WrongState`] unless RepRcvd.
    pub fn rtu(&mut self, _now: Instant, id: CommId) -> Result<(), CmUseError> {
        let c = self.conns.get_mut(&id.0).ok_or(CmUseError::NoSuchId)?;
        if !matches!(c.state, CmState::RepRcvd | CmState::MraRepSent) {
            return Err(CmUseError::WrongState(c.state));
        }
        let mad = c.rtu_mad(id);
        c.reply = Some(Box::new(mad));
        c.state = CmState::Established;
        let peer = c.peer;
        self.send(peer, mad);
        self.events.push_back(CmEvent::Established { id });
        Ok(())
    }

    /// Passive side: the QP received data before the RTU arrived (the RTU was lost;
    /// `IB_EVENT_COMM_EST`). From RepSent/MraRepRcvd the id becomes Established (an
    /// [`CmEvent::Established`] event follows) and the REP is no longer resent; in any other
    /// state, or for an unknown id, nothing happens.
    pub fn notify_comm_est(&mut self, _now: Instant, id: CommId) {
        let Some(c) = self.conns.get_mut(&id.0) else {
            return;
        };
        if matches!(c.state, CmState::RepSent | CmState::MraRepRcvd) {
            c.state = CmState::Established;
            c.retx = None;
            c.reply = None;
            self.set_deadline(id, None);
            self.events.push_back(CmEvent::Established { id });
        }
    }

    /// Ends a connection. From Established: sends a DREQ (state DreqSent; resent until a DREP,
    /// then [`CmEvent::Disconnected`]). Before Established, as Linux `cm_destroy_id` does:
    /// from ReqSent/MraReqRcvd sends REJ (Timeout, ARI = our CA GUID); from ReqRcvd, RepRcvd,
    /// RepSent, MraRepRcvd sends REJ (ConsumerDefined); see [`Cm::reject`] for where the id
    /// goes. From DreqSent or TimeWait: nothing to do.
    ///
    /// # Errors
    ///
    /// [`CmUseError::NoSuchId`].
    pub fn disconnect(&mut self, now: Instant, id: CommId) -> Result<(), CmUseError> {
        self.start_clock(now);
        let c = self.conns.get_mut(&id.0).ok_or(CmUseError::NoSuchId)?;
        match c.state {
            CmState::Established => {
                let mad = c.dreq_mad(id);
                c.retx = Some(Retx {
                    mad: Box::new(mad),
                    retries_left: c.max_retries,
                    interval: c.timeout,
                });
                c.state = CmState::DreqSent;
                // A duplicate REP gets no RTU from DreqSent on.
                c.reply = None;
                let (peer, timeout) = (c.peer, c.timeout);
                self.send(peer, mad);
                self.set_deadline(id, Some(now + timeout));
            }
            CmState::ReqSent | CmState::MraReqRcvd => {
                let guid = self.cfg.local_ca_guid.to_be_bytes();
                self.send_rej_locked(now, id, RejReason::Timeout, &guid);
            }
            CmState::ReqRcvd
            | CmState::MraReqSent
            | CmState::RepRcvd
            | CmState::MraRepSent
            | CmState::RepSent
            | CmState::MraRepRcvd => {
                self.send_rej_locked(now, id, RejReason::ConsumerDefined, &[]);
            }
            CmState::Idle | CmState::DreqSent | CmState::DreqRcvd | CmState::TimeWait => {}
        }
        Ok(())
    }

    /// True while MADs wait in [`Cm::poll_transmit`].
    #[must_use]
    pub fn has_transmit(&self) -> bool {
        !self.tx.is_empty()
    }

    /// The next MAD to send, and the GID whose QP1 it goes to.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<(Gid, [u8; MAD_LEN])> {
        let mad = self.tx.pop_front();
        trim_drained(&mut self.tx);
        mad
    }

    /// The next event for the owner.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        let event = self.events.pop_front();
        trim_drained(&mut self.events);
        event
    }

    /// The state of a live id; `None` once it is freed.
    #[must_use]
    pub fn state(&self, id: CommId) -> Option<CmState> {
        self.conns.get(&id.0).map(|c| c.state)
    }

    /// The counters.
    #[must_use]
    pub fn stats(&self) -> CmStats {
        self.stats
    }

    /// Live ids (TimeWait included).
    #[must_use]
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// True when no id is live.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    // -------------------------------------------------------------------------------------
    // Internals shared with `recv` and `timers`.

    /// A free local comm id, or `None` at [`MAX_LIVE_IDS`].
    fn alloc_id(&mut self) -> Option<CommId> {
        if self.conns.len() >= MAX_LIVE_IDS {
            return None;
        }
        // At most MAX_LIVE_IDS values are taken, and 0 is skipped: this finds one in at most
        // MAX_LIVE_IDS + 2 tries.
        for _ in 0..MAX_LIVE_IDS + 2 {
            let raw = self
                .cfg
                .comm_id_slot
                .tag(self.next_id ^ self.cfg.comm_id_seed);
            self.next_id = self.next_id.wrapping_add(1);
            if raw != 0 && !self.conns.contains_key(&raw) {
                return Some(CommId(raw));
            }
        }
        None
    }

    /// Queues a MAD for `to`.
    fn send(&mut self, to: Gid, mad: [u8; MAD_LEN]) {
        if self.tx.len() >= MAX_TX_QUEUE {
            self.stats.tx_queue_overflow += 1;
            return;
        }
        self.stats.mads_sent += 1;
        self.tx.push_back((to, mad));
    }

    /// Frees `id`.
    fn free(&mut self, id: CommId) {
        self.set_deadline(id, None);
        if let Some(c) = self.conns.remove(&id.0) {
            let comm_id = (!c.active).then_some(c.remote_comm_id).flatten();
            self.index
                .remove(id.0, c.remote_ca_guid, comm_id, c.remote_qpn);
        }
    }

    /// Sends a REJ for `id` and moves it as Linux `cm_send_rej_locked` does: to TimeWait from
    /// RepSent/MraRepRcvd, else frees it.
    fn send_rej_locked(&mut self, now: Instant, id: CommId, reason: RejReason, ari: &[u8]) {
        let Some(c) = self.conns.get(&id.0) else {
            return;
        };
        let mad = c.rej_mad(id, reason, ari);
        let (peer, state) = (c.peer, c.state);
        self.stats.rej_sent += 1;
        self.send(peer, mad);
        if matches!(state, CmState::RepSent | CmState::MraRepRcvd) {
            self.enter_timewait(now, id);
        } else {
            self.free(id);
        }
    }
}

/// Gives back a drained queue's memory beyond [`QUEUE_KEEP`] entries.
fn trim_drained<T>(q: &mut VecDeque<T>) {
    if q.is_empty() && q.capacity() > QUEUE_KEEP {
        q.shrink_to(QUEUE_KEEP);
    }
}

/// `data` zero-padded to `N` bytes.
fn pad<const N: usize>(data: &[u8]) -> Result<[u8; N], CmUseError> {
    let mut out = [0u8; N];
    out.get_mut(..data.len())
        .ok_or(CmUseError::PrivateDataTooLong)?
        .copy_from_slice(data);
    Ok(out)
}
