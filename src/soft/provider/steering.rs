//! The hand-off between the workers of a steered socket group: a datagram one worker's
//! socket received for another worker's QP ([`SoftConfig::workers`]) is held here until the
//! driver takes it to its owner ([`SoftProvider::take_foreign`],
//! [`SoftProvider::accept_foreign`]).
//!
//! [`SoftConfig::workers`]: crate::soft::SoftConfig::workers
//! [`SoftProvider::take_foreign`]: super::SoftProvider::take_foreign
//! [`SoftProvider::accept_foreign`]: super::SoftProvider::accept_foreign

use std::net::SocketAddr;

use crate::wire::{Framing, WorkerCount, WorkerId};

/// Most datagrams of other workers a steered provider holds for
/// [`take_foreign`](super::SoftProvider::take_foreign); more are dropped and counted
/// ([`SteeringStats::rx_foreign_dropped`]).
pub const FOREIGN_SLOTS: usize = 256;

/// Longest datagram of another worker that is held
/// ([`take_foreign`](super::SoftProvider::take_foreign)): a 4096-MTU RoCE packet with its headers
/// (the provider's send slots hold as much). Longer ones are no RoCE packet of a QP of ours and are
/// dropped and counted ([`SteeringStats::rx_foreign_dropped`]).
pub const FOREIGN_DATAGRAM_MAX: usize = 4_352;

/// Counters of a steered provider ([`workers`](crate::soft::SoftConfig::workers) two or more; all
/// zero with one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct SteeringStats {
    /// Datagrams received on this worker's socket whose destination QP is another worker's
    /// ([`WorkerCount::owner_of_qpn`](crate::wire::WorkerCount::owner_of_qpn)): segments of a
    /// buffer the kernel's GRO merged and steered by hash, or datagrams that came while the socket
    /// group was still forming. Held for [`take_foreign`](super::SoftProvider::take_foreign), or
    /// dropped when no room was left.
    pub rx_misrouted: u64,
    /// Of those, dropped: [`FOREIGN_SLOTS`] were held already, or the datagram was longer
    /// than [`FOREIGN_DATAGRAM_MAX`].
    pub rx_foreign_dropped: u64,
    /// Datagrams another worker received and handed to this one
    /// ([`accept_foreign`](super::SoftProvider::accept_foreign)).
    pub rx_foreign_accepted: u64,
}

/// A datagram received by one worker that belongs to another
/// ([`take_foreign`](super::SoftProvider::take_foreign)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForeignDatagram<'a> {
    /// The worker that owns its destination QP: hand it to that worker's
    /// [`accept_foreign`](super::SoftProvider::accept_foreign).
    pub worker: u8,
    /// Its sender.
    pub src: SocketAddr,
    /// The UDP payload (BTH … ICRC).
    pub datagram: &'a [u8],
}

/// The datagrams of other workers a steered provider received, held until taken: at most
/// [`FOREIGN_SLOTS`] of at most [`FOREIGN_DATAGRAM_MAX`] bytes, their buffers allocated when
/// first needed and reused from then on.
#[derive(Debug)]
pub(super) struct Steering {
    /// Which worker this provider is.
    slot: WorkerId,
    /// Where the link's datagrams carry their BTH.
    framing: Framing,
    /// Buffers, `held` of them holding a datagram.
    pub(super) held_slots: Vec<HeldForeign>,
    pub(super) held: usize,
    pub(super) stats: SteeringStats,
}

#[derive(Debug)]
pub(super) struct HeldForeign {
    pub(super) worker: u8,
    pub(super) src: SocketAddr,
    pub(super) bytes: Vec<u8>,
}

impl Steering {
    pub(super) fn new(slot: WorkerId, framing: Framing) -> Self {
        Self {
            slot,
            framing,
            held_slots: Vec::new(),
            held: 0,
            stats: SteeringStats::default(),
        }
    }

    /// Whether `datagram` belongs to another worker ([`Framing::owner`], as the socket group's
    /// program steers: one that names no QP is worker 0's); if so it is held (or dropped,
    /// without room) and counted. With one worker it is this one's.
    pub(super) fn divert(&mut self, src: SocketAddr, datagram: &[u8]) -> bool {
        let count = self.slot.count();
        if count == WorkerCount::ONE {
            return false;
        }
        let owner = self.framing.owner(count, datagram);
        if owner == self.slot.index() {
            return false;
        }
        self.stats.rx_misrouted += 1;
        if !self.hold(owner, src, datagram) {
            self.stats.rx_foreign_dropped += 1;
        }
        true
    }

