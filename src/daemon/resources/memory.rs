//! The memory `ipoib-cm up` needs with its settings: the buffers a packet can fill, all
//! allocated at start and committed then ([`DaemonProvider::commit_memory`]), and the rest of
//! the process, measured.
//!
//! [`DaemonProvider::commit_memory`]: crate::daemon::provider::DaemonProvider::commit_memory

use crate::daemon::config::{Config, ProviderKind};
use crate::driver::workers::{FOREIGN_CAP, HANDED_BYTES_MAX};
use crate::ipoib::PoolBytes;
use crate::mad::CmTransport;
use crate::soft::provider::{SoftProvider, UdpOffload, FOREIGN_DATAGRAM_MAX, FOREIGN_SLOTS};
use crate::soft::SoftVerbs;
use crate::verbs::PathMtu;
use crate::wire::ipoib::IPOIB_CM_BUF_SIZE;

/// What the process needs beside its buffers: its code and libraries (about 4.5 MiB
/// resident), the heap of its tables and a 1 Gbit/s stream or an iperf3 at full speed through
/// a few connections (measured: 5.7 MiB resident at start beyond the buffers, at most 2.4
/// MiB more under load), and the kernel's own for the process (page tables, socket state).
pub const REST_OF_PROCESS: usize = 10 << 20;

/// The memory the settings need, by part, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryNeed {
    /// The endpoint's buffer pools.
    pub pools: PoolBytes,
    /// The buffer pool of the CM's QP1 (`--cm-transport qp1`, the soft provider's).
    pub cm: usize,
    /// The software provider's datagram buffers (none on libibverbs).
    pub provider_io: usize,
    /// The software provider's room for requests held out of sequence (`reorder_hold`).
    pub reorder_hold: usize,
    /// [`REST_OF_PROCESS`].
    pub rest: usize,
    /// Workers (`--workers`): each has its own RC pools, datagram buffers and reorder hold;
    /// the UD QP is control's alone.
    pub workers: usize,
    /// What several workers hand each other, at most: the packets followers hand control to
    /// send ([`HANDED_BYTES_MAX`]) and, on the software provider, each worker's datagrams of
    /// another's QPs (held for it, and queued to it). None with one worker.
    pub handover: usize,
}

impl MemoryNeed {
    /// The memory `cfg` needs: the receive pool scales with `srq_depth + rx_spare` (with an
    /// SRQ) or `16 * (max_conn_qp + max_pending_rx + 1) + rx_spare` (without), 64 KiB a
    /// buffer; the rest is fixed (the send buffers, the UD QP's, the CM's, the provider's
    /// datagram batches) or measured.
    pub fn of(cfg: &Config) -> Self {
        // The largest IB MTU: the UD buffers hold the port's largest, not known before the
        // device is open (the software provider's is 4096).
        let pools = cfg
            .endpoint_config(PathMtu::Mtu4096, 0)
            .pool_bytes(PathMtu::Mtu4096);
        let cm = match cfg.cm_transport.unwrap_or(CmTransport::Qp1) {
            CmTransport::Qp1 => {
                crate::mad::gsi_pool_bytes(crate::mad::GSI_RECV_DEPTH, crate::mad::GSI_SEND_DEPTH)
            }
            CmTransport::Udp | CmTransport::Umad | CmTransport::RdmaCm => 0,
        };
        let provider_io = match cfg.provider {
            ProviderKind::Soft => SoftProvider::io_buffer_bytes(if cfg.udp_offload {
                UdpOffload::On
            } else {
                UdpOffload::Off
            }),
            ProviderKind::Verbs => 0,
        };
        let reorder_hold = match cfg.provider {
            ProviderKind::Soft => SoftVerbs::reorder_hold_bytes(cfg.reorder_hold),
            ProviderKind::Verbs => 0,
        };
        let workers = usize::from(cfg.workers.get());
        let handover = if workers > 1 {
            let datagrams = match cfg.provider {
                ProviderKind::Soft => (FOREIGN_SLOTS + FOREIGN_CAP) * FOREIGN_DATAGRAM_MAX,
                ProviderKind::Verbs => 0,
            };
            HANDED_BYTES_MAX + workers * datagrams
        } else {
            0
        };
        Self {
            pools,
            cm,
            provider_io,
            reorder_hold,
            rest: REST_OF_PROCESS,
            workers,
            handover,
        }
    }

    /// All of it: every worker's pools, datagram buffers and reorder hold; the UD QP's pool
    /// (control's: a follower has no UD QP), what the workers hand each other, the CM's and
    /// the rest once.
    pub fn total(&self) -> usize {
        let per_worker = self.pools.rx + self.pools.tx + self.provider_io + self.reorder_hold;
        per_worker * self.workers.max(1) + self.pools.ud + self.handover + self.cm + self.rest
    }

