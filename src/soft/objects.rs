//! The object tables (rxe `rxe_pool.c`): protection domains, completion queues, shared
//! receive queues, buffer pools and the QP table; completions are pushed onto their CQs here.

use std::collections::VecDeque;

use super::config::MULTICAST_QPN;
use super::qp::{Qp, RecvWqe};
use crate::verbs::{
    BufId, BufPools, Completion, CqId, PdId, PoolId, QpInit, QpNum, SrqId, SrqInit, VerbsError,
    WcOpcode, WrId,
};
use crate::wire::{IdMap, WorkerId};

/// A completion queue.
#[derive(Debug)]
struct Cq {
    /// Entries beyond this count as overflows (they are still queued).
    depth: usize,
    entries: VecDeque<Completion>,
}

/// A shared receive queue.
#[derive(Debug)]
struct Srq {
    pd: PdId,
    max_wr: u32,
    /// Raise `SrqLimitReached` once fewer WQEs than this remain (0: disarmed).
    limit: u32,
    wqes: VecDeque<RecvWqe>,
    /// QPs attached to it.
    attached: usize,
}

/// Every object but the QPs: PDs with their user counts, CQs, SRQs and the buffer pools.
#[derive(Debug)]
pub(super) struct Objects {
    pub(super) pools: BufPools,
    /// Users (pools, SRQs, QPs) of each PD, by PD number.
    pds: IdMap<u32, usize>,
    next_pd: u32,
    cqs: IdMap<CqId, Cq>,
    next_cq: u32,
    srqs: IdMap<SrqId, Srq>,
    next_srq: u32,
}

impl Objects {
    pub(super) fn new() -> Self {
        Self {
            pools: BufPools::new(),
            pds: IdMap::default(),
            next_pd: 1,
            cqs: IdMap::default(),
            next_cq: 1,
            srqs: IdMap::default(),
            next_srq: 1,
        }
    }

    pub(super) fn alloc_pd(&mut self) -> PdId {
        let id = self.next_pd;
        self.next_pd = self.next_pd.wrapping_add(1);
        self.pds.insert(id, 0);
        PdId(id)
    }

    pub(super) fn dealloc_pd(&mut self, pd: PdId) -> Result<(), VerbsError> {
        match self.pds.get(&pd.0) {
            None => Err(VerbsError::NoSuchObject("PD")),
            Some(0) => {
                self.pds.remove(&pd.0);
                Ok(())
            }
            Some(_) => Err(VerbsError::Busy("PD")),
        }
    }

    pub(super) fn create_pool(
        &mut self,
        pd: PdId,
        buf_len: usize,
        count: usize,
    ) -> Result<PoolId, VerbsError> {
        let users = self
            .pds
            .get_mut(&pd.0)
            .ok_or(VerbsError::NoSuchObject("PD"))?;
        let id = self.pools.create(buf_len, count)?;
        *users += 1;
        Ok(id)
    }

    pub(super) fn create_cq(&mut self, depth: u32) -> CqId {
        let id = CqId(self.next_cq);
        self.next_cq = self.next_cq.wrapping_add(1);
        self.cqs.insert(
            id,
            Cq {
                depth: depth.max(1) as usize,
                entries: VecDeque::new(),
            },
        );
        id
    }

    /// Destroys `cq` unless a QP uses it (`in_use`); buffers of its entries are freed.
    pub(super) fn destroy_cq(&mut self, cq: CqId, in_use: bool) -> Result<(), VerbsError> {
        if !self.cqs.contains_key(&cq) {
            return Err(VerbsError::NoSuchObject("CQ"));
        }
        if in_use {
            return Err(VerbsError::Busy("CQ"));
        }
        if let Some(q) = self.cqs.remove(&cq) {
            for c in q.entries {
                if let Some(b) = c.buf {
                    let _ = self.pools.free(b);
                }
            }
        }
        Ok(())
    }

    pub(super) fn poll_cq(&mut self, cq: CqId, out: &mut Vec<Completion>, max: usize) -> usize {
        let Some(q) = self.cqs.get_mut(&cq) else {
            return 0;
        };
        let n = max.min(q.entries.len());
        out.extend(q.entries.drain(..n));
        n
    }

