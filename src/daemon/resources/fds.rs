//! The file descriptors `ipoib-cm up` holds with its settings, each part counted where the
//! code that opens it keeps its bound ([`client_slots::descriptors`],
//! [`SoftProvider::descriptors`], the control socket's and the metrics listener's
//! `MAX_CLIENTS`).

use crate::daemon::client_slots;
use crate::daemon::config::{Config, ProviderKind};
use crate::daemon::{control, metrics};
use crate::mad::CmTransport;
use crate::soft::provider::SoftProvider;
use crate::verbs::PathMtu;

/// The event loop's: its epoll instance, the socket pair signal-hook-mio delivers signals
/// through, and the route netlink socket that wakes it when the underlay changes
/// ([`LinkWatch`](crate::sys::netlink::LinkWatch)).
const EVENT_LOOP: usize = 4;
/// The TUN device.
const TUN: usize = 1;
/// A libibverbs device: its command and async descriptors, its completion channel and the
/// command thread's eventfd (`hw::HwVerbs::io_source`), and the umad device of the SA client
/// on an InfiniBand port.
const VERBS_DEVICE: usize = 5;
/// The kernel's CM through librdmacm: its event channel, and the command and async
/// descriptors of the device context librdmacm opens for the port.
const RDMA_CM: usize = 3;
/// The CM's own socket or device: the UDP side channel's socket, or the umad device.
const MAD_DEVICE: usize = 1;
/// Descriptors a step opens and closes again (the netlink or ioctl socket of a set-up step,
/// the file a reload reads), at most two at once.
const TRANSIENT: usize = 2;

/// The descriptors the settings need, by part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdNeed {
    /// Open when the daemon started (stdin, stdout, stderr, inherited ones) below the limit.
    pub open: usize,
    /// The provider's: the software provider's socket (and with underlay multicast its
    /// group sockets and their poll), or a libibverbs device's.
    pub provider: usize,
    /// The CM transport's own.
    pub cm: usize,
    /// The event loop's and the TUN device.
    pub event_loop: usize,
    /// The control socket with its clients.
    pub control: usize,
    /// The metrics listener with its clients (`--metrics-listen`).
    pub metrics: usize,
    /// The systemd notification socket (`$NOTIFY_SOCKET`), and the two a step may open and
    /// close again.
    pub other: usize,
    /// The other workers' (`--workers`): each one's provider (socket, or device context), its
    /// loop's poll and wake-up and its TUN queue; and control's wake-up.
    pub workers: usize,
}

/// A worker's loop beside its provider: its poll, its wake-up and its TUN queue.
const WORKER_LOOP: usize = 3;

impl FdNeed {
    /// What `cfg` needs beside the `open` descriptors; `notify`: `$NOTIFY_SOCKET` is set.
    pub fn of(cfg: &Config, open: usize, notify: bool) -> Self {
        let provider = match cfg.provider {
            ProviderKind::Soft => SoftProvider::descriptors(cfg.multicast, multicast_groups(cfg)),
            ProviderKind::Verbs => VERBS_DEVICE,
        };
        let cm = match (cfg.provider, cfg.cm_transport) {
            (ProviderKind::Soft, None) | (_, Some(CmTransport::Qp1)) => 0,
            (_, Some(CmTransport::Udp | CmTransport::Umad)) => MAD_DEVICE,
            (ProviderKind::Verbs, None) | (_, Some(CmTransport::RdmaCm)) => RDMA_CM,
        };
        Self {
            open,
            provider,
            cm,
            event_loop: EVENT_LOOP + TUN,
            control: client_slots::descriptors(control::MAX_CLIENTS),
            metrics: if cfg.metrics_listen.is_some() {
                client_slots::descriptors(metrics::MAX_CLIENTS)
            } else {
                0
            },
            other: usize::from(notify) + TRANSIENT,
            workers: {
                let others = usize::from(cfg.workers.get()) - 1;
                let worker_provider = match cfg.provider {
                    ProviderKind::Soft => SoftProvider::descriptors(false, 0),
                    ProviderKind::Verbs => VERBS_DEVICE,
                };
                others * (worker_provider + WORKER_LOOP) + usize::from(others > 0)
            },
        }
    }

