//! The provider seam: what IPoIB-CM needs from an RDMA device, modelled on libibverbs.
//!
//! Two providers implement [`Verbs`]: the embedded software RoCEv2 provider
//! ([`crate::soft::SoftVerbs`]) and, behind a feature, libibverbs hardware. Everything above
//! this trait (the CM, the IPoIB-CM connection tables, the reaper) is identical on both, so
//! the contract below is what that logic may rely on, and what the conformance suite checks.
//!
//! # Contract
//!
//! **Objects.** One provider instance is one device context on one port. Protection domains,
//! completion queues, shared receive queues, queue pairs and buffer pools are created and
//! destroyed through it and named by small copyable handles. Destroying a CQ, SRQ or PD that
//! still has QPs (or, for a PD, any object) fails with [`VerbsError::Busy`].
//!
//! **Buffers.** Memory lives in registered pools ([`BufPools`]). A work request names a
//! [`BufId`]; posting lends the buffer to the provider, and the completion that ends the WR
//! returns it (its `buf` field). Destroying a QP frees the buffers of WRs still posted on it
//! (no completions are generated for them). Completions already queued for a QP survive its
//! destroy and are polled as any other: their buffers, receives taken from an SRQ among them,
//! come back to the caller (the hardware provider sweeps a QP's CQs before `ibv_destroy_qp`,
//! since mlx5's rdma-core cleans them from the CQ and hands their SRQ WQEs back to the SRQ,
//! where the caller would never see them again). No safe call can observe a posted buffer.
//!
//! **QP states.** [`Verbs::modify_qp`] follows the IBTA state machine checked by
//! [`check_modify`]: illegal transitions and missing or extra attributes are rejected before
//! anything changes. `post_recv` is legal from INIT on, `post_send` from RTS on (and in SQD and
//! ERR); earlier states fail with [`VerbsError::InvalidState`]. [`Verbs::begin_moves`] makes
//! a series of such moves, possibly elsewhere (the hardware provider's command thread): its
//! result then comes from [`Verbs::poll_moved`], and every later verb on the QP behaves as
//! though the moves were made.
//!
//! **Completion order.** Completions of one work queue are delivered in the order the WRs were
//! posted, errors included. Every receive WR produces a completion (success or error); a
//! signaled send WR produces one; an unsignaled send WR produces one only if it fails.
//!
//! **Errors and flush.** A transport error (retries exhausted, remote NAK, local length error)
//! completes the failing WR with its real status and moves the QP to ERR. In ERR, every
//! outstanding WR, and every WR posted afterwards, sends and receives alike, completes with
//! [`WcStatus::WrFlushErr`], signaled or not. This is what makes the *drain WR* of IPoIB-CM
//! work: a send posted to a QP in ERR comes back as a flush completion after everything
//! posted before it.
//!
//! **Last WQE Reached.** A QP attached to an SRQ raises [`AsyncEvent::QpLastWqeReached`]
//! exactly once when it enters ERR and will consume no further SRQ WQEs (IBTA o11-5.2.5). WQEs
//! still on the SRQ belong to the SRQ and are not flushed. A receive the QP had already taken
//! from the SRQ and was filling completes with `WrFlushErr`.
//!
//! **Events.** Asynchronous events are queued and read with [`Verbs::poll_async_event`].
//! `CommEst` is raised when the first request arrives on an RC QP in RTR.
//!
//! **Fatal events.** After [`AsyncEvent::DeviceFatal`] every verb that can fail fails
//! ([`VerbsError::DeviceLost`] from the software provider, an I/O error from libibverbs),
//! no completion comes any more, and the objects are dead: the driver reopens the device
//! ([`Provider::reopen`]) and builds everything again.
//!
//! Providers may be configured with *quirks* that break this contract on purpose (a drain WR
//! that never completes, a missing or duplicated Last WQE event), so the layers above can be
//! tested against real-world provider bugs.

