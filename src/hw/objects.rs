//! What the provider keeps of each object it created on the device: plain records in the
//! tables of [`HwVerbs`]. The operations on each kind are in its own module (`pd`, `cq`,
//! `srq`, `qp`, `wr`, `mcast`).

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, UdpSocket};

use crate::verbs::{BufId, CqId, Gid, PdId, QpNum, QpState, QpType, SrqId, WrId};
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

/// A CQ and how many QPs use it.
#[derive(Debug)]
pub(super) struct Cq {
    pub(super) raw: *mut ffi::ibv_cq,
    pub(super) users: usize,
}

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
    /// Internal ids of outstanding send WRs, oldest first.
    pub(super) sends: VecDeque<u64>,
    /// Sends posted on the device so far, and of those, how many completed (in order,
    /// flushes included): a send numbered `n` was processed once `sends_completed >= n`.
    pub(super) sends_posted: u64,
    pub(super) sends_completed: u64,
    pub(super) recvs: usize,
    pub(super) mcast: Vec<Gid>,
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

/// The IPv4 groups joined for attachments, each with its socket and how many attachments use
/// it.
#[derive(Debug, Default)]
pub(super) struct Ipv4Joins(pub(super) HashMap<Ipv4Addr, (UdpSocket, usize)>);
