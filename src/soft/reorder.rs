//! The responder's hold of requests that arrive out of sequence, and how long it waits for a
//! gap to fill before it NAKs.
//!
//! An RC responder accepts requests in PSN order only; rxe drops one that arrives early and
//! NAKs the PSN it expects, and the requester goes back to resend everything from there. On
//! a path that reorders (jitter, several links), nothing was lost: the missing request
//! arrives a moment later, and every go-back-N is spurious. So this responder holds early
//! requests ([`Held`]) and takes them in order when the gap before them fills, as if the
//! path had delivered them in order; and it waits for a gap to fill before NAKing, for a
//! time it learns from the path ([`ReorderWindow`]). On the wire nothing changes: ACKs and
//! NAKs mean what IBTA says (everything before the PSN arrived; the PSN is expected), and a
//! requester cannot tell the hold from a path that delivers a little later.
//!
//! What is held is bounded per QP (requests at most [`MAX_HOLD_DISTANCE`] PSNs ahead) and
//! per device ([`HoldBudget`]: a count of packets, the [`SoftConfig`](super::SoftConfig)'s
//! `reorder_hold_packets`); a request that does not fit is dropped as before, and the NAK
//! goes out at once.
//!
//! Only a QP whose path was seen to reorder holds ([`ReorderWindow::reorders`]: one of its
//! NAKs proved spurious); until then it drops what comes early and NAKs at once, as rxe, so
//! on a path that does not reorder a blind sender's guess must still hit the one expected PSN.
//!
//! A request held ahead may be made up by a blind sender who guessed a PSN in that range
//! (where rxe takes only the one expected PSN): one that does not follow the message in
//! progress when its turn comes is dropped, not taken for an invalid request, and two
//! different copies of one PSN are both dropped, so a made-up one never breaks the
//! connection; one that does follow is taken if its turn comes before the peer's own copy
//! arrives.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::verbs::Psn;
use crate::wire::roce::RocePacket;

/// Requests at most this many PSNs ahead of the expected one are held (the widest send
/// window of this provider's requester).
pub(super) const MAX_HOLD_DISTANCE: u32 = 1024;
/// The NAK wait never grows beyond this.
pub(super) const MAX_REORDER_WINDOW: Duration = Duration::from_millis(64);
/// NAKs that proved needed (the gap filled only with the resend) before the NAK wait halves.
const NEEDED_NAKS_PER_DECAY: u8 = 16;
/// NAKed gaps remembered while their duplicate may still come (the resend of a spurious NAK
/// comes an RTT later, and more gaps may be NAKed meanwhile).
const NAKS_REMEMBERED: usize = 4;
/// A NAK wait shorter than this is none.
const MIN_REORDER_WINDOW: Duration = Duration::from_micros(50);
/// Slots a QP with nothing held keeps room for.
const SLOTS_KEPT: usize = 64;
/// Room for one held request: the largest RC request datagram at path MTU 4096 (BTH, ImmDt,
/// 4,096 bytes of payload, pad, ICRC), rounded up.
pub(super) const HELD_BYTES: usize = 4096 + 64;

/// Where a held request's bytes are in the [`HoldBudget`]'s arena.
#[derive(Debug, Clone, Copy)]
pub(super) struct HeldRef {
    slot: u32,
    len: u32,
}

/// The device's room for held requests: an arena of `max` slots of [`HELD_BYTES`], taken
/// when first needed (or at [`commit`](Self::commit)), and the free slots.
#[derive(Debug)]
pub(super) struct HoldBudget {
    /// Most packets held at once, over all QPs.
    max: usize,
    /// `max` slots, or empty before the first is needed.
    arena: Vec<u8>,
    /// Slots not in use (all of them before the arena exists).
    free: Vec<u32>,
}

impl HoldBudget {
    pub(super) fn new(max: usize) -> Self {
        Self {
            max,
            arena: Vec::new(),
            free: Vec::new(),
        }
    }

    /// Bytes the arena of `packets` slots takes.
    pub(super) const fn bytes_for(packets: usize) -> usize {
        packets * HELD_BYTES
    }

    /// Takes the arena now and writes it through ([`commit`](crate::verbs::pool::commit)),
    /// so that its memory is the process's from now on, not at the first reordering.
    pub(super) fn commit(&mut self) {
        self.ensure_arena();
        crate::verbs::pool::commit(&mut self.arena);
    }

