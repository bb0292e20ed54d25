//! A cluster of IPoIB-CM endpoints on the simulated fabric: what the endpoint tests, the soak
//! and the fuzz targets drive.
//!
//! Node `i` has underlay address 198.18.0.(i+1), interface addresses 198.19.0.(i+1)/24 and
//! 2001:db8:19::(i+1)/64. Packets "written to a TUN device" are collected per node. Nodes can
//! be killed (their packets stop and their endpoint vanishes, as after SIGKILL) and restarted
//! with a fresh provider and endpoint.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use etherparse::PacketBuilder;

use super::Fabric;
use crate::ipoib::{Endpoint, EndpointConfig};
use crate::mad::{Gsi, Mad, MadTransport};
use crate::soft::{SoftConfig, SoftVerbs};
use crate::verbs::{Verbs, VerbsError};

/// QPs a node holds once set up: the endpoint's UD QP and QP1 of its CM MAD transport.
pub const BASELINE_QPS: usize = 2;

/// Interface IPv4 address of node `i`.
pub fn node_v4(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 19, 0, u8::try_from(i + 1).unwrap_or(u8::MAX))
}

/// Interface IPv6 address of node `i`.
pub fn node_v6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(
        0x2001,
        0xdb8,
        0x19,
        0,
        0,
        0,
        0,
        u16::try_from(i + 1).unwrap_or(u16::MAX),
    )
}

/// An ICMPv4 echo request from node `from` to node `to` with `payload` bytes.
pub fn ping4(from: usize, to: usize, payload: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = PacketBuilder::ipv4(node_v4(from).octets(), node_v4(to).octets(), 64)
        .icmpv4_echo_request(7, 1)
        .write(&mut out, &vec![0xA5; payload]);
    out
}

/// An ICMPv6 echo request from node `from` to node `to` with `payload` bytes.
pub fn ping6(from: usize, to: usize, payload: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = PacketBuilder::ipv6(node_v6(from).octets(), node_v6(to).octets(), 64)
        .icmpv6_echo_request(7, 1)
        .write(&mut out, &vec![0x5A; payload]);
    out
}

/// Nodes on the fabric, each with an endpoint (or none while killed).
#[derive(Debug)]
pub struct Cluster {
    /// The fabric and its providers.
    pub f: Fabric,
    /// Endpoints; `None` while a node is down.
    pub eps: Vec<Option<Endpoint>>,
    /// Packets each node's TUN device received.
    pub tun: Vec<Vec<Vec<u8>>>,
    /// Nodes whose TUN device is not read while set: what the endpoint delivers stays queued
    /// (up to the endpoint's spare receive buffers; later packets are dropped and counted).
    pub tun_stalled: Vec<bool>,
    /// Nodes whose endpoint is not run while set (a daemon off the CPU): their provider
    /// still answers on the wire, but no completion is polled and no receive buffer comes
    /// back, so their receive queue runs dry (a peer that RNR-NAKs).
    pub ep_frozen: Vec<bool>,
    /// Each node's CM MAD transport (QP1); `None` while the node is down.
    mads: Vec<Option<Gsi>>,
    /// Scratch for received MADs.
    mad_scratch: Vec<Mad>,
    configs: Vec<EndpointConfig>,
    soft: Vec<SoftConfig>,
    restarts: u64,
}