    /// The parts, for the log and the error: `receive pool 32.0 MiB (srq_depth 256 + rx_spare
    /// 256 buffers of 64 KiB), send pool 8.0 MiB, ...`.
    pub fn breakdown(&self, cfg: &Config) -> String {
        let rx_what = if cfg.srq {
            format!(
                "srq_depth {} + rx_spare {} buffers of {}",
                cfg.srq_depth, cfg.rx_spare, BUFFER
            )
        } else {
            let ecfg = cfg.endpoint_config(PathMtu::Mtu4096, 0);
            format!(
                "{} a connection for max_conn_qp {} + max_pending_rx {} + 1, and rx_spare {}, \
                 buffers of {}",
                ecfg.nonsrq_ring, cfg.max_conn_qp, cfg.max_pending_rx, cfg.rx_spare, BUFFER
            )
        };
        let mut parts = vec![
            format!("receive pool {} ({rx_what})", mib(self.pools.rx)),
            format!("send pool {}", mib(self.pools.tx)),
        ];
        let ud = format!("UD {}", mib(self.pools.ud));
        if self.provider_io > 0 {
            parts.push(format!("UDP batches {}", mib(self.provider_io)));
        }
        if self.reorder_hold > 0 {
            parts.push(format!(
                "reorder hold {} (reorder_hold {} packets)",
                mib(self.reorder_hold),
                cfg.reorder_hold
            ));
        }
        let cm = (self.cm > 0).then(|| format!("CM {}", mib(self.cm)));
        let rest = format!("the rest {}", mib(self.rest));
        if self.workers > 1 {
            // Every worker's part, then what the interface has once.
            let handover = format!("handed between workers {}", mib(self.handover));
            let once = [ud]
                .into_iter()
                .chain(cm)
                .chain([handover, rest])
                .collect::<Vec<_>>()
                .join(", ");
            return format!(
                "{} workers each: {}, {once}",
                self.workers,
                parts.join(", ")
            );
        }
        // One worker: the UD QP's pool and the CM's QP1 pool after the send pool.
        parts.insert(2, ud);
        if let Some(cm) = cm {
            parts.insert(3, cm);
        }
        parts.push(rest);
        parts.join(", ")
    }

    /// The settings that shrink the need, and how much each buffer or connection weighs.
    pub fn shrink_hint(cfg: &Config) -> String {
        let pools = if cfg.srq {
            format!("lower --srq-depth or --rx-spare ({BUFFER} a buffer)")
        } else {
            let ring = cfg.endpoint_config(PathMtu::Mtu4096, 0).nonsrq_ring;
            format!(
                "lower --max-conn-qp or --max-pending-rx ({} a connection) or --rx-spare \
                 ({BUFFER} a buffer), or leave --no-srq out",
                mib(ring as usize * IPOIB_CM_BUF_SIZE as usize)
            )
        };
        let gso = SoftProvider::io_buffer_bytes(UdpOffload::On)
            - SoftProvider::io_buffer_bytes(UdpOffload::Off);
        let mut hint = pools;
        if cfg.provider == ProviderKind::Soft && cfg.udp_offload {
            hint += &format!("; --no-udp-offload saves {}", mib(gso));
        }
        if cfg.provider == ProviderKind::Soft && cfg.reorder_hold > 0 {
            hint += &format!(
                "; lower --reorder-hold ({} KiB a packet)",
                SoftVerbs::reorder_hold_bytes(1) / 1024
            );
        }
        hint
    }
}

/// One receive or send buffer, as the messages name it.
const BUFFER: &str = "64 KiB";

/// `bytes` in MiB with one decimal.
pub(super) fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

#[cfg(test)]
mod tests {
    use super::super::tests::config;
    use super::*;
    use crate::ipoib::Endpoint;
    use crate::soft::{SoftConfig, SoftVerbs};
    use crate::verbs::Verbs;
    use std::time::Instant;

    #[test]
    fn the_defaults_need_about_65_mib() {
        let cfg = config("");
        let need = MemoryNeed::of(&cfg);
        let buf = IPOIB_CM_BUF_SIZE as usize;
        assert_eq!(need.pools.rx, 512 * buf);
        assert_eq!(need.pools.tx, 128 * buf);
        assert_eq!(need.pools.ud, 512 * (40 + 4096));
        assert_eq!(need.cm, 1280 * (40 + 256));
        assert_eq!(need.provider_io, 64 * (65_536 + 65_536));
        assert_eq!(need.reorder_hold, 1024 * (4096 + 64));
        assert_eq!(need.total() >> 20, 64);
        assert_eq!(
            need.breakdown(&cfg),
            "receive pool 32.0 MiB (srq_depth 256 + rx_spare 256 buffers of 64 KiB), send pool \
             8.0 MiB, UD 2.0 MiB, CM 0.4 MiB, UDP batches 8.0 MiB, reorder hold 4.1 MiB \
             (reorder_hold 1024 packets), the rest 10.0 MiB"
        );
        assert_eq!(
            MemoryNeed::shrink_hint(&cfg),
            "lower --srq-depth or --rx-spare (64 KiB a buffer); --no-udp-offload saves 3.7 MiB; \
             lower --reorder-hold (4 KiB a packet)"
        );
        let rxe_like = config("reorder_hold = 0\n");
        assert_eq!(MemoryNeed::of(&rxe_like).reorder_hold, 0);
        assert!(!MemoryNeed::shrink_hint(&rxe_like).contains("reorder"));
    }

