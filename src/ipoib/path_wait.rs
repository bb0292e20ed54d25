//! Messages held until their destination's PathRecord is known, where an SA client holds the
//! paths (a native InfiniBand port), as kernel ipoib holds them (`neigh_add_path`,
//! `unicast_arp_send`: `IPOIB_MAX_PATH_REC_QUEUE` per path, sent in order by
//! `path_rec_completion`, dropped when the query fails).
//!
//! # Invariants
//!
//! - Where [`Endpoint::uses_sa_groups`] holds, no unicast UD message and no REQ of a new TX
//!   connection leaves for a GID that has no path: the UD send would name DLID 0 and the REQ
//!   carry no LIDs. Such a message is held here ([`Endpoint::hold_for_path`]) and the path
//!   asked for ([`Endpoint::want_path`]). TX connections are opened only once the path is
//!   known, so a REQ always carries the PathRecord's LIDs, SL and MTU.
//! - The path answered ([`Endpoint::set_sa_path`]): what waited for it goes out in the order
//!   it came, through the same send paths as a new message (an IP packet may open the TX
//!   connection then). The query failed ([`Endpoint::path_failed`]), or a port event voided
//!   it: what waited is dropped and counted, and the next message to the GID asks again.
//! - Bounded: [`PATH_QUEUE_LEN`] IP packets and as many ARP/ND replies per GID,
//!   [`PATH_WAIT_MAX`] messages in all (so at most that many GIDs have an entry).
//! - Without an SA (RoCE, the software provider) nothing is held: every GID has its RoCE
//!   path at once.

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use super::Endpoint;
use crate::verbs::{Gid, Verbs};
use crate::wire::ipoib::HwAddr;

/// Most IP packets, and most ARP/ND replies, held for one path: kernel ipoib's
/// `IPOIB_MAX_PATH_REC_QUEUE`.
pub const PATH_QUEUE_LEN: usize = 3;

/// Most messages held for paths in all.
pub const PATH_WAIT_MAX: usize = 256;

/// What a held message is, which decides how it is sent once the path is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Held {
    /// An IP packet from the host: sent as any packet to a resolved neighbour (over its RC
    /// connection, opened then, or over UD).
    Ip,
    /// An ARP reply or Neighbor Advertisement: one UD send.
    Reply,
}

/// One held message.
#[derive(Debug)]
struct Message {
    hw: HwAddr,
    kind: Held,
    ethertype: u16,
    payload: Vec<u8>,
}

/// The messages held per destination GID; see the [module docs](self).
#[derive(Debug, Default)]
pub(super) struct PathWait {
    by_gid: BTreeMap<Gid, VecDeque<Message>>,
    total: usize,
}

impl PathWait {
    /// Holds a message for `hw`'s GID; false (nothing held) at the bound.
    fn hold(&mut self, hw: HwAddr, kind: Held, ethertype: u16, payload: &[u8]) -> bool {
        if self.total >= PATH_WAIT_MAX {
            return false;
        }
        let q = self.by_gid.entry(hw.gid).or_default();
        if q.iter().filter(|m| m.kind == kind).count() >= PATH_QUEUE_LEN {
            return false;
        }
        q.push_back(Message {
            hw,
            kind,
            ethertype,
            payload: payload.to_vec(),
        });
        self.total += 1;
        true
    }

    /// Takes what waits for `gid`, in order.
    fn take(&mut self, gid: &Gid) -> VecDeque<Message> {
        let q = self.by_gid.remove(gid).unwrap_or_default();
        self.total -= q.len();
        q
    }

    /// Forgets everything held; returns how many messages that was.
    fn clear(&mut self) -> usize {
        self.by_gid.clear();
        std::mem::take(&mut self.total)
    }

    /// Messages held in all.
    pub(super) const fn len(&self) -> usize {
        self.total
    }
}

impl Endpoint {
    /// Whether a unicast message to `gid` must wait for its path: an SA client holds the
    /// paths and has not given one for `gid` yet.
    pub(super) fn must_wait_for_path(&self, gid: Gid) -> bool {
        self.uses_sa_groups() && self.paths.get(&gid).is_none()
    }

    /// Holds a message for `hw` until its path is known, and asks for the path (again, after
    /// a failure); at the bound the message is dropped. Counted either way.
    pub(super) fn hold_for_path(&mut self, hw: HwAddr, kind: Held, ethertype: u16, payload: &[u8]) {
        if !self.want_path(hw.gid) {
            // `neigh_max` queries outstanding: this one could not be asked.
            self.counters.path_failed_drops += 1;
            self.counters.tx_dropped += 1;
            return;
        }
        if self.sa.waiting.hold(hw, kind, ethertype, payload) {
            self.counters.path_wait_held += 1;
        } else {
            self.counters.path_wait_drops += 1;
            self.counters.tx_queue_drops += 1;
        }
    }

    /// The path to `gid` is known: what waited for it goes out, in order.
    pub(super) fn release_path_wait<V: Verbs>(&mut self, now: Instant, v: &mut V, gid: Gid) {
        for m in self.sa.waiting.take(&gid) {
            match m.kind {
                Held::Ip => self.send_ip(now, v, m.hw, m.ethertype, &m.payload),
                Held::Reply => {
                    self.send_ud(v, m.hw, m.ethertype, &m.payload);
                }
            }
        }
    }

    /// The path to `gid` could not be had: what waited for it is dropped.
    pub(super) fn fail_path_wait(&mut self, gid: Gid) {
        let n = self.sa.waiting.take(&gid).len() as u64;
        self.counters.path_failed_drops += n;
        self.counters.tx_dropped += n;
    }

    /// Every path is void (a port event): everything held is dropped.
    pub(super) fn fail_every_path_wait(&mut self) {
        let n = self.sa.waiting.clear() as u64;
        self.counters.path_failed_drops += n;
        self.counters.tx_dropped += n;
    }

    /// Messages held for paths now.
    pub fn path_waiting(&self) -> usize {
        self.sa.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::QpNum;

    fn hw(n: u8) -> HwAddr {
        HwAddr::new(
            0x80,
            QpNum::new(0x100 + u32::from(n)),
            Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, n]),
        )
    }

    #[test]
    fn each_path_holds_three_of_each_kind_and_all_paths_together_are_capped() {
        let mut w = PathWait::default();
        for i in 0..5u8 {
            let ok = w.hold(hw(1), Held::Ip, 0x0800, &[i]);
            assert_eq!(ok, usize::from(i) < PATH_QUEUE_LEN);
        }
        assert!(w.hold(hw(1), Held::Reply, 0x0806, &[9]));
        assert_eq!(w.len(), PATH_QUEUE_LEN + 1);
        // Taken in the order held.
        let got: Vec<u8> = w.take(&hw(1).gid).iter().map(|m| m.payload[0]).collect();
        assert_eq!(got, [0, 1, 2, 9]);
        assert_eq!(w.len(), 0);
        let mut held = 0;
        for n in 0..=255u8 {
            for _ in 0..PATH_QUEUE_LEN {
                held += usize::from(w.hold(hw(n), Held::Ip, 0x0800, &[n]));
            }
        }
        assert_eq!(held, PATH_WAIT_MAX);
        assert_eq!(w.len(), PATH_WAIT_MAX);
        assert!(w.by_gid.len() <= PATH_WAIT_MAX);
        assert_eq!(w.clear(), PATH_WAIT_MAX);
        assert!(w.by_gid.is_empty());
    }
}
