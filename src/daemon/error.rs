//! Why `ipoib-cm up` could not run: one line naming the flag or step, and its exit status.

use std::io;
use std::net::{IpAddr, SocketAddr};

use super::config::Cidr;
use crate::driver::workers::WorkerError;
use crate::driver::NodeError;
use crate::wire::WorkerCount;

/// Why the daemon could not run. Its `Display` is the one line to print, naming the flag or
/// step that failed; exit with [`DaemonError::exit_code`].
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// No local interface has the `--bind` address.
    #[error("--bind {0}: no local interface has this address")]
    NoBindInterface(IpAddr),
    /// The software provider's UDP socket could not be bound.
    #[error("--bind {addr}:{port}: {source}")]
    Bind {
        /// The underlay address.
        addr: IpAddr,
        /// The RoCEv2 UDP port.
        port: u16,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The libibverbs device could not be opened.
    #[cfg(feature = "verbs")]
    #[error("--provider verbs: {0}")]
    VerbsOpen(#[source] crate::hw::HwError),
    /// `--provider verbs` in a build without the `verbs` feature.
    #[cfg(not(feature = "verbs"))]
    #[error("--provider verbs: no RDMA device: built without the `verbs` feature")]
    VerbsNotBuilt,
    /// The umad CM transport could not be opened (`ib_cm` loaded, no umad device, ...).
    #[error("--cm-transport umad: {0}")]
    Umad(#[source] crate::mad::UmadError),
    /// `--provider verbs` without `--cm-transport`: neither the kernel's CM nor umad is usable.
    #[error("no CM transport on this host ({0}): load rdma_ucm, or pass --cm-transport udp (the side channel, for peers that run it too)")]
    NoCmTransport(String),
    /// `--cm-transport umad` on the software provider, which owns its QP1 itself.
    #[error("--cm-transport umad: needs --provider verbs (the soft provider carries CM MADs on its own QP1: qp1)")]
    UmadNeedsVerbs,
    /// `--cm-transport udp` with `--link-layer infiniband`: an IB port's GIDs are no
    /// underlay addresses.
    #[error("--cm-transport udp: not with --link-layer infiniband (its GIDs are no underlay addresses; the CM runs on the port's QP1: qp1)")]
    SideChannelOnIb,
    /// The simulated InfiniBand port could not be read.
    #[error("--link-layer infiniband: {0} (run under ibsim's umad2sim: LD_PRELOAD=libumad2sim.so SIM_HOST=NODE)")]
    SimPort(#[source] crate::soft::sim_port::SimPortError),
    /// The CM MAD side channel's socket could not be bound.
    #[error("--mad-port {addr}:{port}: {source}")]
    MadPort {
        /// The underlay address.
        addr: IpAddr,
        /// The side channel's UDP port.
        port: u16,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The endpoint's QPs, CQs and buffers could not be set up on the provider.
    #[error("provider set-up: {0}")]
    Endpoint(#[source] crate::verbs::VerbsError),
    /// The SA client of an InfiniBand port could not be set up (its umad device).
    #[error("--ib-dev {ca} port {port}: SA client: {source}")]
    Sa {
        /// The device.
        ca: String,
        /// The port.
        port: u8,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The kernel's CM could not be opened or could not listen (`--cm-transport rdmacm`).
    #[error("--cm-transport rdmacm (--bind, --rdma-cm-port {}): {message}", addr.port())]
    RdmaCm {
        /// The listen address.
        addr: SocketAddr,
        /// Why, one line.
        message: String,
    },
    /// `--cm-transport rdmacm` on the software provider (its QPs are not the kernel's).
    #[error("--cm-transport rdmacm: needs --provider verbs (the kernel's CM connects kernel QPs)")]
    RdmaCmNeedsVerbs,
    /// The TUN device could not be created.
    #[error("--ifname: {0}")]
    Tun(#[source] io::Error),
    /// The interface MTU could not be set.
    #[error("interface MTU: {0}")]
    InterfaceMtu(#[source] io::Error),
    /// An interface address could not be added.
    #[error("--addr {addr}: {source}")]
    Addr {
        /// The address.
        addr: Cidr,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The interface could not be brought up.
    #[error("interface up: {0}")]
    InterfaceUp(#[source] io::Error),
    /// The control socket could not be bound.
    #[error("--control-socket {}: {source}", path.display())]
    ControlSocket {
        /// The socket path.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The metrics listener could not be bound.
    #[error("--metrics-listen {addr}: {}", super::config::os_message(source))]
    MetricsListen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `--workers` above 1 with a setting it does not run with yet.
    #[error("--workers {workers}: {needs}")]
    WorkersNeed {
        /// The worker count.
        workers: WorkerCount,
        /// What it needs, one line.
        needs: &'static str,
    },
    /// A worker thread failed, or stalled: the daemon does not run with part of its
    /// connections unserved.
    #[error("{0}")]
    Worker(#[from] WorkerError),
    /// The event loop failed.
    #[error("event loop: {0}")]
    Io(#[from] io::Error),
    /// The device context was lost and could not be opened again
    /// ([`REOPEN_MAX_FAILURES`](crate::driver::REOPEN_MAX_FAILURES) tries in a row failed);
    /// the service manager's restart is the next try.
    #[error("{0}")]
    DeviceLost(String),
}

impl DaemonError {
    /// [`DaemonError::exit_code`] of a device lost for good: `Restart=on-failure` restarts
    /// the daemon.
    pub const DEVICE_LOST_EXIT: u8 = 3;

    /// The process exit code: 2 for a set-up step that failed (the configuration does not fit
    /// this host), 1 for a failure of the running loop, [`Self::DEVICE_LOST_EXIT`] for a
    /// device lost for good.
    pub const fn exit_code(&self) -> u8 {
        match self {
            Self::DeviceLost(_) | Self::Worker(WorkerError::DeviceLost { .. }) => {
                Self::DEVICE_LOST_EXIT
            }
            Self::Io(_) | Self::Worker(_) => 1,
            _ => 2,
        }
    }
}

impl From<NodeError> for DaemonError {
    /// The node's set-up step, named by the flag that configures it.
    fn from(e: NodeError) -> Self {
        match e {
            NodeError::MadBind { addr, source } => Self::MadPort {
                addr: addr.ip(),
                port: addr.port(),
                source,
            },
            NodeError::Provider(e) => Self::Endpoint(e),
            NodeError::RdmaCm { addr, message } => Self::RdmaCm { addr, message },
            NodeError::Tun(e) => Self::Tun(e),
            NodeError::InterfaceMtu(e) => Self::InterfaceMtu(e),
            NodeError::Addr {
                addr,
                prefix_len,
                source,
            } => Self::Addr {
                addr: Cidr { addr, prefix_len },
                source,
            },
            NodeError::InterfaceUp(e) => Self::InterfaceUp(e),
            NodeError::Register(e) => Self::Io(e),
            NodeError::TransportNeedsCaller(_) => Self::UmadNeedsVerbs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::metrics::MetricsServer;
    use crate::driver::workers::WorkerError;
    use crate::driver::NodeError;
    use crate::wire::WorkerCount;
    use std::net::IpAddr;
    use std::net::Ipv4Addr;

    fn boom() -> io::Error {
        io::Error::other("boom")
    }

    #[test]
    fn a_failed_worker_is_exit_status_1_and_a_worker_count_that_cannot_run_2() {
        let failed = DaemonError::Worker(WorkerError::Panicked(1));
        assert_eq!(
            (failed.exit_code(), failed.to_string().as_str()),
            (1, "worker 1: panicked")
        );
        let refused = DaemonError::WorkersNeed {
            workers: WorkerCount::new(2).unwrap(),
            needs: "needs connected mode",
        };
        assert_eq!(refused.exit_code(), 2);
        assert_eq!(refused.to_string(), "--workers 2: needs connected mode");
    }

    #[test]
    fn a_node_set_up_error_names_the_flag_that_configures_the_step() {
        let bind = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1));
        let cases = [
            (
                NodeError::MadBind {
                    addr: SocketAddr::new(bind, 4792),
                    source: boom(),
                },
                "--mad-port 198.18.0.1:4792: boom",
                2,
            ),
            (NodeError::Tun(boom()), "--ifname: boom", 2),
            (NodeError::InterfaceMtu(boom()), "interface MTU: boom", 2),
            (
                NodeError::Addr {
                    addr: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
                    prefix_len: 24,
                    source: boom(),
                },
                "--addr 10.0.0.1/24: boom",
                2,
            ),
            (NodeError::InterfaceUp(boom()), "interface up: boom", 2),
            (NodeError::Register(boom()), "event loop: boom", 1),
        ];
        for (node, line, code) in cases {
            let e = DaemonError::from(node);
            assert_eq!(e.to_string(), line);
            assert_eq!(e.exit_code(), code, "{line}");
        }
    }

    #[test]
    fn a_device_lost_for_good_exits_3_with_its_line() {
        let e = DaemonError::DeviceLost(
            "device context lost and 64 reopens failed; last: no device".to_owned(),
        );
        assert_eq!(
            e.to_string(),
            "device context lost and 64 reopens failed; last: no device"
        );
        assert_eq!(e.exit_code(), DaemonError::DEVICE_LOST_EXIT);
        assert_eq!(DaemonError::DEVICE_LOST_EXIT, 3);
    }

    #[test]
    fn a_metrics_address_that_cannot_be_bound_names_the_flag() {
        let held = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = held.local_addr().unwrap();
        let e = MetricsServer::bind(addr)
            .map(|_| ())
            .map_err(|source| DaemonError::MetricsListen { addr, source })
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("--metrics-listen {addr}: Address already in use")
        );
        assert_eq!(e.exit_code(), 2);
    }
}
