//! The libibverbs hardware provider ([`HwVerbs`]), behind the `verbs` cargo feature.
//!
//! [`HwVerbs`] implements [`Verbs`] and [`Provider`] over raw `ibverbs-sys` (the safe `ibverbs`
//! crate cannot register existing memory, create SRQs or completion channels, or modify QPs).
//! One instance is one device context on one port and one GID index.
//!
//! What the hardware does not track, this wrapper does, so that the contract of
//! [`crate::verbs`] holds on every device:
//!
//! - **Buffers**: each pool is one MR (`ibv_reg_mr` over the pool's memory). Every posted WR
//!   gets a provider-internal `wr_id`; a table maps it back to the caller's [`WrId`] and
//!   [`BufId`], so completions carry `buf`, a destroyed QP or SRQ frees its posted buffers, and
//!   an unsignaled send is posted signaled on the device and its successful completion is
//!   swallowed (its buffer freed), as the contract asks.
//! - **State rules**: [`check_modify`] runs first (against the state `ibv_query_qp` reports), so
//!   a bad modify fails exactly as on the software provider; `post_send` before RTS and
//!   `post_recv` in RESET fail with [`VerbsError::InvalidState`]; queue depths are enforced as
//!   requested (the device may round them up).
//! - **Object rules**: CQs, SRQs and PDs count their users and refuse destruction with
//!   [`VerbsError::Busy`].
//! - **I/O**: all CQs share one completion channel; its fd and the async-event fd are
//!   non-blocking and registered with mio. On readiness [`Provider::handle_io`] reads every CQ
//!   event, acks it and re-arms the CQ (the caller then polls); async events are translated to
//!   [`AsyncEvent`] and acked one by one.
//!
//! The hardware provider cannot own QP1 (the kernel does), so [`QpType::Gsi`] QPs are refused;
//! CM MADs need a side channel there.
//!
//! Layout, one module per kind of object the device owns: `device` (open and close the
//! context), `pd` (PDs, MRs, AHs), `ah_cache` (which AHs to keep and when to destroy them), `cq` (CQs and the completion channel), `srq`, `qp`, `wr`
//! (posting and the WR table), `events` (async events), `provider` (the trait impls over
//! them), `ffi_map` (C enum conversions) and `error`.
//!
//! Every `unsafe` block of the crate's provider code lives in this module and its children,
//! each with a `SAFETY:` comment.
//!
//! [`Verbs`]: crate::verbs::Verbs
//! [`Provider`]: crate::verbs::Provider
//! [`WrId`]: crate::verbs::WrId
//! [`BufId`]: crate::verbs::BufId
//! [`check_modify`]: crate::verbs::check_modify
//! [`VerbsError::InvalidState`]: crate::verbs::VerbsError::InvalidState
//! [`VerbsError::Busy`]: crate::verbs::VerbsError::Busy
//! [`Provider::handle_io`]: crate::verbs::Provider::handle_io
//! [`QpType::Gsi`]: crate::verbs::QpType::Gsi
#![allow(unsafe_code)]

mod ah_cache;
#[doc(hidden)]
pub mod conformance;
mod cq;
mod device;
mod error;
mod events;
mod ffi_map;
mod mcast;
mod pd;
mod provider;
mod qp;
pub mod rdmacm;
mod srq;
mod wr;

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;

use ibverbs_sys as ffi;

use crate::verbs::{
    AddressVector, AsyncEvent, BufPools, PdId, PoolId, PortAttr, WcOpcode, WcStatus,
};

pub use error::HwError;

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

/// A libibverbs device context on one port. See the [module documentation](self).
#[derive(Debug)]
pub struct HwVerbs {
    ctx: *mut ffi::ibv_context,
    channel: *mut ffi::ibv_comp_channel,
    port: u8,
    gid_index: u8,
    attr: PortAttr,
    name: String,
    pools: BufPools,
    /// Pool → (MR, its PD).
    mrs: HashMap<PoolId, (*mut ffi::ibv_mr, PdId)>,
    pds: HashMap<u32, pd::Pd>,
    cqs: HashMap<u32, cq::Cq>,
    srqs: HashMap<u32, srq::Srq>,
    qps: HashMap<u32, qp::Qp>,
    ahs: ah_cache::AhCache<(PdId, AddressVector), pd::Ah>,
    wrs: HashMap<u64, wr::Wr>,
    next_wr: u64,
    next_id: u32,
    events: VecDeque<AsyncEvent>,
    wc: Vec<ffi::ibv_wc>,
    stats: HwStats,
    /// IPv4 groups joined for multicast attachments on a RoCEv2 IPv4 port.
    ipv4_joins: mcast::Ipv4Joins,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Without an RDMA device (CI), opening fails cleanly with a no-device error.
    #[test]
    fn open_without_device_is_a_clean_error() {
        if std::path::Path::new("/sys/class/infiniband_verbs").exists() {
            return;
        }
        match HwVerbs::open(&HwConfig::default()) {
            Err(e) if e.is_no_device() => assert!(e.to_string().starts_with("no RDMA device")),
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("opened a device on a machine without RDMA"),
        }
    }

    /// The status names the counters `hw_` + field name: the field names are the schema.
    #[test]
    fn stats_serialize_under_their_status_names() {
        let s = HwStats {
            completions: 1,
            completion_errors: 2,
            recv_errors: 5,
            send_errors: 6,
            async_events: 3,
            async_unhandled: 4,
            ah_created: 7,
            ah_destroyed: 8,
            ah_evicted: 9,
        };
        assert_eq!(
            serde_json::to_value(s).unwrap(),
            serde_json::json!({
                "completions": 1,
                "completion_errors": 2,
                "recv_errors": 5,
                "send_errors": 6,
                "async_events": 3,
                "async_unhandled": 4,
                "ah_created": 7,
                "ah_destroyed": 8,
                "ah_evicted": 9,
            })
        );
    }

    /// Flushes are errors but not losses of their own: only the other errors are sends or
    /// receives lost.
    #[test]
    fn a_flush_is_a_completion_error_but_no_send_or_receive_error() {
        let mut s = HwStats::default();
        s.count_completion(WcOpcode::Send, WcStatus::Success);
        s.count_completion(WcOpcode::Send, WcStatus::WrFlushErr);
        s.count_completion(WcOpcode::Recv, WcStatus::WrFlushErr);
        s.count_completion(WcOpcode::Send, WcStatus::RetryExcErr);
        s.count_completion(WcOpcode::Recv, WcStatus::LocLenErr);
        s.count_completion(WcOpcode::Recv, WcStatus::LocLenErr);
        assert_eq!(
            (
                s.completions,
                s.completion_errors,
                s.send_errors,
                s.recv_errors
            ),
            (6, 5, 1, 2)
        );
    }
}
