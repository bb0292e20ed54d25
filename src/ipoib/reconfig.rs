//! Settings of a running [`Endpoint`] that may change without a restart (a configuration
//! reload, a control request, the underlay link): timeouts, budgets, the static neighbours
//! and the path MTU.
//!
//! A changed timeout applies to the timers armed from then on; those already armed keep their
//! deadline. The QP budget cannot grow past the one the endpoint was sized with at
//! [`Endpoint::new`] (its receive buffers and completion queue are sized by it).

use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::event::TxCloseReason;
use super::neigh::{same_endpoint, NeighState};
use super::rx::Why;
use super::{Endpoint, QpBudgetPolicy, TxState};
use crate::verbs::{PathMtu, Verbs};
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

/// Everything of an endpoint a reload changes live: what control's endpoint has, every
/// follower takes ([`Endpoint::live_settings`], [`Endpoint::follow_live_settings`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveSettings {
    /// The timeouts.
    pub timeouts: LiveTimeouts,
    /// [`EndpointConfig::tx_queue_len`](super::EndpointConfig::tx_queue_len).
    pub tx_queue_len: usize,
    /// [`EndpointConfig::max_conn_qp`](super::EndpointConfig::max_conn_qp).
    pub max_conn_qp: usize,
    /// [`EndpointConfig::budget_policy`](super::EndpointConfig::budget_policy).
    pub budget_policy: QpBudgetPolicy,
}

/// What [`Endpoint::set_path_mtu`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathMtuChange {
    /// The path MTU before.
    pub from: PathMtu,
    /// The path MTU now.
    pub to: PathMtu,
    /// TX connections closed to be opened again at the new MTU.
    pub tx_reconnects: usize,
    /// RX connections closed (the peer told, by DREQ) for their peer to connect again.
    pub rx_reconnects: usize,
}

impl Endpoint {
    /// Follows a change of the path MTU (the underlay link's MTU changed): UD sends, new
    /// connections and the REJ 26 of REQs above it use `mtu` from now on, and the connections
    /// whose MTU it changes are set up again at once:
    ///
    /// - a TX connection whose MTU is not what a new one to its peer gets
    ///   (the new MTU, or the lower one the peer asked for) is
    ///   closed, and the packets it queued go to a new connection at the new MTU, in order;
    ///   its sends in flight are lost (the RC sends of a lowered MTU would not cross);
    /// - an RX connection above a lowered MTU, or at the old MTU when it rose (it may have
    ///   been held down by ours), is torn down with a DREQ: its peer connects again, and the
    ///   REJ 26 of a REQ above our MTU names it.
    ///
    /// Returns `None` when `mtu` is the path MTU already.
    pub fn set_path_mtu<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        mtu: PathMtu,
    ) -> Option<PathMtuChange> {
        let from = self.cfg.path_mtu;
        if mtu == from {
            return None;
        }
        self.cfg.path_mtu = mtu;
        self.counters.path_mtu_changes += 1;
        let mut change = PathMtuChange {
            from,
            to: mtu,
            tx_reconnects: 0,
            rx_reconnects: 0,
        };
        for qpn in self.tx.qpns() {
            let Some(tx) = self.tx.get_mut(&qpn) else {
                continue;
            };
            if tx.state == TxState::Closing {
                continue;
            }
            let (hw, conn_mtu) = (tx.peer, tx.path_mtu);
            if conn_mtu == self.path_mtu_to(hw.gid) {
                continue;
            }
            let queued = match self.tx.get_mut(&qpn) {
                Some(tx) => std::mem::take(&mut tx.queue),
                None => continue,
            };
            change.tx_reconnects += 1;
            self.counters.mtu_reconnects += 1;
            self.close_tx(now, v, qpn, TxCloseReason::PathMtuChanged, None);
            for (ethertype, packet) in queued {
                self.send_rc(now, v, hw, ethertype, &packet);
            }
        }
        for qpn in self.rx.qpns() {
            let stale = self.rx.get(&qpn).is_some_and(|r| {
                r.is_live() && (r.path_mtu > mtu || (mtu > from && r.path_mtu == from))
            });
            if stale {
                change.rx_reconnects += 1;
                self.start_rx_teardown(now, v, qpn, Why::PathMtuChanged);
            }
        }
        Some(change)
    }

    /// Sets the timeouts: they apply to the timers armed from now on.
    pub fn set_timeouts(&mut self, t: LiveTimeouts) {
        self.cfg.rx_timeout = t.rx_timeout;
        self.cfg.drain_timeout = t.drain_timeout;
        self.cfg.tx_stall_timeout = t.tx_stall_timeout;
        self.cfg.neigh_timeout = t.neigh_timeout;
    }

    /// What a reload may have changed of this endpoint's settings.
    pub fn live_settings(&self) -> LiveSettings {
        let c = &self.cfg;
        LiveSettings {
            timeouts: LiveTimeouts {
                rx_timeout: c.rx_timeout,
                drain_timeout: c.drain_timeout,
                tx_stall_timeout: c.tx_stall_timeout,
                neigh_timeout: c.neigh_timeout,
            },
            tx_queue_len: c.tx_queue_len,
            max_conn_qp: c.max_conn_qp,
            budget_policy: c.budget_policy,
        }
    }

    /// A follower takes control's live settings. The QP budget is control's, which took it
    /// within what every worker was sized for.
    pub fn follow_live_settings(&mut self, s: LiveSettings) {
        self.set_timeouts(s.timeouts);
        self.set_tx_queue_len(s.tx_queue_len);
        self.set_qp_budget(s.max_conn_qp, s.max_conn_qp, s.budget_policy);
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
