//! Restarts of a peer, seen at once: every connection to or from an earlier incarnation of a
//! node is closed as soon as a later one is known, instead of when its retries run out
//! (TX) or it goes stale (RX).
//!
//! An incarnation is what a node draws anew at each start: its CA GUID (carried by every
//! REQ and REP) and its UD QPN (carried by its hardware address in ARP/ND and by the
//! IPoIB-CM private data of its REQs and REPs; random per process on the software provider).
//! Two signals say that the node at a GID restarted:
//!
//! - a REQ from that GID with another CA GUID or UD QPN than a connection we hold for it.
//!   Acting on the REQ alone would let one forged packet tear connections down, so the REQ
//!   only marks its RX connection; the old incarnation's connections are closed when that
//!   connection is established (RTU or first data). Our REP went to the GID's own underlay
//!   address with a fresh comm id, QPN and PSN, so a sender that is not at that address never
//!   sees what establishing needs.
//! - an ARP/ND message from the peer's own address and UDP source port with a new UD QPN
//!   (the neighbour cache's `Learned::Replaced`; see `resolve.rs` for the source check).
//!
//! Either way the old incarnation's TX connections close (their neighbours are forgotten, so
//! the next packet resolves the new hardware address) and its RX connections are torn down.
//! So that peers hear of a restart before they next send, a new endpoint announces itself
//! ([`Endpoint::announce`]).

use std::net::IpAddr;
use std::time::Instant;

use super::event::{Event, TxCloseReason};
use super::Endpoint;
use crate::verbs::{Gid, QpNum, Verbs};
use crate::wire::ipoib::{
    mgid_for_ipv6, HwAddr, IpoibArp, NeighborAdvertisement, ALL_NODES_MULTICAST, ETHERTYPE_ARP,
    ETHERTYPE_IPV6,
};

/// One start of a node: its UD QPN and, when known, its CA GUID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Incarnation {
    /// The UD QPN of its hardware address.
    pub(super) ud_qpn: QpNum,
    /// Its CA GUID (from a REQ or REP; ARP/ND do not carry it).
    pub(super) ca_guid: Option<u64>,
}

impl Incarnation {
    /// True when a connection of `(ud_qpn, ca_guid)` belongs to another start than `self`:
    /// the UD QPNs differ, or both CA GUIDs are known and differ.
    fn is_other(&self, ud_qpn: Option<QpNum>, ca_guid: Option<u64>) -> bool {
        let qpn_differs = ud_qpn.is_some_and(|q| q != self.ud_qpn);
        let guid_differs = matches!((self.ca_guid, ca_guid), (Some(a), Some(b)) if a != b);
        qpn_differs || guid_differs
    }
}

impl Endpoint {
    /// Announces this incarnation's hardware address: a gratuitous ARP request (RFC 5227
    /// §3) for each IPv4 address and an unsolicited Neighbor Advertisement to all-nodes
    /// (RFC 4861 §7.2.6) for each IPv6 address. A neighbour that maps the address to an
    /// earlier incarnation replaces the mapping and closes that incarnation's connections;
    /// one that does not know the address ignores it (neither message creates an entry).
    pub(super) fn announce<V: Verbs>(&mut self, v: &mut V) {
        let addrs: Vec<IpAddr> = self.cfg.addrs.iter().map(|(ip, _)| *ip).collect();
        for ip in addrs {
            match ip {
                IpAddr::V4(a) => {
                    let mut bytes = [0u8; IpoibArp::LEN];
                    IpoibArp::request(self.hwaddr, a, a).emit(&mut bytes);
                    let bcast = self.cfg.broadcast_hwaddr();
                    self.send_ud(v, bcast, ETHERTYPE_ARP, &bytes);
                }
                IpAddr::V6(a) => {
                    let na = NeighborAdvertisement {
                        src: a,
                        dst: ALL_NODES_MULTICAST,
                        target: a,
                        router: false,
                        solicited: false,
                        override_flag: true,
                        target_hw: Some(self.hwaddr),
                    };
                    let to =
                        HwAddr::multicast(mgid_for_ipv6(ALL_NODES_MULTICAST, self.cfg.mgid_pkey()));
                    let packet = na.to_packet();
                    self.send_ud(v, to, ETHERTYPE_IPV6, &packet);
                }
            }
        }
    }