    fn ensure_arena(&mut self) {
        if self.arena.is_empty() && self.max > 0 {
            self.arena = vec![0; Self::bytes_for(self.max)];
            self.free = (0..u32::try_from(self.max).unwrap_or(u32::MAX))
                .rev()
                .collect();
        }
    }

    /// Packets held now, over all QPs.
    pub(super) fn held(&self) -> usize {
        if self.arena.is_empty() {
            0
        } else {
            self.max - self.free.len()
        }
    }

    /// A copy of `datagram` to hold, or `None` when no slot is free (or it could not be an
    /// RC request).
    fn take(&mut self, datagram: &[u8]) -> Option<HeldRef> {
        if datagram.len() > HELD_BYTES {
            return None;
        }
        self.ensure_arena();
        let slot = self.free.pop()?;
        let at = slot as usize * HELD_BYTES;
        self.arena
            .get_mut(at..at + datagram.len())?
            .copy_from_slice(datagram);
        Some(HeldRef {
            slot,
            len: u32::try_from(datagram.len()).unwrap_or(0),
        })
    }

    /// The bytes of a held request.
    fn bytes(&self, r: HeldRef) -> &[u8] {
        let at = r.slot as usize * HELD_BYTES;
        self.arena.get(at..at + r.len as usize).unwrap_or_default()
    }

    /// A held request's slot comes back (its bytes no longer needed).
    pub(super) fn give_back(&mut self, r: HeldRef) {
        self.free.push(r.slot);
    }

    /// A held request's bytes, copied into `out` (replacing its contents), and its slot back.
    pub(super) fn release(&mut self, r: HeldRef, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(self.bytes(r));
        self.give_back(r);
    }
}

/// True when the datagrams `a` and `b` carry the same request. Copies of one request may
/// differ where a sender or the path may change them: the AckReq bit (a resend asks anew), the
/// ECN bits, and the ICRC (it covers the IP ID, which a sender may vary per copy).
fn same_request(a: &[u8], b: &[u8]) -> bool {
    match (RocePacket::parse(a), RocePacket::parse(b)) {
        (Ok(x), Ok(y)) => {
            (
                x.bth.opcode,
                x.bth.solicited,
                x.bth.pad_count,
                x.bth.psn,
                x.imm,
                x.payload,
            ) == (
                y.bth.opcode,
                y.bth.solicited,
                y.bth.pad_count,
                y.bth.psn,
                y.imm,
                y.payload,
            )
        }
        _ => false,
    }
}

/// What became of a request that arrived out of sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Hold {
    /// Held until the gap before it fills.
    Held,
    /// Held already, the same bytes (a duplicate): dropped.
    Duplicate,
    /// Held already with other bytes: one of the two was made up by someone other than the
    /// peer, and neither can be told for the peer's, so both are dropped.
    Conflict,
    /// No room (too far ahead, or the device's budget spent): dropped.
    NoRoom,
}

/// One QP's held requests.
#[derive(Debug, Default)]
pub(super) struct Held {
    /// Slot `i` holds the request with PSN `expected + 1 + i` and when it arrived.
    slots: VecDeque<Option<(HeldRef, Instant)>>,
}

impl Held {
    /// Holds `datagram`, the request `ahead` PSNs past the expected one (at least 1).
    pub(super) fn hold(
        &mut self,
        ahead: u32,
        datagram: &[u8],
        now: Instant,
        budget: &mut HoldBudget,
    ) -> Hold {
        if ahead == 0 || ahead > MAX_HOLD_DISTANCE {
            return Hold::NoRoom;
        }
        let i = (ahead - 1) as usize;
        if let Some(slot) = self.slots.get_mut(i) {
            match slot.take() {
                Some((r, t)) if same_request(budget.bytes(r), datagram) => {
                    *slot = Some((r, t));
                    return Hold::Duplicate;
                }
                Some((r, _)) => {
                    budget.give_back(r);
                    return Hold::Conflict;
                }
                None => {}
            }
        }
        let Some(b) = budget.take(datagram) else {
            return Hold::NoRoom;
        };
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, || None);
        }
        self.slots[i] = Some((b, now));
        Hold::Held
    }

    /// The expected PSN moved on by one: the request held for the new expected PSN, if any
    /// (its slot goes back with [`HoldBudget::release`]).
    pub(super) fn advance(&mut self) -> Option<HeldRef> {
        let slot = self.slots.pop_front();
        if self.slots.is_empty() && self.slots.capacity() > SLOTS_KEPT {
            // A QP that held many requests once does not keep the room for them.
            self.slots = VecDeque::new();
        }
        slot.flatten().map(|(b, _)| b)
    }

    /// When the earliest request still held arrived: since then the gap before it is open.
    pub(super) fn oldest_arrival(&self) -> Option<Instant> {
        self.slots.iter().flatten().map(|(_, t)| *t).min()
    }

    /// Gives every held request back (the QP leaves the states that receive).
    pub(super) fn clear(&mut self, budget: &mut HoldBudget) {
        for (b, _) in std::mem::take(&mut self.slots).into_iter().flatten() {
            budget.give_back(b);
        }
    }
}