impl Cluster {
    /// `n` nodes; `soft` and `cfg` adjust each node's provider and endpoint configuration
    /// (defaults: rx_timeout 2 s, drain_timeout 1 s).
    ///
    /// # Errors
    /// An endpoint set-up error.
    pub fn new(
        n: usize,
        start: Instant,
        mut soft: impl FnMut(usize, &mut SoftConfig),
        mut cfg: impl FnMut(usize, &mut EndpointConfig),
    ) -> Result<Self, VerbsError> {
        let f = Fabric::with_nodes(n, start, |i, c| soft(i, c));
        let softs: Vec<SoftConfig> = f.nodes.iter().map(|x| *x.config()).collect();
        let mut configs = Vec::with_capacity(n);
        for i in 0..n {
            let mut c = EndpointConfig::new(vec![
                (IpAddr::V4(node_v4(i)), 24),
                (IpAddr::V6(node_v6(i)), 64),
            ]);
            c.seed = i as u64 + 1;
            c.rx_timeout = Duration::from_secs(2);
            c.drain_timeout = Duration::from_secs(1);
            cfg(i, &mut c);
            configs.push(c);
        }
        let mut me = Self {
            f,
            eps: (0..n).map(|_| None).collect(),
            tun: vec![Vec::new(); n],
            tun_stalled: vec![false; n],
            ep_frozen: vec![false; n],
            mads: (0..n).map(|_| None).collect(),
            mad_scratch: Vec::new(),
            configs,
            soft: softs,
            restarts: 0,
        };
        for i in 0..n {
            me.start_node(i)?;
        }
        Ok(me)
    }

    fn peers(&self) -> Vec<IpAddr> {
        self.soft.iter().map(|c| c.local_ip).collect()
    }

    fn start_node(&mut self, i: usize) -> Result<(), VerbsError> {
        let now = self.f.now();
        let peers = self.peers();
        self.f.nodes[i].set_mcast_peers(peers);
        // The engine learns the virtual time before anything is asked of it.
        self.f.nodes[i].handle_timeout(now);
        let mut c = self.configs[i].clone();
        c.seed = c.seed.wrapping_add(self.restarts.wrapping_mul(0x9E37_79B9));
        let gsi = Gsi::open_for_cm(&mut self.f.nodes[i])?;
        let qp1 = MadTransport::<SoftVerbs>::provider_qp(&gsi);
        self.eps[i] = Some(Endpoint::new(now, &mut self.f.nodes[i], c, qp1)?);
        self.mads[i] = Some(gsi);
        Ok(())
    }

    /// The virtual time.
    pub fn now(&self) -> Instant {
        self.f.now()
    }

    /// Node `i`'s endpoint, if it is up.
    pub fn ep(&mut self, i: usize) -> Option<&mut Endpoint> {
        self.eps.get_mut(i).and_then(Option::as_mut)
    }

    /// QPs that exist on node `i`'s provider.
    pub fn qp_live(&self, i: usize) -> usize {
        self.f.nodes[i].qp_count()
    }

    /// Node `i`'s provider's counters (since its last start).
    pub fn soft_stats(&self, i: usize) -> crate::soft::SoftStats {
        self.f.nodes[i].stats()
    }

    /// Lets every endpoint handle its MADs, verbs and timers and collects TUN output.
    pub fn service(&mut self) {
        let now = self.f.now();
        for i in 0..self.eps.len() {
            if self.ep_frozen.get(i).copied().unwrap_or(false) {
                continue;
            }
            if let (Some(ep), Some(gsi)) = (self.eps[i].as_mut(), self.mads[i].as_mut()) {
                let v = &mut self.f.nodes[i];
                super::endpoint_turn(ep, gsi, v, &mut self.mad_scratch, now);
                if self.tun_stalled.get(i).copied().unwrap_or(false) {
                    continue;
                }
                while let Some(p) = ep.poll_tun(&mut self.f.nodes[i]) {
                    self.tun[i].push(p);
                }
            }
        }
    }