    /// Each worker has its own pools, datagram buffers and reorder hold; the CM's QP1, what
    /// the workers hand each other and the rest of the process are the interface's, once.
    #[test]
    fn four_workers_need_four_times_the_buffers() {
        let one = MemoryNeed::of(&config(""));
        assert_eq!(one.handover, 0);
        let four = MemoryNeed::of(&config("workers = 4\n"));
        let per_worker = one.total() - one.pools.ud - one.cm - one.rest;
        // Packets for control to send, and each worker's datagrams of another's QPs.
        assert_eq!(
            four.handover,
            HANDED_BYTES_MAX + 4 * (FOREIGN_SLOTS + FOREIGN_CAP) * FOREIGN_DATAGRAM_MAX
        );
        assert_eq!(four.handover >> 20, 37);
        assert_eq!(
            four.total(),
            4 * per_worker + one.pools.ud + four.handover + one.cm + one.rest
        );
        // 52 MiB a worker (54 with control's UD QP), the rest once.
        assert_eq!(per_worker >> 20, 52);
        assert_eq!(four.total() >> 20, 4 * 52 + 2 + 37 + 10);
        assert_eq!(
            four.breakdown(&config("workers = 4\n")),
            "4 workers each: receive pool 32.0 MiB (srq_depth 256 + rx_spare 256 buffers of 64 \
             KiB), send pool 8.0 MiB, UDP batches 8.0 MiB, reorder hold 4.1 MiB (reorder_hold \
             1024 packets), UD 2.0 MiB, CM 0.4 MiB, handed between workers 37.2 MiB, the rest \
             10.0 MiB"
        );
    }

    #[test]
    fn the_receive_pool_scales_with_the_srq_and_the_spares_or_the_connections() {
        let small = MemoryNeed::of(&config("srq_depth = 64\nrx_spare = 32\n"));
        let buf = IPOIB_CM_BUF_SIZE as usize;
        assert_eq!(small.pools.rx, 96 * buf);
        let no_srq = config("no_srq = true\nmax_conn_qp = 8\nmax_pending_rx = 4\nrx_spare = 16\n");
        let need = MemoryNeed::of(&no_srq);
        assert_eq!(need.pools.rx, (16 * (8 + 4 + 1) + 16) * buf);
        assert!(need
            .breakdown(&no_srq)
            .starts_with("receive pool 14.0 MiB (16 a connection for max_conn_qp 8 + max_pending_rx 4 + 1, and rx_spare 16, buffers of 64 KiB)"));
        assert_eq!(
            MemoryNeed::shrink_hint(&no_srq),
            "lower --max-conn-qp or --max-pending-rx (1.0 MiB a connection) or --rx-spare (64 \
             KiB a buffer), or leave --no-srq out; --no-udp-offload saves 3.7 MiB; lower \
             --reorder-hold (4 KiB a packet)"
        );
        let plain = MemoryNeed::of(&config("no_udp_offload = true\ncm_transport = \"udp\"\n"));
        assert_eq!(plain.provider_io, 64 * (65_536 + 4_352));
        assert_eq!(plain.cm, 0);
    }

    /// The need counts every pool the endpoint and the CM's QP1 create, byte for byte.
    #[test]
    fn the_need_is_what_the_endpoint_and_qp1_allocate() {
        for extra in [
            "",
            "srq_depth = 64\nrx_spare = 32\n",
            "no_srq = true\nmax_conn_qp = 4\n",
        ] {
            let cfg = config(extra);
            let need = MemoryNeed::of(&cfg);
            let mut v = SoftVerbs::new(SoftConfig::new(cfg.bind));
            crate::mad::Gsi::open_for_cm(&mut v).unwrap();
            let ecfg = cfg.endpoint_config(PathMtu::Mtu4096, 1);
            Endpoint::new(Instant::now(), &mut v, ecfg, None).unwrap();
            assert_eq!(
                v.pools().total_bytes(),
                need.pools.rx + need.pools.tx + need.pools.ud + need.cm,
                "{extra}"
            );
        }
    }
}
