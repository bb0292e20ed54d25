//! [`TxBatch`]: the reusable slots of outgoing datagrams a [`UdpTransport`] sends with
//! `sendmmsg`, with consecutive datagrams to one address joined into UDP GSO trains.

use std::net::SocketAddr;

use socket2::SockAddr;

use crate::sys::udp::{self, Outgoing};
use crate::wire::icrc::{shift_icrc, Ipv4IdShiftCache, GSO_MAX_SEGMENTS};

#[cfg(doc)]
use super::UdpTransport;

/// Largest UDP payload of one send: a GSO train must fit one IPv4 datagram's length field.
const MAX_TRAIN_BYTES: usize = 65_507;

/// Where the BTH's destination QP lies in a datagram (the UDP payload).
const DEST_QP: std::ops::Range<usize> = 5..8;

/// The destination QP bytes of a RoCEv2 datagram; `None` when it is too short to hold them.
fn dest_qp(datagram: &[u8]) -> Option<[u8; 3]> {
    datagram.get(DEST_QP)?.try_into().ok()
}

/// Outgoing datagrams for [`UdpTransport::send_batch`]: a fixed set of reusable slots, filled
/// in order and sent oldest first.
///
/// With GSO on ([`TxBatch::with_gso`]), [`push_datagram`](Self::push_datagram) appends a
/// datagram to the newest unsent slot when it goes to the same address and the same
/// destination QP (BTH bytes 5..8) and is no longer than the slot's first one: the slot then
/// leaves as one UDP GSO train (one `sendmmsg` entry, one trip through the stack) that the
/// kernel cuts back into the same datagrams. For IPv4 the
/// kernel numbers the segments' IP IDs 0, 1, 2, ..., so the ICRC of segment `k` is shifted to
/// match ID `k` ([`Ipv4IdShift`](crate::wire::icrc::Ipv4IdShift)); on the wire every
/// datagram is exactly the RoCEv2 packet it would have been on its own, with that ID.
///
/// A train holds one destination QP because the receiver may steer by it: its kernel runs a
/// reuseport program once per buffer ([`UdpTransport::bind_steered`]), so a train reaches
/// whole the socket that its first datagram's QP names.
#[derive(Debug)]
pub struct TxBatch {
    slots: Vec<Outgoing>,
    /// Per slot: where it goes, and how many datagrams it holds.
    trains: Vec<Train>,
    /// First unsent slot.
    head: usize,
    /// Slots filled.
    len: usize,
    /// GSO trains are built; `None` when off.
    gso: Option<Ipv4IdShiftCache>,
    /// Trains of two or more datagrams handed to the kernel so far.
    trains_sent: u64,
}

/// What a [`TxBatch`] slot holds.
#[derive(Debug, Clone, Copy)]
struct Train {
    dst: SocketAddr,
    /// The destination QP of its datagrams (BTH bytes 5..8); `None` for a datagram too
    /// short to hold one, which no other joins.
    dest_qp: Option<[u8; 3]>,
    /// Datagrams in the slot.
    segments: usize,
    /// A datagram shorter than the first ended the train.
    closed: bool,
}

impl TxBatch {
    /// Room for `slots` datagrams (clamped to 1..=`BATCH_MAX`, the most one `sendmmsg` call moves), each buffer
    /// preallocated with `capacity` bytes; one datagram per slot (no GSO).
    pub fn new(slots: usize, capacity: usize) -> Self {
        let dst = SocketAddr::from(([0, 0, 0, 0], 0));
        let slots = slots.clamp(1, udp::BATCH_MAX);
        Self {
            slots: (0..slots)
                .map(|_| Outgoing {
                    dst: SockAddr::from(dst),
                    data: Vec::with_capacity(capacity),
                    segment_len: 0,
                })
                .collect(),
            trains: vec![
                Train {
                    dst,
                    dest_qp: None,
                    segments: 0,
                    closed: false,
                };
                slots
            ],
            head: 0,
            len: 0,
            gso: None,
            trains_sent: 0,
        }
    }

    /// As [`new`](Self::new), building GSO trains of RoCEv2 datagrams when `gso` is true.
    /// Slots that may hold a train should have room for 65,507 bytes (a UDP datagram); smaller
    /// ones grow.
    pub fn with_gso(slots: usize, capacity: usize, gso: bool) -> Self {
        let mut batch = Self::new(slots, capacity);
        if gso {
            batch.gso = Some(Ipv4IdShiftCache::default());
        }
        batch
    }

    /// Writes every slot's buffer through to its capacity ([`commit`](crate::verbs::pool::commit)),
    /// keeping what is queued: the memory of a full batch is the process's from now on.
    pub fn commit(&mut self) {
        for slot in &mut self.slots {
            let len = slot.data.len();
            slot.data.resize(slot.data.capacity(), 0);
            crate::verbs::pool::commit(&mut slot.data);
            slot.data.truncate(len);
        }
    }

    /// Trains are being built.
    pub fn gso_enabled(&self) -> bool {
        self.gso.is_some()
    }

    /// Stops building trains (queued ones still go out as trains).
    pub fn disable_gso(&mut self) {
        self.gso = None;
    }

    /// Trains of two or more datagrams sent so far.
    pub fn trains_sent(&self) -> u64 {
        self.trains_sent
    }

    /// Nothing waits to be sent.
    pub fn is_empty(&self) -> bool {
        self.head == self.len
    }