/// How long a gap may stay open before the responder NAKs it: zero at first (a NAK at once,
/// as rxe sends it), then learnt from what the requester resends.
///
/// - A NAK was spurious when the request it named arrives again, as the requester's resend,
///   after its first copy filled the gap well before a resend could have (in less than half
///   the time from the NAK to the second copy): the path reordered it. The wait then grows to
///   a quarter more than that gap took to fill.
/// - A gap that filled before its NAK, followed by a resend of what it let through, shows the
///   requester's timer ran out first: the wait is too long for it, and halves.
/// - A NAKed gap with no second copy by the time [`NAKS_REMEMBERED`] later NAKed gaps have
///   filled was a loss; after [`NEEDED_NAKS_PER_DECAY`] of those in a row the wait halves, so
///   that a path that stopped reordering recovers its losses fast again.
#[derive(Debug, Default)]
pub(super) struct ReorderWindow {
    wait: Duration,
    /// A NAK proved spurious on this QP: its path reorders, and it holds what arrives ahead
    /// from then on (until then it drops it, as rxe does).
    reorders: bool,
    /// The gaps last NAKed that filled since.
    naked: VecDeque<NakedGap>,
    /// The PSNs the last gap that filled before its NAK let through (first, last).
    unnaked: Option<(Psn, Psn)>,
    /// NAKs in a row that were needed.
    needed: u8,
}

/// A gap that was NAKed and filled since.
#[derive(Debug, Clone, Copy)]
struct NakedGap {
    /// The PSN that filled it.
    psn: Psn,
    /// How long it was open.
    took: Duration,
    /// When its NAK went out.
    naked: Instant,
    /// When it filled.
    filled: Instant,
}

/// A gap that filled.
#[derive(Debug, Clone, Copy)]
pub(super) struct FilledGap {
    /// The PSN that filled it, and the last one delivered with it.
    pub(super) psn: Psn,
    pub(super) through: Psn,
    /// When it opened, and when its NAK went out (if it did).
    pub(super) opened: Instant,
    pub(super) naked: Option<Instant>,
}

/// What a second copy of a delivered request showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Resent {
    /// The NAK of the gap it filled was spurious: the wait grew.
    SpuriousNak,
    /// The requester resent what a gap that filled before its NAK let through: the wait
    /// halved.
    WaitTooLong,
    /// Nothing.
    Nothing,
}

impl ReorderWindow {
    /// How long a gap may stay open before it is NAKed.
    pub(super) fn wait(&self) -> Duration {
        self.wait
    }

    /// Whether a NAK has proved spurious on this QP (its path reorders): from then on it
    /// holds requests that arrive ahead of a gap.
    pub(super) fn reorders(&self) -> bool {
        self.reorders
    }

    /// A gap filled at `now`.
    pub(super) fn filled(&mut self, gap: FilledGap, now: Instant) {
        let Some(naked) = gap.naked else {
            self.unnaked = Some((gap.psn, gap.through));
            return;
        };
        self.naked.push_back(NakedGap {
            psn: gap.psn,
            took: now.saturating_duration_since(gap.opened),
            naked,
            filled: now,
        });
        if self.naked.len() > NAKS_REMEMBERED && self.naked.pop_front().is_some() {
            self.needed += 1;
            if self.needed >= NEEDED_NAKS_PER_DECAY {
                self.needed = 0;
                self.halve();
            }
        }
    }