    fn hold(&mut self, worker: u8, src: SocketAddr, datagram: &[u8]) -> bool {
        if self.held >= FOREIGN_SLOTS || datagram.len() > FOREIGN_DATAGRAM_MAX {
            return false;
        }
        if self.held == self.held_slots.len() {
            self.held_slots.push(HeldForeign {
                worker,
                src,
                bytes: Vec::with_capacity(FOREIGN_DATAGRAM_MAX),
            });
        }
        let Some(h) = self.held_slots.get_mut(self.held) else {
            return false;
        };
        h.worker = worker;
        h.src = src;
        h.bytes.clear();
        h.bytes.extend_from_slice(datagram);
        self.held += 1;
        true
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A datagram of `len` bytes (at least a BTH) for QP `qpn`, the rest `fill`.
    pub(in crate::soft::provider) fn for_qp(qpn: u32, len: usize, fill: u8) -> Vec<u8> {
        let mut d = vec![fill; len];
        d[..12].fill(0);
        d[0] = 0x04;
        d[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        d
    }

    /// The held datagrams of other workers are bounded: 256 held, the rest and any longer than
    /// a RoCE packet dropped and counted, the buffers reused once taken; a lone worker and a
    /// datagram too short to name a QP divert nothing.
    #[test]
    fn foreign_datagrams_are_held_within_bounds() {
        let src = SocketAddr::from(([198, 18, 0, 2], 4791));
        let mut lone = Steering::new(WorkerId::SINGLE, Framing::Bth);
        assert!(!lone.divert(src, &for_qp(0x101, 100, 0)));
        let four = WorkerCount::new(4).unwrap();
        let mut s = Steering::new(WorkerId::new(2, four).unwrap(), Framing::Bth);
        assert!(!s.divert(src, &for_qp(0x102, 100, 0)), "its own");
        for i in 0..300u32 {
            assert!(s.divert(src, &for_qp(0x100 + (i % 2) * 3, 100, 0)));
        }
        assert!(s.divert(src, &for_qp(0x101, FOREIGN_DATAGRAM_MAX + 1, 0)));
        assert_eq!(s.held, FOREIGN_SLOTS);
        assert_eq!(
            s.stats,
            SteeringStats {
                rx_misrouted: 301,
                rx_foreign_dropped: 301 - FOREIGN_SLOTS as u64,
                rx_foreign_accepted: 0,
            }
        );
        let owners: Vec<u8> = s.held_slots.iter().take(4).map(|h| h.worker).collect();
        assert_eq!(owners, [0, 3, 0, 3]);
        s.held = 0;
        let biggest = FOREIGN_DATAGRAM_MAX;
        assert!(s.divert(src, &for_qp(0x101, biggest, 0)));
        assert_eq!(s.held_slots.len(), FOREIGN_SLOTS, "buffers reused");
        assert!(s.held_slots.iter().all(|h| h.bytes.capacity() == biggest));
    }

    /// What names no QP (too short; on the InfiniBand link a beacon, or a packet whose LNH
    /// has no BTH) is worker 0's, as the socket group's program steers it; an IB packet goes
    /// to the worker of the QP its BTH names, behind the LRH (and a GRH).
    #[test]
    fn what_names_no_qp_is_worker_0s() {
        let src = SocketAddr::from(([198, 18, 0, 2], 4791));
        let two = WorkerCount::new(2).unwrap();
        let [w0, w1] = [0, 1].map(|i| WorkerId::new(i, two).unwrap());
        let mut roce = Steering::new(w1, Framing::Bth);
        assert!(roce.divert(src, &[0; 7]), "too short to name a QP");
        assert!(!Steering::new(w0, Framing::Bth).divert(src, &[0; 7]));
        let mut ib = Steering::new(w1, Framing::Lrh);
        let lrh = [0x70, 0x02, 0, 5, 0, 9, 0, 7];
        let packet = |qpn| [&lrh[..], &for_qp(qpn, 40, 0)].concat();
        assert!(!ib.divert(src, &packet(0x101)), "its own, behind the LRH");
        assert!(ib.divert(src, &packet(0x102)));
        let mut beacon = packet(0x101);
        beacon[..4].copy_from_slice(b"IBsl");
        assert!(ib.divert(src, &beacon), "a beacon is control's");
        assert!(
            ib.divert(src, &for_qp(0x101, 40, 0)),
            "a bare BTH is no IB packet"
        );
        let owners: Vec<u8> = ib.held_slots.iter().map(|h| h.worker).collect();
        assert_eq!(owners, [0, 0, 0]);
        assert_eq!(ib.stats.rx_misrouted, 3);
    }
}
