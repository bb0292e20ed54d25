//! The device context ([`HwVerbs`]: the libibverbs handles and the tables of every object
//! created on it), what opens it ([`HwConfig`]) and what it counts ([`HwStats`]).

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;

use ibverbs_sys as ffi;

use super::ah_cache::AhCache;
use super::commands::QpCommands;
use super::objects::{Ah, Cq, Ipv4Joins, Pd, Qp, Srq, WrTable};
use crate::verbs::{
    AddressVector, AsyncEvent, BufPools, Moved, PdId, PoolId, PortAttr, WcOpcode, WcStatus,
};

/// What to open.
#[derive(Debug, Clone, Default)]
pub struct HwConfig {
    /// Device name (`rxe0`, `mlx5_0`); the first device when `None`.
    pub device: Option<String>,
    /// Port number; 1 when `None`.
    pub port: Option<u8>,
    /// GID index; when `None`, the RoCEv2 IPv4-mapped GID of `local_ip`, else 0.
    pub gid_index: Option<u8>,
    /// The local IP address whose GID to use.
    pub local_ip: Option<IpAddr>,
}

/// A libibverbs device context on one port. See the [module documentation](super).
#[derive(Debug)]
pub struct HwVerbs {
    pub(super) ctx: *mut ffi::ibv_context,
    pub(super) channel: *mut ffi::ibv_comp_channel,
    pub(super) port: u8,
    pub(super) gid_index: u8,
    pub(super) attr: PortAttr,
    pub(super) name: String,
    pub(super) pools: BufPools,
    /// Pool → (MR, its PD).
    pub(super) mrs: HashMap<PoolId, (*mut ffi::ibv_mr, PdId)>,
    pub(super) pds: HashMap<u32, Pd>,
    pub(super) cqs: HashMap<u32, Cq>,
    pub(super) srqs: HashMap<u32, Srq>,
    pub(super) qps: HashMap<u32, Qp>,
    pub(super) ahs: AhCache<(PdId, AddressVector), Ah>,
    pub(super) wrs: WrTable,
    /// The QPs with sends waiting for their doorbell (`Qp::pending`), each once.
    pub(super) chained: Vec<u32>,
    /// Which of the completion channel (0), the async descriptor (1) and the command
    /// thread's eventfd (2) reported readiness since they were last read; `None` until a
    /// driver reports any (then every call reads all, for callers that poll without an event
    /// loop).
    pub(super) readiness: Option<[bool; 3]>,
    /// The completion vector the next CQ gets: CQs take the device's vectors in turn.
    pub(super) next_comp_vector: i32,
    pub(super) next_id: u32,
    pub(super) events: VecDeque<AsyncEvent>,
    pub(super) wc: Vec<ffi::ibv_wc>,
    pub(super) stats: HwStats,
    /// IPv4 groups joined for multicast attachments on a RoCEv2 IPv4 port.
    pub(super) ipv4_joins: Ipv4Joins,
    /// The port's link layer is InfiniBand (LIDs, an SM, an SA), not Ethernet (RoCE).
    pub(super) infiniband: bool,
    /// What the device was opened with (a reopen opens the same device and port again).
    pub(super) cfg: HwConfig,
    /// QP creates, moves and destroys off the caller's thread, and QPs created ahead.
    pub(super) commands: QpCommands,
    /// QPs with moves on the command thread (`Qp::moving`), and the token of the last moves.
    pub(super) moving_qps: usize,
    pub(super) next_moves: u64,
    /// Results of moves answered, for `poll_moved`.
    pub(super) moved: VecDeque<Moved>,
}