    /// All of them.
    pub fn total(&self) -> usize {
        self.open
            + self.provider
            + self.cm
            + self.event_loop
            + self.control
            + self.metrics
            + self.other
            + self.workers
    }

    /// The parts, for the log and the error.
    pub fn breakdown(&self) -> String {
        let mut parts = vec![
            format!("{} open at start", self.open),
            format!("{} provider", self.provider),
        ];
        if self.cm > 0 {
            parts.push(format!("{} CM", self.cm));
        }
        parts.push(format!("{} event loop and TUN", self.event_loop));
        parts.push(format!(
            "{} control socket with {} clients",
            self.control,
            control::MAX_CLIENTS
        ));
        if self.metrics > 0 {
            parts.push(format!(
                "{} metrics listener with {} clients",
                self.metrics,
                metrics::MAX_CLIENTS
            ));
        }
        if self.workers > 0 {
            parts.push(format!("{} other workers", self.workers));
        }
        parts.push(format!("{} other", self.other));
        parts.join(", ")
    }
}

/// The IP multicast groups the software provider joins on the underlay (a socket each): the
/// groups of the UD QP's MGIDs on `--bind`'s family.
fn multicast_groups(cfg: &Config) -> usize {
    let mut groups: Vec<_> = cfg
        .endpoint_config(PathMtu::Mtu4096, 0)
        .ud_groups()
        .into_iter()
        .filter_map(|g| crate::soft::multicast_group_addr(g, cfg.bind))
        .collect();
    groups.sort_unstable();
    groups.dedup();
    groups.len()
}

#[cfg(test)]
mod tests {
    use super::super::tests::config;
    use super::*;

    #[test]
    fn the_defaults_need_the_control_clients_and_a_few_more() {
        let need = FdNeed::of(&config(""), 3, false);
        // The socket, the group poll and the one IPv4 group of every MGID.
        assert_eq!(need.provider, 3);
        assert_eq!(need.cm, 0);
        assert_eq!(need.control, control::MAX_CLIENTS + 3);
        assert_eq!(need.total(), 3 + 3 + 5 + 67 + 2);
        assert_eq!(
            need.breakdown(),
            "3 open at start, 3 provider, 5 event loop and TUN, 67 control socket with 64 \
             clients, 2 other"
        );
    }

    /// Every other worker has its socket, poll, wake-up and TUN queue; control its wake-up.
    #[test]
    fn each_worker_adds_its_socket_loop_and_queue() {
        let one = FdNeed::of(&config(""), 3, false);
        let four = FdNeed::of(&config("workers = 4\n"), 3, false);
        assert_eq!(one.workers, 0);
        assert_eq!(four.workers, 3 * (1 + WORKER_LOOP) + 1);
        assert_eq!(four.total(), one.total() + 13);
        assert!(
            four.breakdown().contains("13 other workers"),
            "{}",
            four.breakdown()
        );
    }

    #[test]
    fn groups_metrics_the_cm_and_systemd_add_theirs() {
        // On IPv6 each MGID is its own group: broadcast, all-nodes, two solicited-node.
        let v6 = config(
            "bind = \"2001:db8:18::1\"\naddr = [\"2001:db8:19::1/64\", \"2001:db8:20::1/64\", \
             \"2001:db8:19::2/64\", \"198.19.0.1/24\"]\n",
        );
        let need = FdNeed::of(&v6, 3, false);
        assert_eq!(need.provider, 2 + 4);
        let off = config("no_multicast = true\n");
        assert_eq!(FdNeed::of(&off, 3, false).provider, 1);
        let more = config("metrics_listen = \"127.0.0.1:9464\"\ncm_transport = \"udp\"\n");
        let need = FdNeed::of(&more, 5, true);
        assert_eq!(need.metrics, metrics::MAX_CLIENTS + 3);
        assert_eq!(need.cm, 1);
        assert_eq!(need.other, 3);
        assert_eq!(need.open, 5);
        assert!(need
            .breakdown()
            .contains("19 metrics listener with 16 clients"));
    }
}