    /// Runs for `d` of virtual time.
    pub fn run(&mut self, d: Duration) {
        let end = self.f.now() + d;
        for _ in 0..2_000_000 {
            self.service();
            self.f.transmit();
            let mut next = self.f.next_event();
            for ep in self.eps.iter().flatten() {
                next = match (next, ep.poll_timeout()) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            let now = self.f.now();
            let target = next.unwrap_or(end).max(now).min(end);
            if target >= end && now >= end {
                break;
            }
            // Always advance a little, so a timer's lower-bound wake-up cannot spin.
            let step = target
                .saturating_duration_since(now)
                .max(Duration::from_micros(1));
            self.f.advance(step);
        }
        self.service();
    }

    /// Writes `packet` into node `i`'s TUN device (ignored while the node is down).
    pub fn inject(&mut self, i: usize, packet: &[u8]) {
        let now = self.f.now();
        if let Some(ep) = self.eps[i].as_mut() {
            ep.handle_tun_packet(now, &mut self.f.nodes[i], packet);
        }
    }

    /// As [`inject`](Self::inject), the way the daemon reads its TUN device: into one of the
    /// endpoint's send buffers ([`Endpoint::tun_buffer`]), falling back to `inject` when none
    /// is free or the packet does not fit.
    pub fn inject_via_buffer(&mut self, i: usize, packet: &[u8]) {
        let now = self.f.now();
        let Some(ep) = self.eps[i].as_mut() else {
            return;
        };
        let v = &mut self.f.nodes[i];
        let Some(b) = ep.tun_buffer() else {
            ep.handle_tun_packet(now, v, packet);
            return;
        };
        let room = crate::ipoib::TUN_BUFFER_OFFSET..crate::ipoib::TUN_BUFFER_OFFSET + packet.len();
        match v
            .pools_mut()
            .get_mut(b)
            .ok()
            .and_then(|buf| buf.get_mut(room))
        {
            Some(dst) => {
                dst.copy_from_slice(packet);
                ep.handle_tun_buffer(now, v, b, packet.len());
            }
            None => {
                ep.return_tun_buffer(b);
                ep.handle_tun_packet(now, v, packet);
            }
        }
    }

    /// Node `i` vanishes: its packets stop and its endpoint is gone (as after SIGKILL).
    pub fn kill(&mut self, i: usize) {
        self.f.partitioned[i] = true;
        self.eps[i] = None;
        self.mads[i] = None;
    }

    /// Node `i` comes back with a fresh provider and endpoint (as after a restart).
    ///
    /// # Errors
    /// An endpoint set-up error.
    pub fn restart(&mut self, i: usize) -> Result<(), VerbsError> {
        self.restart_with(i, true)
    }

    /// [`Cluster::restart`], but the new provider numbers its QPs in the old order, as a
    /// daemon restarted with the same `--qpn-seed` does: its first connections reuse the QPNs
    /// its previous incarnation's peers may still hold.
    ///
    /// # Errors
    /// An endpoint set-up error.
    pub fn restart_reusing_qpns(&mut self, i: usize) -> Result<(), VerbsError> {
        self.restart_with(i, false)
    }

    fn restart_with(&mut self, i: usize, new_qpn_order: bool) -> Result<(), VerbsError> {
        self.restarts += 1;
        self.f.partitioned[i] = false;
        // A new process: its QPNs follow another order, as a restarted daemon's do.
        let mut soft = self.soft[i];
        if new_qpn_order {
            soft.qpn_seed = soft.qpn_seed.wrapping_add(self.restarts);
        }
        self.f.nodes[i] = SoftVerbs::new(soft);
        self.start_node(i)
    }

    /// Node `i`'s underlay link MTU becomes `link_mtu` bytes, as the daemon follows it: the
    /// fabric drops the datagrams the link no longer carries, the provider's port MTU and the
    /// endpoint's path MTU become the largest IB MTU that fits
    /// ([`PathMtu::for_link_mtu`](crate::verbs::PathMtu::for_link_mtu)). Returns what the
    /// endpoint changed (`None`: its path MTU stayed, or the node is down).
    pub fn set_link_mtu(
        &mut self,
        i: usize,
        link_mtu: usize,
    ) -> Option<crate::ipoib::PathMtuChange> {
        if let Some(m) = self.f.link_mtu.get_mut(i) {
            *m = Some(link_mtu);
        }
        let mtu = crate::verbs::PathMtu::for_link_mtu(link_mtu)?;
        self.soft[i].port_mtu = mtu;
        self.configs[i].path_mtu = mtu;
        let now = self.f.now();
        let v = &mut self.f.nodes[i];
        v.set_port_mtu(mtu);
        self.eps[i].as_mut()?.set_path_mtu(now, v, mtu)
    }

    /// True if node `i` is up.
    pub fn is_up(&self, i: usize) -> bool {
        self.eps.get(i).is_some_and(Option::is_some)
    }
}
