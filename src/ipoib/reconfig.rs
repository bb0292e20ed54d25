//! Settings of a running [`Endpoint`] that may change without a restart (a configuration
//! reload, a control request): timeouts, budgets and the static neighbours.
//!
//! A changed timeout applies to the timers armed from then on; those already armed keep their
//! deadline. The QP budget cannot grow past the one the endpoint was sized with at
//! [`Endpoint::new`] (its receive buffers and completion queue are sized by it).

use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::neigh::{same_endpoint, NeighState};
use super::{Endpoint, QpBudgetPolicy};
use crate::verbs::Verbs;
use crate::wire::ipoib::{HwAddr, ETHERTYPE_IPV4, ETHERTYPE_IPV6};

/// The timeouts of an endpoint that can change live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveTimeouts {
    /// [`EndpointConfig::rx_timeout`](super::EndpointConfig::rx_timeout).
    pub rx_timeout: Duration,
    /// [`EndpointConfig::drain_timeout`](super::EndpointConfig::drain_timeout).
    pub drain_timeout: Duration,
    /// [`EndpointConfig::tx_stall_timeout`](super::EndpointConfig::tx_stall_timeout).
    pub tx_stall_timeout: Duration,
    /// [`EndpointConfig::neigh_timeout`](super::EndpointConfig::neigh_timeout).
    pub neigh_timeout: Duration,
}

impl Endpoint {
    /// Sets the timeouts; see the [module documentation](self).
    pub fn set_timeouts(&mut self, t: LiveTimeouts) {
        self.cfg.rx_timeout = t.rx_timeout;
        self.cfg.drain_timeout = t.drain_timeout;
        self.cfg.tx_stall_timeout = t.tx_stall_timeout;
        self.cfg.neigh_timeout = t.neigh_timeout;
    }

    /// Sets the packets queued per neighbour while it connects (at least 1).
    pub fn set_tx_queue_len(&mut self, len: usize) {
        self.cfg.tx_queue_len = len.max(1);
    }

    /// Sets the connected-mode QP budget and what happens when it is spent. A budget above
    /// `sized_for` (the one the endpoint was created with) is refused: returns false and
    /// changes nothing. Connections beyond a lowered budget stay until they close.
    pub fn set_qp_budget(
        &mut self,
        max_conn_qp: usize,
        sized_for: usize,
        policy: QpBudgetPolicy,
    ) -> bool {
        if max_conn_qp == 0 || max_conn_qp > sized_for {
            return false;
        }
        self.cfg.max_conn_qp = max_conn_qp;
        self.cfg.budget_policy = policy;
        true
    }

    /// Makes `ip` a static neighbour at `hw`, replacing whatever entry it had: packets that
    /// waited for its resolution go out to `hw`; the TX connection to a learned address it
    /// replaces closes if no other neighbour uses it.
    pub fn add_static_neighbour<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        ip: IpAddr,
        hw: HwAddr,
    ) {
        let old = self.neigh.remove(&ip);
        self.neigh.add_static(ip, hw, now);
        self.cfg.static_neighbours.retain(|(i, _)| *i != ip);
        self.cfg.static_neighbours.push((ip, hw));
        let Some(old) = old else {
            return;
        };
        if let Some(t) = old.timer {
            self.wheel.cancel(t);
        }
        let ethertype = if ip.is_ipv4() {
            ETHERTYPE_IPV4
        } else {
            ETHERTYPE_IPV6
        };
        for p in old.queue {
            self.send_ip(now, v, hw, ethertype, &p);
        }
        if let Some(was) = old.hw.filter(|h| !same_endpoint(h, &hw)) {
            self.close_unused_tx(now, v, was);
        }
    }

    /// Removes the static neighbour `ip`; its TX connection closes if no other neighbour uses
    /// its address. Returns false (and changes nothing) when `ip` is no static neighbour.
    pub fn remove_static_neighbour<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        ip: IpAddr,
    ) -> bool {
        if self.neigh.get(&ip).map(|n| n.state) != Some(NeighState::Static) {
            return false;
        }
        let old = self.neigh.remove(&ip);
        self.cfg.static_neighbours.retain(|(i, _)| *i != ip);
        if let Some(hw) = old.and_then(|n| n.hw) {
            self.close_unused_tx(now, v, hw);
        }
        true
    }

    /// Closes the TX connection to `hw` unless a neighbour still has that address.
    fn close_unused_tx<V: Verbs>(&mut self, now: Instant, v: &mut V, hw: HwAddr) {
        let used = self
            .neigh
            .iter()
            .any(|(_, n)| n.hw.is_some_and(|h| same_endpoint(&h, &hw)));
        if used {
            return;
        }
        if let Some(qpn) = self.tx.to_peer(hw) {
            self.close_tx(now, v, qpn);
        }
    }
}
