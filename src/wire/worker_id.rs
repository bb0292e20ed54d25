//! Which of an interface's workers a number belongs to.
//!
//! With N workers (a power of two, at most [`WorkerCount::MAX`]), every number a worker hands
//! out that a peer echoes back carries the worker's index in its low `log2(N)` bits: the QPNs
//! of its QPs (so the kernel's reuseport program, reading only the BTH's destination QP,
//! delivers a datagram to the worker that owns the QP) and the local comm ids of its CM
//! connections (so the control side, reading only a MAD's Remote Communication ID, hands the
//! MAD to the worker whose connection it is). The wire does not change: the peer sees numbers
//! as arbitrary as before.
//!
//! QP1 (the GSI) and the multicast QPN are always the control side's, worker 0
//! ([`CONTROL_QPNS`]).

use core::fmt;

use super::ib::IB_GRH_LEN;
use super::ids::QpNum;
use super::lrh::{Lnh, LRH_LEN};

/// The QPNs whose datagrams the control side (worker 0) receives, whatever the worker count:
/// QP1 (the CM's MADs) and the multicast QPN `0xFFFFFF` (the groups of the UD QP, which is
/// the control side's).
pub const CONTROL_QPNS: [QpNum; 2] = [QpNum::GSI, QpNum::new(0x00FF_FFFF)];

/// How the datagrams of the underlay begin, which says where their BTH is (and so the
/// destination QP that names their worker).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Framing {
    /// RoCEv2: the UDP payload is the BTH.
    #[default]
    Bth,
    /// A native InfiniBand packet: an LRH of LVer 0, a GRH where its LNH is IBA global, then
    /// the BTH. Anything else on that link (a datagram whose first nibble is no LVer 0, such
    /// as the link's beacons, or an LNH without a BTH) names no QP.
    Lrh,
}

impl Framing {
    /// Offset of the BTH word whose low 24 bits are the destination QP.
    pub const DEST_QP_WORD: usize = 4;

    /// Where the BTH of `datagram` starts; `None` where it carries none.
    pub fn bth_offset(self, datagram: &[u8]) -> Option<usize> {
        match self {
            Self::Bth => Some(0),
            Self::Lrh => {
                let (&b0, &b1) = (datagram.first()?, datagram.get(1)?);
                if b0 & 0x0F != 0 {
                    return None;
                }
                match Lnh::from_bits(b1) {
                    Lnh::IbaLocal => Some(LRH_LEN),
                    Lnh::IbaGlobal => Some(LRH_LEN + IB_GRH_LEN),
                    Lnh::Raw | Lnh::IpNonIba => None,
                }
            }
        }
    }

    /// The destination QP of `datagram`; `None` where it names none (too short, or no BTH).
    pub fn dest_qpn(self, datagram: &[u8]) -> Option<QpNum> {
        let at = self.bth_offset(datagram)? + Self::DEST_QP_WORD;
        let &[_, a, b, c] = datagram.get(at..at + 4)? else {
            return None;
        };
        Some(QpNum::new(u32::from_be_bytes([0, a, b, c])))
    }

    /// The worker of `count` that receives `datagram`: the owner of its destination QP
    /// ([`WorkerCount::owner_of_qpn`]), worker 0 where it names none. What a steered socket
    /// group's program computes.
    pub fn owner(self, count: WorkerCount, datagram: &[u8]) -> u8 {
        self.dest_qpn(datagram).map_or(0, |q| count.owner_of_qpn(q))
    }
}

/// How many workers an interface runs: a power of two from 1 to [`WorkerCount::MAX`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerCount(u8);

/// A worker count that is not a power of two from 1 to [`WorkerCount::MAX`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0} workers: must be a power of two from 1 to 64 (1, 2, 4, 8, 16, 32, 64)")]
pub struct BadWorkerCount(pub u32);

impl WorkerCount {
    /// One worker: the interface as it always was.
    pub const ONE: Self = Self(1);
    /// The most workers an interface runs.
    pub const MAX: u8 = 64;

    /// `n` workers.
    ///
    /// # Errors
    /// `n` is not a power of two from 1 to [`WorkerCount::MAX`].
    pub const fn new(n: u32) -> Result<Self, BadWorkerCount> {
        if n.is_power_of_two() && n <= Self::MAX as u32 {
            // n ≤ 64 fits.
            Ok(Self(n as u8))
        } else {
            Err(BadWorkerCount(n))
        }
    }

    /// The count.
    pub const fn get(self) -> u8 {
        self.0
    }

    /// The low bits that name a worker: `log2(count)`.
    pub const fn bits(self) -> u32 {
        self.0.trailing_zeros()
    }

    /// The mask of those bits.
    pub const fn mask(self) -> u32 {
        self.0 as u32 - 1
    }

    /// The worker whose number `raw` is (its low bits).
    pub const fn owner(self, raw: u32) -> u8 {
        // The mask is below 64.
        (raw & self.mask()) as u8
    }

    /// The worker that receives datagrams for `qpn`: worker 0 for the [`CONTROL_QPNS`],
    /// every other QPN the worker in its low bits. What a steered socket group's program
    /// computes.
    pub const fn owner_of_qpn(self, qpn: QpNum) -> u8 {
        let raw = qpn.get();
        if raw == CONTROL_QPNS[0].get() || raw == CONTROL_QPNS[1].get() {
            0
        } else {
            self.owner(raw)
        }
    }