    /// `psn`, delivered before, arrived again at `now`.
    pub(super) fn resent(&mut self, psn: Psn, now: Instant) -> Resent {
        if let Some(i) = self.naked.iter().position(|g| g.psn == psn) {
            let Some(g) = self.naked.remove(i) else {
                return Resent::Nothing;
            };
            let first = g.filled.saturating_duration_since(g.naked);
            let second = now.saturating_duration_since(g.naked);
            if first * 2 >= second {
                // The first copy may have been a resend too (its ACK lost, say).
                return Resent::Nothing;
            }
            self.needed = 0;
            self.reorders = true;
            self.wait = self.wait.max((g.took + g.took / 4).min(MAX_REORDER_WINDOW));
            return Resent::SpuriousNak;
        }
        match self.unnaked {
            Some((first, last)) if psn.diff(first) >= 0 && last.diff(psn) >= 0 => {
                self.unnaked = None;
                self.halve();
                Resent::WaitTooLong
            }
            _ => Resent::Nothing,
        }
    }

    fn halve(&mut self) {
        self.wait /= 2;
        if self.wait < MIN_REORDER_WINDOW {
            self.wait = Duration::ZERO;
        }
    }
}

/// The datagram of the request `bth` (no RETH, AETH, DETH or ImmDt) with `payload`, from and
/// to `ip`'s addresses and the UDP `ports` (source, destination): what tests hold or forge.
#[cfg(test)]
pub(super) fn request_datagram(
    bth: crate::wire::bth::Bth,
    ip: &crate::wire::icrc::IpHeaderInfo,
    ports: (u16, u16),
    payload: &[u8],
) -> Vec<u8> {
    let repr = crate::wire::roce::RoceRepr {
        bth,
        reth: None,
        aeth: None,
        deth: None,
        imm: None,
    };
    let mut out = Vec::new();
    repr.emit(payload, ip, ports.0, ports.1, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An RC SEND_ONLY datagram with PSN `psn` and `payload`; `copy` makes another copy of
    /// the same request (AckReq set, another IP ID: another ICRC).
    fn request(psn: u32, payload: &[u8], copy: bool) -> Vec<u8> {
        use crate::wire::bth::{Bth, Opcode};
        use crate::wire::icrc::IpHeaderInfo;
        let mut bth = Bth::new(Opcode::RC_SEND_ONLY, 0x12, psn);
        bth.ack_req = copy;
        let ip = IpHeaderInfo::V4 {
            src: [198, 18, 0, 1].into(),
            dst: [198, 18, 0, 2].into(),
            identification: u16::from(copy) * 7,
            dont_fragment: true,
        };
        request_datagram(bth, &ip, (4791, 4791), payload)
    }

    #[test]
    fn held_requests_come_back_in_order_and_the_budget_is_shared() {
        let now = Instant::now();
        let mut budget = HoldBudget::new(3);
        let mut h = Held::default();
        let two = request(2, b"two", false);
        assert_eq!(h.hold(2, &two, now, &mut budget), Hold::Held);
        assert_eq!(
            h.hold(2, &request(2, b"two", true), now, &mut budget),
            Hold::Duplicate,
            "a resend with AckReq and another ICRC is the same request"
        );
        assert_eq!(
            h.hold(4, &request(4, b"four", false), now, &mut budget),
            Hold::Held
        );
        assert_eq!(
            h.hold(4, &request(4, b"FOUR", false), now, &mut budget),
            Hold::Conflict
        );
        assert_eq!(budget.held(), 1, "neither copy of a conflict is kept");
        assert_eq!(
            h.hold(0, &request(0, b"", false), now, &mut budget),
            Hold::NoRoom
        );
        let far = request(MAX_HOLD_DISTANCE + 1, b"far", false);
        assert_eq!(
            h.hold(MAX_HOLD_DISTANCE + 1, &far, now, &mut budget),
            Hold::NoRoom
        );
        let later = now + Duration::from_millis(1);
        assert_eq!(
            h.hold(3, &request(3, b"three", false), later, &mut budget),
            Hold::Held
        );
        let mut other = Held::default();
        assert_eq!(
            other.hold(1, &request(1, b"x", false), now, &mut budget),
            Hold::Held
        );
        assert_eq!(
            other.hold(2, &request(2, b"y", false), now, &mut budget),
            Hold::NoRoom
        );
        assert_eq!(budget.held(), 3);
        assert_eq!(h.oldest_arrival(), Some(now));
        // Expected +1: slot for "two" is next but one.
        assert!(h.advance().is_none());
        let mut b = Vec::new();
        budget.release(h.advance().unwrap(), &mut b);
        assert_eq!(b, two);
        assert_eq!(h.oldest_arrival(), Some(later));
        h.clear(&mut budget);
        other.clear(&mut budget);
        assert!(h.oldest_arrival().is_none() && other.oldest_arrival().is_none());
        assert_eq!(budget.held(), 0);
        let too_big = vec![0; HELD_BYTES + 1];
        assert_eq!(h.hold(1, &too_big, now, &mut budget), Hold::NoRoom);
    }

    #[test]
    fn the_arena_is_taken_when_first_needed_or_committed() {
        let mut lazy = HoldBudget::new(8);
        assert!(lazy.arena.is_empty());
        let mut h = Held::default();
        let r = request(1, b"one", false);
        assert_eq!(h.hold(1, &r, Instant::now(), &mut lazy), Hold::Held);
        assert_eq!(lazy.arena.len(), HoldBudget::bytes_for(8));
        let mut committed = HoldBudget::new(8);
        committed.commit();
        assert_eq!(committed.arena.len(), 8 * HELD_BYTES);
        assert_eq!(committed.held(), 0);
        let mut none = HoldBudget::new(0);
        none.commit();
        assert!(none.arena.is_empty());
    }

    #[test]
    fn the_wait_grows_on_a_spurious_nak_and_shrinks_when_it_proves_too_long() {
        let ms = Duration::from_millis(1);
        let t0 = Instant::now();
        let gap = |psn: u32, naked: Option<Instant>| FilledGap {
            psn: Psn::new(psn),
            through: Psn::new(psn + 3),
            opened: t0,
            naked,
        };
        let mut w = ReorderWindow::default();
        assert_eq!(w.wait(), Duration::ZERO);
        // NAKed at once; the first copy fills 4 ms later, the resend comes at 10 ms.
        w.filled(gap(7, Some(t0)), t0 + 4 * ms);
        w.filled(gap(20, Some(t0)), t0 + 2 * ms);
        assert_eq!(w.resent(Psn::new(9), t0 + 10 * ms), Resent::Nothing);
        assert_eq!(w.resent(Psn::new(7), t0 + 10 * ms), Resent::SpuriousNak);
        assert_eq!(w.wait(), 5 * ms);
        assert_eq!(w.resent(Psn::new(7), t0 + 11 * ms), Resent::Nothing, "once");
        // A second copy soon after the first says nothing: both may be resends.
        assert_eq!(w.resent(Psn::new(20), t0 + 3 * ms), Resent::Nothing);
        assert_eq!(w.wait(), 5 * ms);
        w.filled(gap(30, Some(t0)), t0 + Duration::from_secs(1));
        assert_eq!(
            w.resent(Psn::new(30), t0 + Duration::from_secs(3)),
            Resent::SpuriousNak
        );
        assert_eq!(w.wait(), MAX_REORDER_WINDOW);
        // A gap that filled before its NAK, then the requester resent what it let through.
        w.filled(gap(40, None), t0);
        assert_eq!(w.resent(Psn::new(44), t0), Resent::Nothing);
        assert_eq!(w.resent(Psn::new(42), t0), Resent::WaitTooLong);
        assert_eq!(w.wait(), MAX_REORDER_WINDOW / 2);
        assert_eq!(w.resent(Psn::new(43), t0), Resent::Nothing, "once");
        // Needed NAKs: each one pushed out of memory without its second copy counts.
        let n = NAKS_REMEMBERED + usize::from(NEEDED_NAKS_PER_DECAY) - 1;
        for i in 0..n as u32 {
            w.filled(gap(100 + i, Some(t0)), t0 + ms);
        }
        assert_eq!(w.wait(), MAX_REORDER_WINDOW / 2);
        w.filled(gap(99, Some(t0)), t0 + ms);
        assert_eq!(w.wait(), MAX_REORDER_WINDOW / 4);
    }
}