/// What the libibverbs provider counted, for the daemon's status (serialized field by field,
/// each name behind the status's `hw_` prefix).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct HwStats {
    /// Work completions handed out.
    pub completions: u64,
    /// Of those, completions with an error status (flushes included).
    pub completion_errors: u64,
    /// Of those, receives that ended in an error other than a flush: a message that arrived
    /// and was not delivered (in the status's `rx_dropped` and `rx_errors`).
    pub recv_errors: u64,
    /// Of those, sends that ended in an error other than a flush: a packet posted and not
    /// delivered (in the status's `tx_errors`). The sends flushed behind it are not counted.
    pub send_errors: u64,
    /// Asynchronous events read from the device.
    pub async_events: u64,
    /// Of those, events of a kind the provider does not pass on.
    pub async_unhandled: u64,
    /// Address handles created (one per UD destination not in the cache).
    pub ah_created: u64,
    /// Address handles destroyed (evicted ones once their sends completed).
    pub ah_destroyed: u64,
    /// Address handles evicted from the full cache, least recently used first.
    pub ah_evicted: u64,
    /// Completions of a QP about to be destroyed, swept from the device's CQs into the
    /// wrapper's backlog first (and handed out by later polls, as their buffers must be).
    pub destroy_swept_completions: u64,
    /// `create_qp` calls answered with a QP created ahead on the QP command thread (no
    /// `ibv_create_qp` on the caller's thread).
    pub qp_stash_hits: u64,
    /// QPs the QP command thread created (ahead of need) and destroyed (retired drained QPs).
    pub qps_created_off_loop: u64,
    /// See [`HwStats::qps_created_off_loop`].
    pub qps_destroyed_off_loop: u64,
    /// `ibv_modify_qp` calls the QP command thread made ([`Verbs::begin_moves`]).
    ///
    /// [`Verbs::begin_moves`]: crate::verbs::Verbs::begin_moves
    pub qp_modifies_off_loop: u64,
    /// Creates, modifies and destroys that failed on the QP command thread (each logged or
    /// passed on).
    pub qp_commands_failed_off_loop: u64,
    /// Microseconds the QP command thread spent in `ibv_create_qp` (failed calls included):
    /// over [`HwStats::qps_created_off_loop`], what one create costs the device, each a wait
    /// the event loop did not make (about a millisecond of firmware on a ConnectX).
    pub qp_create_us_off_loop: u64,
    /// Microseconds the QP command thread spent in `ibv_modify_qp`; see
    /// [`HwStats::qp_create_us_off_loop`] and [`HwStats::qp_modifies_off_loop`].
    pub qp_modify_us_off_loop: u64,
    /// Microseconds the QP command thread spent in `ibv_destroy_qp`; see
    /// [`HwStats::qp_create_us_off_loop`] and [`HwStats::qps_destroyed_off_loop`].
    pub qp_destroy_us_off_loop: u64,
    /// QPs created ahead and not taken yet, now (a gauge: the device holds these beyond the
    /// caller's QPs, at most `STASH_DEPTH` of each of `MAX_KINDS` kinds, in `hw/commands.rs`).
    pub qps_ready_ahead: u64,
    /// The data path's verbs calls.
    #[serde(flatten)]
    pub calls: HwCalls,
}

/// The verbs calls of the data path, counted (counts, unlike times, do not move from run to
/// run): doorbells (post calls) and the work requests they carry, CQ polls, completion
/// events and their acks, and the QP commands that go to the device's firmware.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct HwCalls {
    /// `ibv_post_send` calls (one doorbell each).
    pub post_send_calls: u64,
    /// Send work requests posted.
    pub send_wrs: u64,
    /// Of those, sends whose payload went inline in the work request (`IBV_SEND_INLINE`).
    pub inline_sends: u64,
    /// `ibv_post_recv` and `ibv_post_srq_recv` calls (one doorbell each).
    pub post_recv_calls: u64,
    /// Receive work requests posted.
    pub recv_wrs: u64,
    /// `ibv_poll_cq` calls, empty ones included.
    pub poll_cq_calls: u64,
    /// Work completions the device wrote (what `ibv_poll_cq` returned); `completions` counts
    /// those handed out, which a signaled send's completion stands in for in its QP's earlier
    /// sends.
    pub cqes: u64,
    /// Reads of the completion channel (`ibv_get_cq_event`), the one that finds it empty
    /// included.
    pub channel_reads: u64,
    /// Completion events read from the channel.
    pub cq_events: u64,
    /// Reads of the async-event descriptor (`ibv_get_async_event`), the one that finds it
    /// empty included.
    pub async_fd_reads: u64,
    /// `ibv_ack_cq_events` calls.
    pub cq_event_acks: u64,
    /// `ibv_query_qp` calls made for `ibv_modify_qp`: only when a modify from the tracked
    /// state failed, and to wait out an SQD drain (the caller's own state queries aside).
    pub query_qp_calls: u64,
    /// `ibv_modify_qp` calls on the caller's thread (the QP command thread's are in
    /// [`HwStats::qp_modifies_off_loop`]).
    pub modify_qp_calls: u64,
    /// `ibv_create_qp` calls on the caller's thread (the QP command thread's are in
    /// [`HwStats::qps_created_off_loop`]).
    pub create_qp_calls: u64,
    /// `ibv_destroy_qp` calls on the caller's thread (the QP command thread's are in
    /// [`HwStats::qps_destroyed_off_loop`]).
    pub destroy_qp_calls: u64,
}

impl HwStats {
    /// Counts one completion handed out with `status`, a send's or a receive's.
    pub(crate) fn count_completion(&mut self, opcode: WcOpcode, status: WcStatus) {
        self.completions += 1;
        if status == WcStatus::Success {
            return;
        }
        self.completion_errors += 1;
        match (status, opcode) {
            (WcStatus::WrFlushErr, _) => {}
            (_, WcOpcode::Send) => self.send_errors += 1,
            (_, WcOpcode::Recv) => self.recv_errors += 1,
        }
    }
}
