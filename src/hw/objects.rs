//! What the provider keeps of each object it created on the device: plain records in the
//! tables of [`HwVerbs`]. The operations on each kind are in its own module (`pd`, `cq`,
//! `srq`, `qp`, `wr`, `mcast`).

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, UdpSocket};

use crate::verbs::{BufId, Completion, CqId, Gid, PdId, QpNum, QpState, QpType, SrqId, WrId};
use ibverbs_sys as ffi;

#[cfg(doc)]
use super::context::HwVerbs;

/// An address handle and the PD it belongs to (and keeps busy).
#[derive(Debug, Clone, Copy)]
pub(super) struct Ah {
    pub(super) raw: *mut ffi::ibv_ah,
    pub(super) pd: PdId,
}

/// A PD and how many objects (QPs, SRQs, AHs) use it.
#[derive(Debug)]
pub(super) struct Pd {
    pub(super) raw: *mut ffi::ibv_pd,
    pub(super) users: usize,
}

/// A CQ, how many QPs use it, and the completion events read for it and not acked yet.
#[derive(Debug)]
pub(super) struct Cq {
    pub(super) raw: *mut ffi::ibv_cq,
    pub(super) users: usize,
    /// Acked in one `ibv_ack_cq_events` call once [`CQ_EVENT_ACK_BATCH`] of them were read,
    /// and before the CQ is destroyed (which waits for every event to be acked).
    pub(super) unacked_events: u32,
    /// Completions made by this wrapper and not handed out yet, oldest first: of the sends
    /// that a later signaled send's completion showed done, and of sends the device
    /// refused, and the device's completions swept before a QP's destroy ([`super::cq::sweep`]).
    /// Bounded by the send queues of the CQ's QPs and the CQ's depth.
    pub(super) backlog: VecDeque<Completion>,
}

/// Completion events read for one CQ before they are acked with one call (an ack takes a lock
/// in libibverbs; `ipoib_cm` and rdma-core's examples batch it the same way).
pub(super) const CQ_EVENT_ACK_BATCH: u32 = 64;

/// An SRQ: its PD, its depth, how many QPs use it and how many receives are posted.
#[derive(Debug)]
pub(super) struct Srq {
    pub(super) raw: *mut ffi::ibv_srq,
    pub(super) pd: PdId,
    pub(super) max_wr: u32,
    pub(super) users: usize,
    pub(super) posted: usize,
}

/// A QP and what this wrapper tracks of it.
#[derive(Debug)]
pub(super) struct Qp {
    pub(super) raw: *mut ffi::ibv_qp,
    pub(super) qp_type: QpType,
    pub(super) state: QpState,
    pub(super) pd: PdId,
    pub(super) send_cq: CqId,
    pub(super) recv_cq: CqId,
    pub(super) srq: Option<SrqId>,
    pub(super) max_send_wr: u32,
    pub(super) max_recv_wr: u32,
    pub(super) sq_sig_all: bool,
    /// The largest payload a send may carry inline (what the device granted at creation).
    pub(super) max_inline: u32,
    /// Sends posted since the last doorbell, in order; at most `wr::MAX_CHAIN`.
    pub(super) pending: Vec<PendingSend>,
    /// Internal ids of outstanding send WRs, oldest first.
    pub(super) sends: VecDeque<u64>,
    /// Sends posted on the device so far, and of those, how many completed (in order,
    /// flushes included): a send numbered `n` was processed once `sends_completed >= n`.
    pub(super) sends_posted: u64,
    pub(super) sends_completed: u64,
    pub(super) recvs: usize,
    pub(super) mcast: Vec<Gid>,
    /// Moves of this QP on the command thread, not answered yet (`qp::begin_moves`).
    pub(super) moving: Option<Moving>,
}

/// Moves of a QP handed to the command thread: the job's token and the state after each.
#[derive(Debug)]
pub(super) struct Moving {
    pub(super) token: u64,
    pub(super) states: Vec<QpState>,
}