pub mod av;
pub mod completion;
#[doc(hidden)]
pub mod conformance;
pub mod error;
pub mod pool;
pub mod setup;
pub mod transition;
pub mod types;

use std::io;
use std::os::fd::RawFd;
use std::time::Instant;

pub use av::{AddressVector, Grh, Lid, Path, Rate, Sl};
pub use completion::{AsyncEvent, Completion, WcOpcode, WcStatus};
pub use error::{ReopenError, VerbsError};
pub use pool::BufPools;
pub use transition::{check_modify, AccessFlags, QpAttr};
pub use types::{
    BufId, CqId, Gid, PKey, PathMtu, PdId, PoolId, Psn, QKey, QpNum, QpState, QpType, SrqId, WrId,
};

/// Port attributes (`ibv_query_port` + the GID table entry in use).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAttr {
    /// The port's RoCEv2 GID (its IP address).
    pub gid: Gid,
    /// Active MTU: the largest path MTU usable on this port.
    pub active_mtu: PathMtu,
    /// Largest MTU the port supports.
    pub max_mtu: PathMtu,
    /// Largest message an RC QP may send or receive, in bytes.
    pub max_msg_size: usize,
    /// The port is up.
    pub active: bool,
    /// An InfiniBand port's LIDs and its SM's, where the provider reports them (the software
    /// provider's IB port); `None` on RoCE, and where they are read from sysfs instead
    /// (libibverbs here).
    pub lids: Option<PortLids>,
}

/// An InfiniBand port's LIDs and its SM's (`ibv_port_attr`'s `lid`, `lmc`, `sm_lid`,
/// `sm_sl`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortLids {
    /// Base LID.
    pub lid: Lid,
    /// LID mask control.
    pub lmc: u8,
    /// The SM's LID.
    pub sm_lid: Lid,
    /// The SL to the SM.
    pub sm_sl: Sl,
}

/// Parameters of a new QP (`ibv_qp_init_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInit {
    /// Protection domain.
    pub pd: PdId,
    /// Transport.
    pub qp_type: QpType,
    /// CQ for send completions.
    pub send_cq: CqId,
    /// CQ for receive completions.
    pub recv_cq: CqId,
    /// Take receives from this SRQ instead of a private receive queue.
    pub srq: Option<SrqId>,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth (ignored with an SRQ).
    pub max_recv_wr: u32,
    /// Every send WR is signaled, whatever its flag (`sq_sig_all`).
    pub sq_sig_all: bool,
}

/// Where a UD send goes (`wr.ud`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    /// The address handle's contents.
    pub av: AddressVector,
    /// Destination QPN.
    pub remote_qpn: QpNum,
    /// Destination Q_Key.
    pub remote_qkey: QKey,
}

/// A send work request (`ibv_send_wr`, SEND and SEND_WITH_IMM).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: WrId,
    /// Payload buffer; `None` for a zero-length send (such as a drain WR).
    pub buf: Option<BufId>,
    /// Payload bytes, from the start of `buf`.
    pub len: usize,
    /// Immediate data (`IBV_WR_SEND_WITH_IMM`).
    pub imm: Option<u32>,
    /// Generate a completion on success (`IBV_SEND_SIGNALED`).
    pub signaled: bool,
    /// Solicited event bit.
    pub solicited: bool,
    /// Destination, for UD and GSI QPs only.
    pub ud: Option<UdDest>,
}

impl SendWr {
    /// A signaled SEND of `len` bytes from `buf`.
    pub fn send(wr_id: WrId, buf: BufId, len: usize) -> Self {
        Self {
            wr_id,
            buf: Some(buf),
            len,
            imm: None,
            signaled: true,
            solicited: false,
            ud: None,
        }
    }

    /// A signaled zero-length SEND, as IPoIB-CM's drain WR.
    pub fn empty(wr_id: WrId) -> Self {
        Self {
            wr_id,
            buf: None,
            len: 0,
            imm: None,
            signaled: true,
            solicited: false,
            ud: None,
        }
    }
}