    pub(super) fn create_srq(&mut self, init: &SrqInit) -> Result<SrqId, VerbsError> {
        let users = self
            .pds
            .get_mut(&init.pd.0)
            .ok_or(VerbsError::NoSuchObject("PD"))?;
        *users += 1;
        let id = SrqId(self.next_srq);
        self.next_srq = self.next_srq.wrapping_add(1);
        self.srqs.insert(
            id,
            Srq {
                pd: init.pd,
                max_wr: init.max_wr.max(1),
                limit: init.limit,
                wqes: VecDeque::new(),
                attached: 0,
            },
        );
        Ok(id)
    }

    pub(super) fn modify_srq(&mut self, srq: SrqId, limit: u32) -> Result<(), VerbsError> {
        let s = self
            .srqs
            .get_mut(&srq)
            .ok_or(VerbsError::NoSuchObject("SRQ"))?;
        s.limit = limit;
        Ok(())
    }

    pub(super) fn post_srq_recv(
        &mut self,
        srq: SrqId,
        wr_id: WrId,
        buf: BufId,
    ) -> Result<(), VerbsError> {
        let s = self
            .srqs
            .get_mut(&srq)
            .ok_or(VerbsError::NoSuchObject("SRQ"))?;
        if s.wqes.len() >= s.max_wr as usize {
            return Err(VerbsError::QueueFull);
        }
        self.pools.lend(buf)?;
        s.wqes.push_back(RecvWqe { wr_id, buf });
        Ok(())
    }

    /// How many receive WQEs `srq` holds.
    pub(super) fn srq_posted(&self, srq: SrqId) -> Result<usize, VerbsError> {
        let s = self.srqs.get(&srq).ok_or(VerbsError::NoSuchObject("SRQ"))?;
        Ok(s.wqes.len())
    }

    pub(super) fn destroy_srq(&mut self, srq: SrqId) -> Result<(), VerbsError> {
        let s = self.srqs.get(&srq).ok_or(VerbsError::NoSuchObject("SRQ"))?;
        if s.attached > 0 {
            return Err(VerbsError::Busy("SRQ"));
        }
        if let Some(s) = self.srqs.remove(&srq) {
            for w in s.wqes {
                self.pools.release(w.buf);
            }
            if let Some(u) = self.pds.get_mut(&s.pd.0) {
                *u = u.saturating_sub(1);
            }
        }
        Ok(())
    }

    /// Checks that the PD, CQs and SRQ a new QP names exist.
    pub(super) fn check_qp_init(&self, init: &QpInit) -> Result<(), VerbsError> {
        if !self.pds.contains_key(&init.pd.0) {
            return Err(VerbsError::NoSuchObject("PD"));
        }
        if !self.cqs.contains_key(&init.send_cq) || !self.cqs.contains_key(&init.recv_cq) {
            return Err(VerbsError::NoSuchObject("CQ"));
        }
        if let Some(s) = init.srq {
            if !self.srqs.contains_key(&s) {
                return Err(VerbsError::NoSuchObject("SRQ"));
            }
        }
        Ok(())
    }

    /// Counts a new QP as a user of its PD and SRQ.
    pub(super) fn add_qp_user(&mut self, init: &QpInit) {
        if let Some(s) = init.srq.and_then(|s| self.srqs.get_mut(&s)) {
            s.attached += 1;
        }
        if let Some(u) = self.pds.get_mut(&init.pd.0) {
            *u += 1;
        }
    }

    /// Frees what a destroyed QP held: its posted buffers and its use of its PD and SRQ.
    pub(super) fn release_qp(&mut self, qp: &Qp) {
        let pools = &mut self.pools;
        qp.req
            .sq
            .iter()
            .filter_map(|w| w.wr.buf)
            .chain(qp.rq.iter().map(|w| w.buf))
            .chain(qp.resp.filling.map(|f| f.wqe.buf))
            .chain(qp.swallowed.iter().copied())
            .for_each(|b| pools.release(b));
        if let Some(s) = qp.srq.and_then(|s| self.srqs.get_mut(&s)) {
            s.attached = s.attached.saturating_sub(1);
        }
        if let Some(u) = self.pds.get_mut(&qp.pd.0) {
            *u = u.saturating_sub(1);
        }
    }

    /// Whether a completion of `qp` waits on one of its CQs.
    pub(super) fn has_completions_of(&self, qp: &Qp) -> bool {
        [qp.send_cq, qp.recv_cq].iter().any(|cq| {
            self.cqs
                .get(cq)
                .is_some_and(|q| q.entries.iter().any(|c| c.qp == qp.num))
        })
    }

