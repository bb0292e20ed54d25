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
//! - **QP commands off the caller's thread**: a drained QP ([`Verbs::retire_qp`]) is destroyed,
//!   RC QPs of the kinds the caller creates are created ahead, and the moves of
//!   [`Verbs::begin_moves`] are made, on a thread of their own (`commands`): firmware commands
//!   of about a millisecond each on a ConnectX, which would otherwise hold every packet of the
//!   event loop behind them. A move's result wakes the loop through an eventfd, the
//!   provider's third descriptor.
//! - **I/O**: all CQs share one completion channel; its fd and the async-event fd are
//!   non-blocking and registered with mio. On readiness [`Provider::handle_io`] reads every CQ
//!   event, acks it and re-arms the CQ (the caller then polls); async events are translated to
//!   [`AsyncEvent`] and acked one by one.
//!
//! The hardware provider cannot own QP1 (the kernel does), so [`QpType::Gsi`] QPs are refused;
//! CM MADs need a side channel there.
//!
//! Layout: `context` ([`HwVerbs`], its tables and counters) and `objects` (the record kept of
//! each device object) are the state; one module per kind of object holds its operations:
//! `device` (open and close the context), `pd` (PDs, MRs, AHs), `ah_cache` (which AHs to
//! keep and when to destroy them), `cq` (CQs and the completion channel), `srq`, `qp`,
//! `commands` (the QP command thread and the QPs created ahead), `wr`
//! (posting and the WR table), `mcast` (IPv4 group joins), `events` (async events);
//! `provider` holds the trait impls over them, `ffi_map` the C enum conversions, and `error`.
//!
//! Every `unsafe` block of the crate's provider code lives in this module and its children,
//! each with a `SAFETY:` comment.
//!
//! [`Verbs`]: crate::verbs::Verbs
//! [`Verbs::retire_qp`]: crate::verbs::Verbs::retire_qp
//! [`Verbs::begin_moves`]: crate::verbs::Verbs::begin_moves
//! [`Provider`]: crate::verbs::Provider
//! [`WrId`]: crate::verbs::WrId
//! [`BufId`]: crate::verbs::BufId
//! [`check_modify`]: crate::verbs::check_modify
//! [`VerbsError::InvalidState`]: crate::verbs::VerbsError::InvalidState
//! [`VerbsError::Busy`]: crate::verbs::VerbsError::Busy
//! [`Provider::handle_io`]: crate::verbs::Provider::handle_io
//! [`QpType::Gsi`]: crate::verbs::QpType::Gsi
//! [`AsyncEvent`]: crate::verbs::AsyncEvent
#![allow(unsafe_code)]

mod ah_cache;
mod av;
mod commands;
#[doc(hidden)]
pub mod conformance;
mod context;
mod cq;
mod device;
mod error;
mod events;
mod ffi_map;
mod mcast;
mod objects;
mod pd;
mod pkey;
mod provider;
mod qp;
pub mod rdmacm;
mod srq;
mod wr;

pub use context::{HwCalls, HwConfig, HwStats, HwVerbs};
pub use error::HwError;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::{WcOpcode, WcStatus};

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
            destroy_swept_completions: 23,
            qp_stash_hits: 24,
            qps_created_off_loop: 25,
            qps_destroyed_off_loop: 26,
            qp_modifies_off_loop: 31,
            qp_commands_failed_off_loop: 27,
            qp_create_us_off_loop: 32,
            qp_modify_us_off_loop: 33,
            qp_destroy_us_off_loop: 34,
            qps_ready_ahead: 28,
            calls: HwCalls {
                post_send_calls: 10,
                send_wrs: 11,
                inline_sends: 12,
                post_recv_calls: 13,
                recv_wrs: 14,
                poll_cq_calls: 15,
                cqes: 20,
                channel_reads: 21,
                cq_events: 16,
                async_fd_reads: 22,
                cq_event_acks: 17,
                query_qp_calls: 18,
                modify_qp_calls: 19,
                create_qp_calls: 29,
                destroy_qp_calls: 30,
            },
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
                "destroy_swept_completions": 23,
                "qp_stash_hits": 24,
                "qps_created_off_loop": 25,
                "qps_destroyed_off_loop": 26,
                "qp_modifies_off_loop": 31,
                "qp_commands_failed_off_loop": 27,
                "qp_create_us_off_loop": 32,
                "qp_modify_us_off_loop": 33,
                "qp_destroy_us_off_loop": 34,
                "qps_ready_ahead": 28,
                "post_send_calls": 10,
                "send_wrs": 11,
                "inline_sends": 12,
                "post_recv_calls": 13,
                "recv_wrs": 14,
                "poll_cq_calls": 15,
                "cqes": 20,
                "channel_reads": 21,
                "cq_events": 16,
                "async_fd_reads": 22,
                "cq_event_acks": 17,
                "query_qp_calls": 18,
                "modify_qp_calls": 19,
                "create_qp_calls": 29,
                "destroy_qp_calls": 30,
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