/// Parameters of a new SRQ (`ibv_srq_init_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqInit {
    /// Protection domain.
    pub pd: PdId,
    /// Maximum outstanding WRs.
    pub max_wr: u32,
    /// Arm the limit event at this WQE count (0 = not armed).
    pub limit: u32,
}

/// What became of [`Verbs::begin_moves`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Moves {
    /// Every move was done before the call returned.
    Done,
    /// The moves go on elsewhere: their result comes from [`Verbs::poll_moved`].
    Started,
}

/// The result of moves that [`Verbs::begin_moves`] started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    /// The QP moved.
    pub qp: QpNum,
    /// `Ok` when every move was done; else the first failure (the QP stays where it found it).
    pub result: Result<(), VerbsError>,
}

/// Device verbs. See the [module documentation](self) for the contract.
pub trait Verbs {
    /// Port attributes.
    fn port_attr(&self) -> PortAttr;

    /// The index of `pkey`'s partition in the port's P_Key table, for a QP's `pkey_index`:
    /// the first entry of the same partition ([`PKey::same_partition`]) that is a full member,
    /// else the first limited one (`ib_find_pkey`).
    ///
    /// # Errors
    /// [`VerbsError::NoSuchPKey`] when the table has no entry of that partition;
    /// [`VerbsError::Io`] when the table cannot be read.
    fn pkey_index(&self, pkey: PKey) -> Result<u16, VerbsError>;

    /// Allocates a protection domain.
    ///
    /// # Errors
    /// [`VerbsError::OutOfResources`].
    fn alloc_pd(&mut self) -> Result<PdId, VerbsError>;

    /// Frees a protection domain that owns no objects.
    ///
    /// # Errors
    /// [`VerbsError::Busy`] while objects use it.
    fn dealloc_pd(&mut self, pd: PdId) -> Result<(), VerbsError>;

    /// Creates and registers a pool of `count` buffers of `buf_len` bytes.
    ///
    /// # Errors
    /// [`VerbsError::OutOfResources`] or [`VerbsError::NoSuchObject`].
    fn create_pool(&mut self, pd: PdId, buf_len: usize, count: usize)
        -> Result<PoolId, VerbsError>;

    /// The buffer pools (read access for held buffers).
    fn pools(&self) -> &BufPools;

    /// The buffer pools (alloc, free, write held buffers).
    fn pools_mut(&mut self) -> &mut BufPools;

    /// Creates a completion queue with room for `depth` entries.
    ///
    /// # Errors
    /// [`VerbsError::OutOfResources`].
    fn create_cq(&mut self, depth: u32) -> Result<CqId, VerbsError>;

    /// Destroys a CQ no QP uses.
    ///
    /// # Errors
    /// [`VerbsError::Busy`] or [`VerbsError::NoSuchObject`].
    fn destroy_cq(&mut self, cq: CqId) -> Result<(), VerbsError>;

    /// Moves up to `max` completions from `cq` to `out`, oldest first; returns how many.
    fn poll_cq(&mut self, cq: CqId, out: &mut Vec<Completion>, max: usize) -> usize;

    /// Creates a shared receive queue.
    ///
    /// # Errors
    /// [`VerbsError::OutOfResources`] or [`VerbsError::NoSuchObject`].
    fn create_srq(&mut self, init: &SrqInit) -> Result<SrqId, VerbsError>;

    /// Arms (or with 0, disarms) the SRQ limit event.
    ///
    /// # Errors
    /// [`VerbsError::NoSuchObject`].
    fn modify_srq(&mut self, srq: SrqId, limit: u32) -> Result<(), VerbsError>;

    /// Posts a receive WR to an SRQ.
    ///
    /// # Errors
    /// [`VerbsError::QueueFull`], [`VerbsError::BufferNotHeld`] or [`VerbsError::NoSuchObject`].
    fn post_srq_recv(&mut self, srq: SrqId, wr_id: WrId, buf: BufId) -> Result<(), VerbsError>;

