//! Settings of a running [`Endpoint`] that may change without a restart (a configuration
//! reload, a control request): timeouts, budgets and the static neighbours.
//!
//! A changed timeout applies to the timers armed from then on; those already armed keep their
//! deadline. The QP budget cannot grow past the one the endpoint was sized with at
//! [`Endpoint::new`] (its receive buffers and completion queue are sized by it).

use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::event::TxCloseReason;
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
    /// Sets the timeouts: they apply to the timers armed from now on.
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
        let was = old.hw().filter(|h| !same_endpoint(h, &hw));
        for p in old.into_queue() {
            self.send_ip(now, v, hw, ethertype, &p);
        }
        if let Some(was) = was {
            self.close_unused_tx(now, v, was, ip);
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
        if self.neigh.get(&ip).map(|n| n.state()) != Some(NeighState::Static) {
            return false;
        }
        let old = self.neigh.remove(&ip);
        self.cfg.static_neighbours.retain(|(i, _)| *i != ip);
        if let Some(hw) = old.and_then(|n| n.hw()) {
            self.close_unused_tx(now, v, hw, ip);
        }
        true
    }

    /// Closes the TX connection to `hw` (the address the static neighbour `ip` had) unless a
    /// neighbour still has that address.
    fn close_unused_tx<V: Verbs>(&mut self, now: Instant, v: &mut V, hw: HwAddr, ip: IpAddr) {
        let used = self
            .neigh
            .iter()
            .any(|(_, n)| n.hw().is_some_and(|h| same_endpoint(&h, &hw)));
        if used {
            return;
        }
        if let Some(qpn) = self.tx.to_peer(hw) {
            self.close_tx(now, v, qpn, TxCloseReason::NeighbourChanged, Some(ip));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::cluster::{node_v4, ping4, Cluster};

    #[test]
    fn a_static_neighbour_added_live_connects_and_its_removal_closes_the_connection() {
        let mut n = Cluster::new(2, Instant::now(), |_, _| {}, |_, _| {}).unwrap();
        let hw1 = n.ep(1).unwrap().hwaddr();
        let ip1 = IpAddr::V4(node_v4(1));
        let now = n.now();
        let (ep, v) = (n.eps[0].as_mut().unwrap(), &mut n.f.nodes[0]);
        ep.add_static_neighbour(now, v, ip1, hw1);
        assert_eq!(ep.config().static_neighbours, [(ip1, hw1)]);
        n.inject(0, &ping4(0, 1, 100));
        n.run(Duration::from_millis(100));
        assert_eq!(n.tun[1].len(), 1);
        let ep = n.ep(0).unwrap();
        assert_eq!(ep.counters().tx_established, 1);
        let neighbours = n.ep(0).unwrap().snapshot(now).neighbours;
        assert_eq!(neighbours, [(ip1, Some(hw1), NeighState::Static)]);

        let now = n.now();
        let (ep, v) = (n.eps[0].as_mut().unwrap(), &mut n.f.nodes[0]);
        assert!(!ep.remove_static_neighbour(now, v, IpAddr::V4(node_v4(9))));
        assert!(ep.remove_static_neighbour(now, v, ip1));
        assert!(ep.config().static_neighbours.is_empty());
        n.run(Duration::from_millis(100));
        assert_eq!(n.ep(0).unwrap().tx_count(), 0, "the connection closed");
        assert_eq!(n.ep(1).unwrap().rx_count(), 0, "the peer saw the DREQ");
    }

    #[test]
    fn the_budget_cannot_grow_past_what_the_endpoint_was_sized_for() {
        let mut n = Cluster::new(1, Instant::now(), |_, _| {}, |_, _| {}).unwrap();
        let ep = n.ep(0).unwrap();
        let sized = ep.config().max_conn_qp;
        assert!(!ep.set_qp_budget(sized + 1, sized, QpBudgetPolicy::Reject));
        assert!(!ep.set_qp_budget(0, sized, QpBudgetPolicy::Reject));
        assert_eq!(ep.config().budget_policy, QpBudgetPolicy::Evict);
        assert!(ep.set_qp_budget(sized / 2, sized, QpBudgetPolicy::Reject));
        assert_eq!(
            (ep.config().max_conn_qp, ep.config().budget_policy),
            (sized / 2, QpBudgetPolicy::Reject)
        );
        ep.set_tx_queue_len(0);
        assert_eq!(ep.config().tx_queue_len, 1);
        let t = LiveTimeouts {
            rx_timeout: Duration::from_secs(7),
            drain_timeout: Duration::from_secs(2),
            tx_stall_timeout: Duration::from_secs(3),
            neigh_timeout: Duration::from_secs(9),
        };
        ep.set_timeouts(t);
        let c = ep.config();
        assert_eq!(
            (
                c.rx_timeout,
                c.drain_timeout,
                c.tx_stall_timeout,
                c.neigh_timeout
            ),
            (
                t.rx_timeout,
                t.drain_timeout,
                t.tx_stall_timeout,
                t.neigh_timeout
            )
        );
    }
}