    /// Every slot is filled (some may already be sent; see [`is_empty`](Self::is_empty)).
    pub fn is_full(&self) -> bool {
        self.len == self.slots.len()
    }

    /// Slots (datagrams or trains) waiting to be sent.
    pub fn queued(&self) -> usize {
        self.len - self.head
    }

    /// Queues one RoCEv2 datagram (BTH … ICRC, the ICRC computed for IPv4 ID 0) for `dst`:
    /// appended to the newest unsent train when GSO is on and it fits, else copied into the
    /// next free slot. False (nothing queued) only when the batch is full.
    pub fn push_datagram(&mut self, dst: SocketAddr, datagram: &[u8]) -> bool {
        self.push_appending(|buf| {
            buf.extend_from_slice(datagram);
            Some(dst)
        })
    }

    /// Lets `fill` append the next RoCEv2 datagram (ICRC for IPv4 ID 0) and return where it
    /// goes, writing it in place: at the end of the newest unsent train when GSO is on (it
    /// stays there if it may join the train, else it moves to the next free slot), or into
    /// the next free slot. `fill` must append exactly one datagram, or nothing and return
    /// `None`. False when `fill` gave nothing or no slot is free (`fill` is then not called).
    pub fn push_appending(
        &mut self,
        fill: impl FnOnce(&mut Vec<u8>) -> Option<SocketAddr>,
    ) -> bool {
        self.reset_if_empty();
        if self.is_full() {
            return false;
        }
        let gso = self.gso.is_some();
        let next = self.len;
        let open = next
            .checked_sub(1)
            .filter(|&i| gso && i >= self.head)
            .filter(|&i| self.trains.get(i).is_some_and(|t| !t.closed));
        let Some(last) = open else {
            // A fresh slot.
            let Some(slot) = self.slots.get_mut(next) else {
                return false;
            };
            slot.data.clear();
            let Some(dst) = fill(&mut slot.data) else {
                return false;
            };
            self.start_train(next, dst);
            return true;
        };
        let (Some(slot), Some(train)) = (self.slots.get_mut(last), self.trains.get_mut(last))
        else {
            return false;
        };
        let start = slot.data.len();
        let Some(dst) = fill(&mut slot.data) else {
            slot.data.truncate(start);
            return false;
        };
        let len = slot.data.len() - start;
        let seg = usize::from(slot.segment_len);
        let joins = train.dst == dst
            && train.dest_qp.is_some()
            && train.dest_qp == dest_qp(slot.data.get(start..).unwrap_or_default())
            && len > 0
            && len <= seg
            && train.segments < GSO_MAX_SEGMENTS
            && slot.data.len() <= MAX_TRAIN_BYTES;
        if joins {
            if dst.is_ipv4() {
                if let Some(shifts) = self.gso.as_mut() {
                    let delta = shifts.delta(len, train.segments);
                    if let Some(d) = slot.data.get_mut(start..) {
                        shift_icrc(d, delta);
                    }
                }
            }
            train.segments += 1;
            train.closed = len < seg;
            return true;
        }
        // It cannot join: move it to the next slot, which starts a new train.
        train.closed = true;
        let (head, tail) = self.slots.split_at_mut(next);
        let (Some(from), Some(to)) = (head.get_mut(last), tail.first_mut()) else {
            return false;
        };
        to.data.clear();
        to.data
            .extend_from_slice(from.data.get(start..).unwrap_or_default());
        from.data.truncate(start);
        self.start_train(next, dst);
        true
    }

    /// Slot `i` (just filled with one datagram for `dst`) becomes the newest slot.
    fn start_train(&mut self, i: usize, dst: SocketAddr) {
        let gso = self.gso.is_some();
        let (Some(slot), Some(train)) = (self.slots.get_mut(i), self.trains.get_mut(i)) else {
            return;
        };
        slot.dst = SockAddr::from(dst);
        slot.segment_len = u16::try_from(slot.data.len()).unwrap_or(0);
        *train = Train {
            dst,
            dest_qp: dest_qp(&slot.data),
            segments: 1,
            closed: !gso || slot.segment_len == 0,
        };
        self.len = i + 1;
    }

    fn reset_if_empty(&mut self) {
        if self.is_empty() {
            self.head = 0;
            self.len = 0;
        }
    }

    pub(super) fn pending(&self) -> &[Outgoing] {
        &self.slots[self.head..self.len]
    }

    /// The length of the oldest unsent datagram, or of each segment of the oldest train.
    pub(super) fn front_segment_len(&self) -> usize {
        self.slots.get(self.head).map_or(0, |s| {
            if s.segment_len > 0 {
                usize::from(s.segment_len)
            } else {
                s.data.len()
            }
        })
    }

    /// Builds trains again after [`disable_gso`](Self::disable_gso).
    pub fn enable_gso(&mut self) {
        if self.gso.is_none() {
            self.gso = Some(Ipv4IdShiftCache::default());
        }
    }

    /// The oldest unsent slot is a train of two or more datagrams.
    pub(super) fn front_is_train(&self) -> bool {
        self.trains.get(self.head).is_some_and(|t| t.segments > 1)
    }

    pub(super) fn consume(&mut self, n: usize) {
        let end = (self.head + n).min(self.len);
        self.trains_sent += self
            .trains
            .get(self.head..end)
            .map_or(0, |t| t.iter().filter(|t| t.segments > 1).count() as u64);
        self.head = end;
        if self.is_empty() {
            self.head = 0;
            self.len = 0;
        }
    }
}