    /// Posts receive WRs to an SRQ as one chain (one `ibv_post_srq_recv`, one doorbell, on
    /// providers that chain), in order; returns how many were posted: all of them, or those
    /// before the first the SRQ refused (full, or a buffer not held), which and whose
    /// successors stay with the caller. The default posts them one by one.
    ///
    /// # Errors
    /// [`VerbsError::NoSuchObject`].
    fn post_srq_recvs(&mut self, srq: SrqId, wrs: &[(WrId, BufId)]) -> Result<usize, VerbsError> {
        for (i, &(wr_id, buf)) in wrs.iter().enumerate() {
            match self.post_srq_recv(srq, wr_id, buf) {
                Ok(()) => {}
                Err(e @ VerbsError::NoSuchObject(_)) if i == 0 => return Err(e),
                Err(_) => return Ok(i),
            }
        }
        Ok(wrs.len())
    }

    /// How many receive WRs `srq` holds: posted and not yet completed (a provider may leave
    /// out one that a QP has taken and is still filling).
    ///
    /// # Errors
    /// [`VerbsError::NoSuchObject`].
    fn srq_posted(&self, srq: SrqId) -> Result<usize, VerbsError>;

    /// Destroys an SRQ no QP uses; its posted buffers are freed.
    ///
    /// # Errors
    /// [`VerbsError::Busy`] or [`VerbsError::NoSuchObject`].
    fn destroy_srq(&mut self, srq: SrqId) -> Result<(), VerbsError>;

    /// Creates a QP in RESET. A [`QpType::Gsi`] QP always gets QPN 1, and there is at most one.
    ///
    /// # Errors
    /// [`VerbsError::OutOfResources`] or [`VerbsError::NoSuchObject`].
    fn create_qp(&mut self, init: &QpInit) -> Result<QpNum, VerbsError>;

    /// Modifies a QP (see [`check_modify`]).
    ///
    /// # Errors
    /// The [`check_modify`] errors, or [`VerbsError::NoSuchQp`].
    fn modify_qp(&mut self, qp: QpNum, attr: &QpAttr) -> Result<(), VerbsError>;

    /// The QP's current state (`ibv_query_qp` of `qp_state`).
    ///
    /// # Errors
    /// [`VerbsError::NoSuchQp`].
    fn query_qp_state(&self, qp: QpNum) -> Result<QpState, VerbsError>;

    /// Posts a send WR.
    ///
    /// # Errors
    /// [`VerbsError::InvalidState`] before RTS, [`VerbsError::QueueFull`],
    /// [`VerbsError::BufferNotHeld`], [`VerbsError::TooLong`], [`VerbsError::InvalidWr`].
    fn post_send(&mut self, qp: QpNum, wr: &SendWr) -> Result<(), VerbsError>;

    /// Posts a receive WR to a QP's own receive queue.
    ///
    /// # Errors
    /// [`VerbsError::InvalidState`] in RESET, [`VerbsError::UsesSrq`],
    /// [`VerbsError::QueueFull`], [`VerbsError::BufferNotHeld`].
    fn post_recv(&mut self, qp: QpNum, wr_id: WrId, buf: BufId) -> Result<(), VerbsError>;

    /// Destroys a QP; buffers of WRs still posted on it are freed without completions.
    ///
    /// # Errors
    /// [`VerbsError::NoSuchQp`].
    fn destroy_qp(&mut self, qp: QpNum) -> Result<(), VerbsError>;

    /// Destroys a drained QP: the caller has seen the completion of every WR it posted on it
    /// (its sends, its own receives, and for a QP on an SRQ every receive it took: the drain
    /// WR after Last WQE Reached came back). Nothing of it reaches the caller again; its
    /// number is gone for the caller at once, but a provider may do the destroy later and on
    /// another thread (the hardware provider does: `ibv_destroy_qp` is a firmware command).
    /// By default, [`Verbs::destroy_qp`].
    ///
    /// # Errors
    /// [`VerbsError::NoSuchQp`].
    fn retire_qp(&mut self, qp: QpNum) -> Result<(), VerbsError> {
        self.destroy_qp(qp)
    }

