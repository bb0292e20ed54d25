//! What a REQ may cost: the per-source REQ rate limit, the bounds on what a REQ's sender may
//! ask of us (how long and how often we resend our REP on its behalf), and the indexes that
//! find a duplicate or stale REQ's id in O(log n).
//!
//! # Bounds
//!
//! - REQs are rate-limited per source GID by a token bucket ([`ReqRateLimit`]: a burst, then a
//!   steady rate); the excess is dropped unanswered and counted in
//!   [`CmStats::req_rate_limited`](super::CmStats::req_rate_limited). At most
//!   [`MAX_REQ_SOURCES`] sources are tracked; a new one beyond that replaces the least recently
//!   seen (counted in [`CmStats::req_sources_evicted`](super::CmStats::req_sources_evicted)).
//! - A passive id resends its REP at most [`MAX_PASSIVE_CM_RETRIES`] times if its source GID
//!   has never answered us (no MAD from it ever named one of our ids as only a receiver of
//!   our MADs can: it may be a spoofed victim), else as often as the REQ asks (at most 15, the
//!   field's width, as Linux does: a peer on a lossy path keeps the spec's retries), at an
//!   interval of `4.096 µs · 2^t` with the REQ's Local CM Response Timeout `t` clamped to
//!   [`PASSIVE_TIMEOUT_EXP`] (64 ms ..= 4096 ms as Linux `cm_convert_to_ms` rounds them),
//!   and then sends one REJ (Timeout). So one admitted REQ from an unconfirmed source draws at
//!   most [`MAX_MADS_PER_REQ`] MADs back, spread over at least `MAX_PASSIVE_CM_RETRIES` ·
//!   64 ms (from a confirmed peer at most 17, over at least 960 ms), and its id lives at most
//!   16 · 4096 ms before TimeWait; a duplicate REQ draws at most
//!   one MAD (the REP again, or a REJ in TimeWait) and is rate-limited like any REQ. The MADs
//!   a source GID that never answered us (a spoofed victim) can be sent are therefore at most
//!   `MAX_MADS_PER_REQ · (burst + rate · seconds)`.
//! - An MRA extends a wait by at most twice `conv(`[`MAX_MRA_TIMEOUT_EXP`]`)` (131 s).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::RangeInclusive;
use std::time::{Duration, Instant};

use crate::verbs::{Gid, QpNum};

/// Most times a passive id resends its REP (or DREQ) when its source GID has never answered
/// us, whatever the REQ's Max CM Retries asks.
pub const MAX_PASSIVE_CM_RETRIES: u8 = 3;

/// The range the REQ's Local CM Response Timeout exponent is clamped to before it becomes the
/// REP's retransmit interval: 14 (64 ms) ..= 20 (4096 ms, rdma_cm's and Linux IPoIB's value).
pub const PASSIVE_TIMEOUT_EXP: RangeInclusive<u8> = 14..=20;

/// The most MADs one admitted REQ from a source that never answered us draws back: the REP,
/// its resends and a final REJ.
pub const MAX_MADS_PER_REQ: u64 = 2 + MAX_PASSIVE_CM_RETRIES as u64;

/// Largest service timeout (of an MRA) and ACK timeout exponent an MRA's extension uses: 24,
/// what the Linux CM sends in its delayed MRA.
pub const MAX_MRA_TIMEOUT_EXP: u8 = 24;

/// Source GIDs whose REQ rate is tracked at once.
pub const MAX_REQ_SOURCES: usize = 8192;

/// The token bucket of every source GID's REQs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReqRateLimit {
    /// REQs a source may send at once (the bucket's size).
    pub burst: u32,
    /// REQs per second a source may send on average (the bucket's refill rate).
    pub per_second: u32,
}

impl Default for ReqRateLimit {
    /// A burst of 32 REQs, then 16 a second: far above what one node's connections need (one
    /// REQ per connection, resent every few seconds at most).
    fn default() -> Self {
        Self {
            burst: 32,
            per_second: 16,
        }
    }
}

/// One source's bucket.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Tokens, in billionths of a REQ.
    nano_tokens: u128,
    /// When `nano_tokens` was last brought up to date.
    at: Instant,
    /// Its key in the LRU order.
    seq: u64,
    /// A MAD from this GID named one of our ids (it receives what we send it).
    confirmed: bool,
}

const NANO: u128 = 1_000_000_000;

/// Per-source token buckets with LRU replacement at [`MAX_REQ_SOURCES`].
#[derive(Debug, Default)]
pub(super) struct ReqLimiter {
    buckets: HashMap<Gid, Bucket>,
    /// Sources by last use (oldest first).
    lru: BTreeMap<u64, Gid>,
    next_seq: u64,
}

/// What [`ReqLimiter::admit`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Admission {
    /// The REQ may be handled.
    pub(super) admitted: bool,
    /// A tracked source was forgotten to make room for this one.
    pub(super) evicted_source: bool,
}