/// A send posted by the caller and not yet given to the device: what its `ibv_send_wr` is
/// built from when its chain is.
#[derive(Debug, Clone, Copy)]
pub(super) struct PendingSend {
    /// The internal `wr_id`.
    pub(super) id: u64,
    pub(super) sge: Option<ffi::ibv_sge>,
    pub(super) imm: Option<u32>,
    pub(super) solicited: bool,
    pub(super) inline: bool,
    /// UD: the AH, the remote QPN and Q_Key.
    pub(super) ud: Option<(*mut ffi::ibv_ah, u32, u32)>,
}

/// Who an outstanding WR belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Owner {
    Qp(QpNum),
    Srq(SrqId),
}

/// An outstanding WR: its owner, the caller's id and buffer, and how it completes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Wr {
    pub(super) owner: Owner,
    pub(super) user: WrId,
    pub(super) buf: Option<BufId>,
    pub(super) send: bool,
    pub(super) signaled: bool,
}

/// The outstanding WRs by the `wr_id` the device carries: a slot table, so that posting and
/// completing a WR costs an index and no hashing. A `wr_id` is the slot's index (low 32 bits)
/// and its generation (high 32 bits), bumped at each reuse: a completion that names a slot
/// freed since (its WR released by a destroy or a RESET) finds nothing.
#[derive(Debug, Default)]
pub(super) struct WrTable {
    slots: Vec<(u32, Option<Wr>)>,
    free: Vec<u32>,
}

impl WrTable {
    /// Stores `wr`; its `wr_id`.
    pub(super) fn insert(&mut self, wr: Wr) -> u64 {
        if let Some(i) = self.free.pop() {
            if let Some((gen, slot)) = self.slots.get_mut(i as usize) {
                *gen = gen.wrapping_add(1);
                *slot = Some(wr);
                return u64::from(*gen) << 32 | u64::from(i);
            }
        }
        let i = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
        self.slots.push((0, Some(wr)));
        u64::from(i)
    }

    /// Takes the WR of `id` out; `None` if the id names no outstanding WR.
    pub(super) fn remove(&mut self, id: &u64) -> Option<Wr> {
        let (index, gen) = ((*id & 0xffff_ffff) as u32, (*id >> 32) as u32);
        let (g, slot) = self.slots.get_mut(index as usize)?;
        if *g != gen {
            return None;
        }
        let wr = slot.take()?;
        self.free.push(index);
        Some(wr)
    }

    /// The outstanding WRs with their ids.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, &Wr)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, (gen, slot))| {
                slot.as_ref().map(|w| (u64::from(*gen) << 32 | i as u64, w))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wr(user: u64) -> Wr {
        Wr {
            owner: Owner::Srq(SrqId(1)),
            user: WrId(user),
            buf: None,
            send: false,
            signaled: true,
        }
    }

    #[test]
    fn a_wr_id_finds_its_wr_once_and_a_reused_slot_not_its_old_id() {
        let mut t = WrTable::default();
        let a = t.insert(wr(1));
        let b = t.insert(wr(2));
        assert_eq!(t.iter().count(), 2);
        assert_eq!(t.remove(&a).map(|w| w.user), Some(WrId(1)));
        assert!(t.remove(&a).is_none());
        let c = t.insert(wr(3));
        assert_eq!(c & 0xffff_ffff, a & 0xffff_ffff, "the freed slot is reused");
        assert!(t.remove(&a).is_none(), "a stale id misses the reused slot");
        let ids: Vec<u64> = t.iter().map(|(i, _)| i).collect();
        assert_eq!(ids, vec![c, b]);
        assert_eq!(t.remove(&c).map(|w| w.user), Some(WrId(3)));
        assert_eq!(t.remove(&b).map(|w| w.user), Some(WrId(2)));
        assert_eq!(t.iter().count(), 0);
        assert!(t.remove(&u64::MAX).is_none());
    }
}

/// The IPv4 groups joined for attachments, each with its socket and how many attachments use
/// it.
#[derive(Debug, Default)]
pub(super) struct Ipv4Joins(pub(super) HashMap<Ipv4Addr, (UdpSocket, usize)>);