    /// The open TX and live RX connections of `gid` that belong to another incarnation than
    /// `inc`, not counting the RX connection `except`.
    fn other_incarnations(
        &self,
        gid: Gid,
        inc: Incarnation,
        except: Option<QpNum>,
    ) -> (Vec<QpNum>, Vec<QpNum>) {
        let tx = self
            .tx
            .to_node(gid)
            .into_iter()
            .filter(|q| {
                self.tx
                    .get(q)
                    .is_some_and(|t| inc.is_other(Some(t.peer.qpn), t.remote_ca_guid))
            })
            .collect();
        let rx = self
            .rx
            .iter()
            .filter(|(q, r)| {
                Some(**q) != except
                    && r.peer == gid
                    && r.is_live()
                    && inc.is_other(r.remote_ud_qpn, Some(r.remote_ca_guid))
            })
            .map(|(q, _)| *q)
            .collect();
        (tx, rx)
    }

    /// True when we hold a connection for `gid` from another incarnation than `inc` (a REQ
    /// from `inc` then announces a restart, acted on once its connection is established).
    pub(super) fn holds_other_incarnation(&self, gid: Gid, inc: Incarnation) -> bool {
        let (tx, rx) = self.other_incarnations(gid, inc, None);
        !tx.is_empty() || !rx.is_empty()
    }

    /// The RX connection `qpn` is established: if its REQ announced a restart, the node's
    /// other incarnations' connections go now; then it is charged to the QP budget.
    pub(super) fn on_rx_established<V: Verbs>(&mut self, now: Instant, v: &mut V, qpn: QpNum) {
        let Some(mut r) = self.rx.get_mut(&qpn) else {
            return;
        };
        r.established = true;
        let restart = std::mem::take(&mut r.announces_restart)
            .then_some(r.remote_ud_qpn)
            .flatten()
            .map(|ud_qpn| {
                let inc = Incarnation {
                    ud_qpn,
                    ca_guid: Some(r.remote_ca_guid),
                };
                (r.peer, inc)
            });
        drop(r);
        // The old incarnation's connections go first: they no longer count against the
        // budget the new one is charged to.
        if let Some((peer, inc)) = restart {
            self.retire_old_incarnations(now, v, peer, inc, Some(qpn));
            // A follower's connections are not all of the node's: control closes its own and
            // forgets the old incarnation's neighbours, and the other workers follow its view.
            self.tell_restarted(peer, inc);
        }
        self.charge_rx_budget(now, v, qpn);
    }

    /// The node at `gid` restarted and is now `inc`: closes every TX connection to and tears
    /// down every RX connection from its other incarnations (the RX connection `except`,
    /// the new one, stays). Counts one `peer_restarts` when anything was closed.
    pub(super) fn retire_old_incarnations<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        gid: Gid,
        inc: Incarnation,
        except: Option<QpNum>,
    ) {
        let (tx, rx) = self.other_incarnations(gid, inc, except);
        if tx.is_empty() && rx.is_empty() {
            return;
        }
        self.counters.peer_restarts += 1;
        let old_qpn = tx
            .first()
            .and_then(|q| self.tx.get(q))
            .map(|t| t.peer.qpn)
            .or_else(|| {
                rx.first()
                    .and_then(|q| self.rx.get(q))
                    .and_then(|r| r.remote_ud_qpn)
            });
        self.push_event(Event::PeerRestarted {
            peer: self.event_peer(gid, inc.ud_qpn),
            old_qpn,
        });
        for q in tx {
            let old = self.tx.get(&q).map(|t| t.peer);
            // Closed before its neighbours are forgotten, so that the line names the peer's IP.
            self.close_tx(now, v, q, TxCloseReason::PeerRestarted, None);
            if let Some(old) = old {
                self.neigh.forget_hw(&old);
            }
        }
        for q in rx {
            self.retire_rx(now, v, q);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_qpn_or_another_known_guid_is_another_incarnation() {
        let inc = Incarnation {
            ud_qpn: QpNum::new(0x123),
            ca_guid: Some(7),
        };
        assert!(!inc.is_other(Some(QpNum::new(0x123)), Some(7)));
        assert!(!inc.is_other(Some(QpNum::new(0x123)), None));
        assert!(!inc.is_other(None, None));
        assert!(inc.is_other(Some(QpNum::new(0x124)), Some(7)));
        assert!(inc.is_other(Some(QpNum::new(0x123)), Some(8)));
        assert!(inc.is_other(None, Some(8)));
        let arp = Incarnation {
            ud_qpn: QpNum::new(0x123),
            ca_guid: None,
        };
        assert!(!arp.is_other(Some(QpNum::new(0x123)), Some(8)));
        assert!(arp.is_other(Some(QpNum::new(0x9)), Some(8)));
    }
}
