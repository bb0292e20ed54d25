//! The node's interface and path MTU while it runs: the path MTU follows the underlay link
//! ([`Node::set_path_mtu`]; in datagram mode the interface MTU with it), and the interface's
//! configured addresses outlive `ip link set IFNAME down` (its IPv6 ones are kept by
//! `keep_addr_on_down`, and whatever is missing when it comes up again, or at a reload, is
//! put back: [`Node::check_interface`], [`Node::restore_addresses`]).

use std::net::IpAddr;
use std::time::Instant;

use super::Node;
use crate::ipoib::PathMtuChange;
use crate::sys::ifaddr;
use crate::verbs::{PathMtu, Provider};

impl<P: Provider> Node<P> {
    /// Follows a new path MTU (the underlay link's MTU changed): the endpoint sets up again
    /// the connections it concerns ([`Endpoint::set_path_mtu`]), what that sends leaves at
    /// [`Node::flush`], and in datagram mode the interface MTU follows. `None` when the
    /// path MTU was `mtu` already (or the device is down: the endpoint built on its return
    /// takes the MTU then).
    ///
    /// [`Endpoint::set_path_mtu`]: crate::ipoib::Endpoint::set_path_mtu
    pub fn set_path_mtu(&mut self, now: Instant, mtu: PathMtu) -> Option<PathMtuChange> {
        if self.down.is_some() {
            return None;
        }
        let change = self.reconfigure(now, |ep, v| ep.set_path_mtu(now, v, mtu));
        self.sync_tun_mtu("the path MTU");
        self.log_events(now);
        change
    }

    /// Whether the port became active since the last call (`IBV_EVENT_PORT_ACTIVE`): the
    /// caller reads its MTU again ([`Node::set_path_mtu`]).
    pub fn take_port_active(&mut self) -> bool {
        std::mem::take(&mut self.port_active)
    }

    /// Sets the interface MTU to the endpoint's where they differ (`why` names what changed
    /// it in the log line).
    pub(super) fn sync_tun_mtu(&mut self, why: &str) {
        let mtu = self.ep.interface_mtu();
        if mtu == self.tun_mtu {
            return;
        }
        match self.tun.set_mtu(mtu) {
            Ok(()) => {
                tracing::info!(mtu, "interface MTU {} -> {mtu} from {why}", self.tun_mtu);
                self.tun_mtu = mtu;
            }
            Err(e) => tracing::warn!(mtu, error = %e, "could not set the interface MTU"),
        }
    }

    /// Looks at the interface as it is now (a link or an address changed somewhere): when it
    /// came up again after being down, the configured addresses it lost are put back. One log
    /// line when it went down, one when it came back.
    pub fn check_interface(&mut self) {
        let up = ifaddr::link_info(self.tun.name()).is_ok_and(|l| l.up);
        if up == self.tun_up {
            return;
        }
        self.tun_up = up;
        if !up {
            tracing::warn!(
                "interface {} is down: nothing is read from or written to it until it is up",
                self.tun.name()
            );
            return;
        }
        let restored = self.restore_addresses();
        tracing::info!(
            "interface {} is up again{}",
            self.tun.name(),
            describe_restored(&restored)
        );
    }

    /// Puts back every configured address the interface lacks (deleted by hand, or lost
    /// while it was down); returns those put back. One that the kernel refuses is logged.
    pub fn restore_addresses(&mut self) -> Vec<(IpAddr, u8)> {
        let name = self.tun.name().to_owned();
        let present: Vec<IpAddr> = ifaddr::addresses()
            .into_iter()
            .filter(|a| a.name == name)
            .map(|a| a.addr)
            .collect();
        let mut restored = Vec::new();
        for &(addr, prefix_len) in &self.ep.config().addrs {
            if present.contains(&addr) {
                continue;
            }
            let r = match addr {
                IpAddr::V4(a) => self.tun.add_ipv4(a, prefix_len),
                IpAddr::V6(a) => self.tun.add_ipv6(a, prefix_len),
            };
            match r {
                Ok(()) => restored.push((addr, prefix_len)),
                Err(e) => {
                    tracing::warn!("interface {name}: could not put back {addr}/{prefix_len}: {e}")
                }
            }
        }
        restored
    }
}

/// `; addresses put back: A/N, B/M` (empty when none).
fn describe_restored(restored: &[(IpAddr, u8)]) -> String {
    if restored.is_empty() {
        return String::new();
    }
    format!("; addresses put back: {}", addr_list(restored))
}

/// Addresses with their prefix lengths as a log line lists them: `A/N, B/M`.
#[must_use]
pub fn addr_list(addrs: &[(IpAddr, u8)]) -> String {
    let list: Vec<String> = addrs.iter().map(|(a, p)| format!("{a}/{p}")).collect();
    list.join(", ")
}