    /// Removes the completions of the destroyed `qp` from its CQs (the
    /// [`clean_cq_on_destroy`](super::super::fault::Quirks::clean_cq_on_destroy) quirk): a
    /// receive taken from an SRQ goes back onto it, posted again under its `wr_id` (or, with
    /// the SRQ full, freed); every other buffer is freed. Returns how many were removed.
    pub(super) fn clean_cqs_of(&mut self, qp: &Qp) -> usize {
        let mut removed = Vec::new();
        for cq in [qp.send_cq, qp.recv_cq] {
            if let Some(q) = self.cqs.get_mut(&cq) {
                let mut kept = VecDeque::with_capacity(q.entries.len());
                for c in q.entries.drain(..) {
                    if c.qp == qp.num {
                        removed.push(c);
                    } else {
                        kept.push_back(c);
                    }
                }
                q.entries = kept;
            }
        }
        let n = removed.len();
        for c in removed {
            let Some(buf) = c.buf else { continue };
            let recv = c.opcode == WcOpcode::Recv;
            let srq = qp.srq.filter(|_| recv).and_then(|s| self.srqs.get_mut(&s));
            match srq {
                Some(s) if s.wqes.len() < s.max_wr as usize && self.pools.lend(buf).is_ok() => {
                    s.wqes.push_back(RecvWqe {
                        wr_id: c.wr_id,
                        buf,
                    });
                }
                _ => {
                    let _ = self.pools.free(buf);
                }
            }
        }
        n
    }

    /// Queues `c` on `cq` (a buffer it carries is the consumer's again); returns true when
    /// the CQ was already at its depth (an overflow; the entry is still queued).
    pub(super) fn push_completion(&mut self, cq: CqId, c: Completion) -> bool {
        if let Some(b) = c.buf {
            self.pools.reclaim(b);
        }
        let Some(q) = self.cqs.get_mut(&cq) else {
            return false;
        };
        let overflow = q.entries.len() >= q.depth;
        q.entries.push_back(c);
        overflow
    }

    /// Takes the next receive WQE of `srq`, and whether that took it below its armed limit
    /// (which disarms it: `SrqLimitReached` is owed).
    pub(super) fn take_srq_recv(&mut self, srq: SrqId) -> Option<(RecvWqe, bool)> {
        let s = self.srqs.get_mut(&srq)?;
        let w = s.wqes.pop_front()?;
        let limit_reached = s.limit > 0 && (s.wqes.len() as u32) < s.limit;
        if limit_reached {
            s.limit = 0;
        }
        Some((w, limit_reached))
    }

    /// Puts `wqe` back at the front of the queue it was taken from (an SRQ's or `qp`'s own).
    pub(super) fn return_recv(&mut self, qp: &mut Qp, wqe: RecvWqe) {
        match qp.srq.and_then(|s| self.srqs.get_mut(&s)) {
            Some(srq) => srq.wqes.push_front(wqe),
            None => qp.rq.push_front(wqe),
        }
    }
}

/// The QPs by number, and where the QPN sequence stands.
#[derive(Debug)]
pub(super) struct QpTable {
    /// The QPs, boxed: a `Qp` is some 360 bytes, and a map holds up to about twice as many
    /// slots as entries, so inline values would double an idle QP's footprint.
    qps: IdMap<QpNum, Box<Qp>>,
    qpns: QpnSequence,
}

impl QpTable {
    /// An empty table whose QPNs follow the permutation `seed` picks, each with `worker`'s
    /// index in its low bits.
    pub(super) fn new(seed: u64, worker: WorkerId) -> Self {
        Self {
            qps: IdMap::default(),
            qpns: QpnSequence::new(seed, worker),
        }
    }

    pub(super) fn get(&self, qpn: QpNum) -> Option<&Qp> {
        self.qps.get(&qpn).map(Box::as_ref)
    }

    pub(super) fn get_mut(&mut self, qpn: QpNum) -> Option<&mut Qp> {
        self.qps.get_mut(&qpn).map(Box::as_mut)
    }

    pub(super) fn contains(&self, qpn: QpNum) -> bool {
        self.qps.contains_key(&qpn)
    }

    pub(super) fn len(&self) -> usize {
        self.qps.len()
    }

    pub(super) fn insert(&mut self, qp: Qp) {
        self.qps.insert(qp.num, Box::new(qp));
    }

    pub(super) fn remove(&mut self, qpn: QpNum) -> Option<Box<Qp>> {
        self.qps.remove(&qpn)
    }