    /// Starts moving `qp` through `attrs`, in order (as [`Verbs::modify_qp`] each, stopping
    /// at the first that fails): [`Moves::Done`] when the provider did it before returning,
    /// [`Moves::Started`] when it goes on elsewhere (the hardware provider hands it to its
    /// command thread: each modify is a firmware command), its result then coming from
    /// [`Verbs::poll_moved`], in the order moves were started. Until then, every later verb on
    /// `qp` behaves as though the moves were done (a provider may wait for them), but
    /// [`Verbs::query_qp_state`], which may still show the state before them. A QP destroyed
    /// or retired before its result was polled has none. By default, each modify here.
    ///
    /// # Errors
    /// What [`Verbs::modify_qp`] fails with, for moves done here (the QP then stays where
    /// the first failing move found it).
    fn begin_moves(&mut self, qp: QpNum, attrs: &[QpAttr]) -> Result<Moves, VerbsError> {
        for a in attrs {
            self.modify_qp(qp, a)?;
        }
        Ok(Moves::Done)
    }

    /// The result of moves [`Verbs::begin_moves`] started, the oldest first; `None` when
    /// none is ready. A provider that has results waiting makes the driver's loop turn (a
    /// readable [`IoSource`], or a [`Provider::poll_timeout`]). By default, never any.
    fn poll_moved(&mut self) -> Option<Moved> {
        None
    }

    /// Number of QPs that exist (created and not destroyed), QP1 included.
    fn qp_count(&self) -> usize;

    /// Attaches a UD QP to the multicast group `mgid` (`ibv_attach_mcast`): packets sent to
    /// the group (destination QPN 0xFFFFFF) are delivered to it. Destroying the QP detaches it.
    /// `mlid` is the group's multicast LID from the SA's MCMemberRecord on an InfiniBand port
    /// (0 where there is none, as on RoCE); providers that need it pass it on.
    ///
    /// # Errors
    /// [`VerbsError::NoSuchQp`], or [`VerbsError::InvalidWr`] for a non-UD QP or a GID that is
    /// not multicast.
    fn attach_mcast(&mut self, qp: QpNum, mgid: Gid, mlid: u16) -> Result<(), VerbsError>;

    /// Detaches a UD QP from a multicast group (`ibv_detach_mcast`).
    ///
    /// # Errors
    /// [`VerbsError::NoSuchObject`] if it was not attached.
    fn detach_mcast(&mut self, qp: QpNum, mgid: Gid) -> Result<(), VerbsError>;

    /// The next queued asynchronous event.
    fn poll_async_event(&mut self) -> Option<AsyncEvent>;
}

/// A file descriptor a provider needs watched, and for what.
///
/// The provider names its descriptors; the driver owns the poller (mio in the daemon) and
/// registers them, so that the seam knows no event loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoSource {
    /// The descriptor (a socket, a completion channel, an async-event fd).
    pub fd: RawFd,
    /// The provider wants to hear when it becomes writable (it holds output the descriptor
    /// would not take); readability is always wanted.
    pub writable: bool,
}

/// The I/O side of a provider, driven by the driver's event loop.
///
/// The driver registers the descriptors of [`Provider::io_source`] once, tells the provider
/// which of them reported readiness ([`Provider::note_readiness`]), calls
/// [`Provider::handle_io`] (after readiness or a timeout), brings its registrations in line
/// with `io_source` again after each turn (a provider's wish for writability changes as its
/// output queue fills and drains), and sleeps until [`Provider::poll_timeout`].
pub trait Provider {
    /// The verbs this provider implements.
    type Verbs: Verbs;

    /// What the other workers' providers of an interface copy of control's port, where the
    /// provider learns its port's state once for all of them (the software provider's
    /// InfiniBand link: attributes from the SMA, routes from beacons); `()` where every
    /// context reads its port itself (a device).
    type PortView: Send + Sync + 'static;