    /// Every worker's slot, in index order.
    pub fn slots(self) -> impl Iterator<Item = WorkerId> {
        (0..self.0).map(move |index| WorkerId { index, count: self })
    }
}

impl Default for WorkerCount {
    fn default() -> Self {
        Self::ONE
    }
}

impl fmt::Display for WorkerCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One worker of a [`WorkerCount`]: its index, and the count that says how many low bits
/// name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WorkerId {
    index: u8,
    count: WorkerCount,
}

impl WorkerId {
    /// The only worker of a one-worker interface: tagging changes nothing.
    pub const SINGLE: Self = Self {
        index: 0,
        count: WorkerCount::ONE,
    };

    /// Worker `index` of `count`; `None` when `index` is not below `count`.
    pub const fn new(index: u8, count: WorkerCount) -> Option<Self> {
        if index < count.get() {
            Some(Self { index, count })
        } else {
            None
        }
    }

    /// The worker's index.
    pub const fn index(self) -> u8 {
        self.index
    }

    /// How many workers there are.
    pub const fn count(self) -> WorkerCount {
        self.count
    }

    /// `value` with the worker in its low bits: `value << bits | index`, wrapping (the top
    /// bits of `value` fall off). One worker: `value` itself.
    pub const fn tag(self, value: u32) -> u32 {
        let bits = self.count.bits();
        // bits < 8, so the shift is in range.
        (value << bits) | self.index as u32
    }

    /// Whether `raw` is this worker's.
    pub const fn owns(self, raw: u32) -> bool {
        self.count.owner(raw) == self.index
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "worker {} of {}", self.index, self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_powers_of_two_up_to_64() {
        for n in [1, 2, 4, 8, 16, 32, 64] {
            assert_eq!(u32::from(WorkerCount::new(n).unwrap().get()), n);
        }
        for n in [0, 3, 6, 65, 128, 1000] {
            assert_eq!(WorkerCount::new(n), Err(BadWorkerCount(n)));
        }
        assert_eq!(
            BadWorkerCount(3).to_string(),
            "3 workers: must be a power of two from 1 to 64 (1, 2, 4, 8, 16, 32, 64)"
        );
    }

    #[test]
    fn a_tag_names_its_worker_and_one_worker_changes_nothing() {
        assert_eq!(WorkerId::SINGLE.tag(0x1234_5678), 0x1234_5678);
        let four = WorkerCount::new(4).unwrap();
        for slot in four.slots() {
            for v in [0, 1, 0x3fff_ffff, u32::MAX] {
                let t = slot.tag(v);
                assert_eq!(four.owner(t), slot.index());
                assert!(slot.owns(t));
            }
        }
        // Distinct values below 2^30 stay distinct.
        let s = WorkerId::new(3, four).unwrap();
        assert_ne!(s.tag(5), s.tag(6));
        assert_eq!(WorkerId::new(4, four), None);
    }

    /// An LRH of LVer 0 with `lnh`, then a GRH where it says, then a BTH for `qpn`.
    fn ib_packet(lnh: u8, qpn: u32) -> Vec<u8> {
        let bth_at = if lnh == 3 { 48 } else { 8 };
        let mut d = vec![0u8; bth_at + 12];
        d[1] = lnh;
        d[bth_at + 5..bth_at + 8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        d
    }

    #[test]
    fn framing_finds_the_destination_qp() {
        let four = WorkerCount::new(4).unwrap();
        let mut roce = vec![0u8; 12];
        roce[5..8].copy_from_slice(&[0, 0x12, 0x37]);
        assert_eq!(Framing::Bth.dest_qpn(&roce), Some(QpNum::new(0x1237)));
        assert_eq!(Framing::Bth.owner(four, &roce), 3);
        assert_eq!(Framing::Bth.dest_qpn(&roce[..7]), None);
        assert_eq!(Framing::Bth.owner(four, &roce[..7]), 0);
        assert_eq!(
            Framing::Lrh.dest_qpn(&ib_packet(2, 0x1236)),
            Some(QpNum::new(0x1236))
        );
        assert_eq!(Framing::Lrh.owner(four, &ib_packet(2, 0x1236)), 2);
        assert_eq!(
            Framing::Lrh.dest_qpn(&ib_packet(3, 0x1235)),
            Some(QpNum::new(0x1235))
        );
        assert_eq!(Framing::Lrh.owner(four, &ib_packet(3, 1)), 0);
        // LNH raw or IP: no BTH; LVer not 0 (a beacon's `I`): no IB packet; too short.
        for lnh in [0, 1] {
            assert_eq!(Framing::Lrh.dest_qpn(&ib_packet(lnh, 5)), None);
        }
        let mut beacon = ib_packet(2, 5);
        beacon[0] = b'I';
        assert_eq!(Framing::Lrh.dest_qpn(&beacon), None);
        assert_eq!(Framing::Lrh.owner(four, &beacon), 0);
        assert_eq!(Framing::Lrh.dest_qpn(&ib_packet(2, 5)[..15]), None);
        assert_eq!(Framing::Lrh.dest_qpn(&[]), None);
    }

    #[test]
    fn qp1_is_the_control_sides() {
        let two = WorkerCount::new(2).unwrap();
        assert_eq!(two.owner_of_qpn(QpNum::GSI), 0);
        assert_eq!(two.owner_of_qpn(QpNum::new(0x00FF_FFFF)), 0);
        assert_eq!(two.owner_of_qpn(QpNum::new(3)), 1);
        assert_eq!(two.owner_of_qpn(QpNum::new(0x10_0000)), 0);
    }
}