    /// True when a QP completes onto `cq`.
    pub(super) fn uses_cq(&self, cq: CqId) -> bool {
        self.qps
            .values()
            .any(|q| q.send_cq == cq || q.recv_cq == cq)
    }

    /// A QPN no QP has, neither 0 nor 1 (the special QPs) nor the multicast QPN: the next
    /// value of the sequence that is free (with the worker's index in its low bits). Fewer
    /// than `max_qps` QPNs are taken, so this takes one try in all but a vanishing fraction
    /// of calls; it is bounded by the sequence's period, the values there are.
    pub(super) fn alloc_qpn(&mut self) -> Option<QpNum> {
        for _ in 0..self.qpns.period() {
            let n = QpNum::new(self.qpns.next());
            if n.get() > 1 && n != MULTICAST_QPN && !self.qps.contains_key(&n) {
                return Some(n);
            }
        }
        None
    }
}

/// The order QPNs are handed out in: a keyed permutation of the QPNs of one worker applied to
/// a counter. The worker's index fills the low `log2(count)` bits of every QPN
/// ([`WorkerId::tag`]); the other `24 - log2(count)` bits are a four-round Feistel network on
/// two halves of `ceil(bits / 2)` bits, walked again while its value is out of range (only
/// with an odd number of bits, where the network's domain is twice the range: about two
/// rounds of it per value). Every value comes once in each period (2^bits steps), so numbers
/// are never reused before the worker's whole share of the space has been, and without the
/// seed the next QPN cannot be told from the last ones (not a cryptographic guarantee: the aim
/// is that a new process never gets an old connection's QPNs and an off-path sender cannot
/// count them, as it could from the sequential 0x11, 0x12, ...). One worker
/// ([`WorkerId::SINGLE`]): 24 bits on two 12-bit halves, no walk.
#[derive(Debug, Clone)]
pub(super) struct QpnSequence {
    keys: [u64; 4],
    counter: u32,
    /// Bits of the permuted value: 24 less the worker bits.
    bits: u32,
    /// Bits of each Feistel half: `ceil(bits / 2)`.
    half_bits: u32,
    worker: WorkerId,
}

impl QpnSequence {
    /// Bits of a QPN.
    const QPN_BITS: u32 = 24;

    pub(super) fn new(seed: u64, worker: WorkerId) -> Self {
        let mut k = seed;
        let keys = std::array::from_fn(|_| {
            k = splitmix64(k);
            k
        });
        let bits = Self::QPN_BITS - worker.count().bits();
        // The start of the counter is keyed too, so two seeds do not share a first value.
        let counter = (splitmix64(k) as u32) & ((1 << bits) - 1);
        Self {
            keys,
            counter,
            bits,
            half_bits: bits.div_ceil(2),
            worker,
        }
    }

    /// Steps before a value comes again: how many QPNs the worker has.
    pub(super) fn period(&self) -> u32 {
        1 << self.bits
    }

    /// The next 24-bit value.
    pub(super) fn next(&mut self) -> u32 {
        let x = self.counter;
        self.counter = (self.counter + 1) & (self.period() - 1);
        self.worker.tag(self.permute_in_range(x))
    }

    /// The Feistel network walked until its value is below the period (cycle walking: a
    /// bijection of `0..period`). The walk ends at the latest back at `x` itself, within the
    /// network's cycle, so within its domain's size.
    fn permute_in_range(&self, x: u32) -> u32 {
        let period = self.period();
        let mut y = x;
        for _ in 0..1u32 << (2 * self.half_bits) {
            y = self.permute(y);
            if y < period {
                return y;
            }
        }
        x
    }

    fn permute(&self, x: u32) -> u32 {
        let half = self.half_bits;
        let mask = (1 << half) - 1;
        let (mut l, mut r) = (x >> half, x & mask);
        for k in self.keys {
            let f = (splitmix64(u64::from(r) ^ k) as u32) & mask;
            (l, r) = (r, l ^ f);
        }
        (l << half) | r
    }
}

/// The SplitMix64 step (a bijective 64-bit mixer).
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What a receive completion reports besides its WQE and status.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct RecvInfo {
    pub(super) byte_len: u32,
    pub(super) imm: Option<u32>,
    pub(super) src_qp: Option<QpNum>,
    pub(super) src_port: Option<u16>,
    pub(super) grh: bool,
    /// The sender's LID and SL (InfiniBand link).
    pub(super) slid: Option<crate::verbs::Lid>,
    pub(super) sl: crate::verbs::Sl,
}
