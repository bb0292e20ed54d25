//! The providers the daemon runs on, and what it needs of them beyond [`Provider`]: counters
//! for the status and the underlay peers of the broadcast group.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::status::add_counters;
use crate::soft::provider::SoftProvider;
use crate::soft::SoftVerbs;
use crate::verbs::{Provider, Verbs};

/// What the driver needs of a provider beyond [`Provider`]: its counters for the status.
pub trait DaemonProvider: Provider {
    /// Live QPs as the provider counts them, where it does.
    fn qp_live(&self) -> Option<u64>;
    /// Adds the provider's own counters to the status map.
    fn counters(&self, out: &mut BTreeMap<String, u64>);
    /// Sets the underlay peers the broadcast group is fanned out to; false where the
    /// provider has no such list (hardware multicast needs none).
    fn set_peers(&mut self, peers: &[IpAddr]) -> bool;
    /// The underlay peers first seen, since the last call, whose IPv4 ICRCs check only with a
    /// foreign nonzero IP ID (each handed out once; none where the provider does not check
    /// ICRCs itself).
    fn take_id_solved_peers(&mut self) -> Vec<IpAddr> {
        Vec::new()
    }

    /// The device and port of a native InfiniBand port, whose groups and paths come from the
    /// SA; `None` where there is no SA (RoCE).
    fn sa_port(&self) -> Option<(String, u8)> {
        None
    }

    /// Whether the port raises `CLIENT_REREGISTER` when the SM lost its registrations (an
    /// HCA does, told by the SM); where it cannot (a simulated port, whose SMA keeps no such
    /// bit), the SA client checks its memberships instead.
    fn reports_reregister(&self) -> bool {
        true
    }

    /// The `--bind` link's MTU is `mtu` bytes (at start, and whenever it changes): the
    /// software provider's port carries what fits it; a device reads its port's MTU again
    /// (rxe's follows its netdev). [`Verbs::port_attr`] says the result.
    fn set_link_mtu(&mut self, mtu: u32);

    /// Whether a send was refused as larger than the link since the last call: the link's
    /// MTU may have dropped (the driver reads it again).
    fn take_link_suspect(&mut self) -> bool {
        false
    }

    /// Makes the memory the daemon's buffers can fill the process's from the start: every
    /// buffer pool is written through as it is created (before any buffer is posted), and
    /// the provider's own I/O buffers now. A memory limit that cannot hold them then ends
    /// the daemon at start, not under its first heavy traffic.
    fn commit_memory(&mut self) {
        self.verbs().pools_mut().commit_at_creation();
    }
}

impl DaemonProvider for SoftProvider {
    fn qp_live(&self) -> Option<u64> {
        Some(self.engine().qp_count() as u64)
    }

    fn counters(&self, out: &mut BTreeMap<String, u64>) {
        let engine: &SoftVerbs = self.engine();
        let s = engine.stats();
        add_counters(out, "", &s);
        add_counters(out, "fault_", &s.faults);
        add_counters(out, "mcast_", &self.multicast_stats());
        if engine.config().workers.count() != crate::wire::WorkerCount::ONE {
            add_counters(out, "", &self.steering_stats());
        }
        if let Some(sp) = self.sim_port() {
            add_counters(out, "port_", &sp.counters());
            out.insert("port_io_errors".to_owned(), sp.io_errors);
        }
        for (k, v) in [
            ("send_errors", self.send_errors),
            ("send_too_big", self.send_too_big),
            ("udp_gso", u64::from(self.gso_enabled())),
            ("rx_gro_buffers", self.rx_gro_buffers),
            ("tx_gso_trains", self.tx_gso_trains()),
        ] {
            out.insert(k.to_string(), v);
        }
    }

    fn set_peers(&mut self, peers: &[IpAddr]) -> bool {
        self.verbs().set_mcast_peers(peers.to_vec());
        true
    }

    /// The simulated InfiniBand port's umad device, where the provider has one.
    fn sa_port(&self) -> Option<(String, u8)> {
        self.sim_port().map(crate::soft::sim_port::SimPort::device)
    }

    fn reports_reregister(&self) -> bool {
        self.sim_port().is_none()
    }

    fn take_id_solved_peers(&mut self) -> Vec<IpAddr> {
        self.verbs().take_id_solved_peers()
    }

    fn set_link_mtu(&mut self, mtu: u32) {
        Self::set_link_mtu(self, mtu);
    }

    fn take_link_suspect(&mut self) -> bool {
        Self::take_link_suspect(self)
    }

    fn commit_memory(&mut self) {
        self.verbs().pools_mut().commit_at_creation();
        self.verbs().commit_reorder_hold();
        self.commit_io_buffers();
    }
}

#[cfg(feature = "verbs")]
impl DaemonProvider for crate::hw::HwVerbs {
    fn qp_live(&self) -> Option<u64> {
        Some(self.qp_count() as u64)
    }

    fn counters(&self, out: &mut BTreeMap<String, u64>) {
        add_counters(out, "hw_", &self.stats());
    }

    fn set_peers(&mut self, _peers: &[IpAddr]) -> bool {
        false
    }

    fn sa_port(&self) -> Option<(String, u8)> {
        self.is_infiniband()
            .then(|| (self.device_name().to_owned(), self.port()))
    }

    fn set_link_mtu(&mut self, _mtu: u32) {
        if let Err(e) = self.refresh_port_attr() {
            tracing::warn!(error = %e, "reading the port's MTU again failed");
        }
    }
}