    /// The verbs.
    fn verbs(&mut self) -> &mut Self::Verbs;

    /// The provider's `index`th descriptor, `None` past the last (indices are dense from 0
    /// and the set is fixed for the provider's life).
    fn io_source(&self, index: usize) -> Option<IoSource>;

    /// Readiness was reported on descriptor `index`: the driver calls this for each such
    /// event before [`Provider::handle_io`]. A provider may skip reading sources that reported
    /// nothing since they were last drained; the default ignores it (and `handle_io` then
    /// reads every source each time).
    fn note_readiness(&mut self, _index: usize) {}

    /// Does all pending I/O and timer work: reads until the sources would block (those with
    /// something to read; see [`Provider::note_readiness`]), fires due timers, and transmits
    /// what is queued.
    ///
    /// # Errors
    /// A fatal I/O error of the provider's sources.
    fn handle_io(&mut self, now: Instant) -> io::Result<()>;

    /// The input half of [`Provider::handle_io`]: reads the sources and fires due timers, but
    /// leaves what that queued for transmission to [`Provider::flush`]. A driver that runs
    /// `handle_input`, then its own work (completions, TUN writes and reads), then `flush`,
    /// sends the acknowledgements of what it read together with its replies, after the data
    /// has been passed on. Returns how many packets it read (0 when it cannot tell), so that
    /// the driver can send the acknowledgements of a large batch before the long work of
    /// passing it on. The default is all of `handle_io`, reporting 0.
    ///
    /// # Errors
    /// As [`Provider::handle_io`].
    fn handle_input(&mut self, now: Instant) -> io::Result<usize> {
        self.handle_io(now).map(|()| 0)
    }

    /// The output half of [`Provider::handle_io`]: transmits what is queued (nothing to do
    /// for providers whose sends leave at post time, the default).
    ///
    /// # Errors
    /// As [`Provider::handle_io`].
    fn flush(&mut self, _now: Instant) -> io::Result<()> {
        Ok(())
    }

    /// When [`Provider::handle_io`] must next run even without readiness.
    fn poll_timeout(&self) -> Option<Instant>;

    /// One of several workers of an interface: hands every datagram it received for another
    /// worker's QPs to `out` (that worker's index, the sender, the datagram), for the driver
    /// to pass to that worker's [`Provider::accept_foreign`]. The default receives none.
    fn take_foreign(&mut self, _out: &mut dyn FnMut(u8, std::net::SocketAddr, &[u8])) {}

    /// Takes a datagram another worker received for this one's QPs, as if it had arrived
    /// here (what it queues leaves at the next flush). The default drops it.
    fn accept_foreign(&mut self, _now: Instant, _src: std::net::SocketAddr, _datagram: &[u8]) {}

    /// A number that changes whenever [`Provider::port_view`] would give another view.
    fn port_view_generation(&self) -> u64 {
        0
    }

    /// What the other workers' providers copy of this (control's) port; `None` where they
    /// read their port themselves (the default).
    fn port_view(&self) -> Option<Self::PortView> {
        None
    }

    /// One of several workers: its port is `view`, control's, from now on (the port events
    /// the change means are raised as the device would raise them). The default ignores it.
    fn follow_port_view(&mut self, _view: &Self::PortView) {}

    /// Opens the device again after its context was lost ([`AsyncEvent::loses_context`]):
    /// every PD, CQ, SRQ, QP, buffer pool and pending event of the old context is gone (their
    /// handles name nothing, or objects of the new context), and the provider's descriptors
    /// ([`Provider::io_source`]) may have changed, so the driver registers them again. On
    /// failure the old, dead context stays in place and the call may be retried. The default
    /// cannot reopen.
    ///
    /// # Errors
    /// Why the device could not be opened.
    fn reopen(&mut self) -> Result<(), ReopenError> {
        Err(ReopenError::Unsupported)
    }
}