impl ReqLimiter {
    /// Takes a token from `from`'s bucket at `now` (creating a full one for a new source).
    pub(super) fn admit(&mut self, limit: ReqRateLimit, now: Instant, from: Gid) -> Admission {
        let full = u128::from(limit.burst) * NANO;
        let (bucket, evicted_source) = self.touch(full, now, from);
        let elapsed = now.saturating_duration_since(bucket.at).as_nanos();
        bucket.nano_tokens = bucket
            .nano_tokens
            .saturating_add(elapsed.saturating_mul(u128::from(limit.per_second)))
            .min(full);
        bucket.at = now;
        let admitted = bucket.nano_tokens >= NANO;
        if admitted {
            bucket.nano_tokens -= NANO;
        }
        Admission {
            admitted,
            evicted_source,
        }
    }

    /// A MAD from `from` named one of our ids: it receives what we send it. Whether a
    /// tracked source was forgotten to make room for it.
    pub(super) fn confirm(&mut self, limit: ReqRateLimit, now: Instant, from: Gid) -> bool {
        let (bucket, evicted) = self.touch(u128::from(limit.burst) * NANO, now, from);
        bucket.confirmed = true;
        evicted
    }

    /// Whether `from` is confirmed ([`confirm`](Self::confirm)) and still tracked.
    pub(super) fn confirmed(&self, from: Gid) -> bool {
        self.buckets.get(&from).is_some_and(|b| b.confirmed)
    }

    /// `from`'s bucket, made the most recently used (a new one holds `full` tokens), and
    /// whether the least recently used source was forgotten for it.
    fn touch(&mut self, full: u128, now: Instant, from: Gid) -> (&mut Bucket, bool) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut evicted = false;
        if let Some(b) = self.buckets.get(&from) {
            self.lru.remove(&b.seq);
        } else if self.buckets.len() >= MAX_REQ_SOURCES {
            if let Some((_, old)) = self.lru.pop_first() {
                self.buckets.remove(&old);
                evicted = true;
            }
        }
        self.lru.insert(seq, from);
        let b = self.buckets.entry(from).or_insert(Bucket {
            nano_tokens: full,
            at: now,
            seq,
            confirmed: false,
        });
        b.seq = seq;
        (b, evicted)
    }

    /// Sources tracked.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        debug_assert_eq!(self.buckets.len(), self.lru.len());
        self.buckets.len()
    }
}

/// The REP retransmit interval and retry count of a passive id, from its REQ's Local CM
/// Response Timeout and Max CM Retries, clamped (the retries only for a source that is not
/// `confirmed`); and whether either was clamped.
pub(super) fn passive_retx(
    local_cm_response_timeout: u8,
    max_cm_retries: u8,
    confirmed: bool,
) -> (Duration, u8, bool) {
    let exp =
        local_cm_response_timeout.clamp(*PASSIVE_TIMEOUT_EXP.start(), *PASSIVE_TIMEOUT_EXP.end());
    let cap = if confirmed {
        15
    } else {
        MAX_PASSIVE_CM_RETRIES
    };
    let retries = max_cm_retries.min(cap);
    let clamped = exp != local_cm_response_timeout || retries != max_cm_retries;
    (
        Duration::from_millis(crate::wire::cm::cm_timeout_ms(exp)),
        retries,
        clamped,
    )
}

/// Lookups by what the peer's MADs name, kept beside the id table.
///
/// Invariant: `passive` holds exactly the passive ids by (remote CA GUID, remote comm id)
/// (the first id of a pair, as a duplicate never gets one), `by_qpn` every id whose remote
/// QPN is known, by (remote CA GUID, remote QPN, our id).
#[derive(Debug, Default)]
pub(super) struct RemoteIndex {
    passive: HashMap<(u64, u32), u32>,
    by_qpn: BTreeSet<(u64, u32, u32)>,
}

impl RemoteIndex {
    /// Our passive id for the peer's (CA GUID, comm id).
    pub(super) fn passive(&self, ca_guid: u64, comm_id: u32) -> Option<u32> {
        self.passive.get(&(ca_guid, comm_id)).copied()
    }

    /// Our ids whose peer is (CA GUID, QPN).
    pub(super) fn by_qpn(&self, ca_guid: u64, qpn: QpNum) -> impl Iterator<Item = u32> + '_ {
        let q = qpn.get();
        self.by_qpn
            .range((ca_guid, q, 0)..=(ca_guid, q, u32::MAX))
            .map(|&(_, _, id)| id)
    }

    pub(super) fn insert_passive(&mut self, ca_guid: u64, comm_id: u32, id: u32) {
        self.passive.entry((ca_guid, comm_id)).or_insert(id);
    }

    pub(super) fn insert_qpn(&mut self, ca_guid: u64, qpn: QpNum, id: u32) {
        self.by_qpn.insert((ca_guid, qpn.get(), id));
    }

    /// Forgets id `id`, which had these remote names.
    pub(super) fn remove(
        &mut self,
        id: u32,
        ca_guid: u64,
        comm_id: Option<u32>,
        qpn: Option<QpNum>,
    ) {
        if let Some(c) = comm_id {
            if self.passive.get(&(ca_guid, c)) == Some(&id) {
                self.passive.remove(&(ca_guid, c));
            }
        }
        if let Some(q) = qpn {
            self.by_qpn.remove(&(ca_guid, q.get(), id));
        }
    }

    /// Entries (for the tests' invariant checks).
    #[cfg(test)]
    pub(super) fn len(&self) -> (usize, usize) {
        (self.passive.len(), self.by_qpn.len())
    }
}
