//! A hierarchical timer wheel: O(1) insert and cancel, expiry that skips empty time.
//!
//! The daemon keeps one timer per RX connection (stale-peer reaping), plus CM retries, drain
//! watchdogs and neighbour ageing: tens of thousands of timers, nearly all of which are
//! rescheduled or cancelled long before they fire. The wheel is the hashed-and-hierarchical
//! design of Varghese & Lauck (as in Linux `kernel/time/timer.c` and tokio's time driver):
//!
//! - time is counted in **ticks** of a fixed resolution from a `start` instant; a deadline is
//!   rounded **up** to the next tick, so a timer never fires early;
//! - [`NUM_LEVELS`] levels of [`SLOTS_PER_LEVEL`] slots; a slot of level `L` spans
//!   `64^L` ticks, so the wheel covers `64^6 = 2^36` ticks (about 795 days at 1 ms);
//! - a timer lives in the level of the highest 6-bit group in which its tick differs from the
//!   wheel's current tick; when the wheel reaches a higher-level slot, its timers cascade to
//!   lower levels (or fire);
//! - deadlines further away than the top level clamp into the top level, in the slot of their
//!   own tick's top-level digit; that slot is visited once per `2^36` ticks and the timer simply
//!   cascades again, so it is never lost and never early;
//! - timers are stored in a slab (`Vec` + free list) and linked into per-slot intrusive doubly
//!   linked lists by index, so insert and cancel are O(1) and allocate nothing once the slab
//!   has grown to its working size;
//! - each level has a 64-bit occupancy bitmap, so finding the next non-empty slot (for
//!   [`TimerWheel::expire`] after a large jump of `now`, and for [`TimerWheel::poll_timeout`])
//!   is a handful of bit operations per level, never a walk over ticks or timers.
//!
//! The wheel is sans-IO: it never reads a clock. Every call that needs the time takes
//! `now: Instant` from the caller, and `now` is expected not to go backwards (an earlier `now`
//! is treated as the latest one seen).
//!
//! ```
//! use std::time::{Duration, Instant};
//! use ipoib_cm::timer::TimerWheel;
//!
//! let t0 = Instant::now();
//! let mut wheel = TimerWheel::new(t0, Duration::from_millis(1));
//! let retry = wheel.insert(t0 + Duration::from_millis(50), "cm retry");
//! let _reap = wheel.insert(t0 + Duration::from_secs(30), "reap rx");
//! assert_eq!(wheel.poll_timeout(), Some(t0 + Duration::from_millis(50)));
//! assert_eq!(wheel.cancel(retry), Some("cm retry"));
//!
//! let mut fired = Vec::new();
//! wheel.expire(t0 + Duration::from_secs(31), &mut fired);
//! assert_eq!(fired.len(), 1);
//! assert_eq!(fired[0].1, "reap rx");
//! assert!(wheel.is_empty());
//! ```

use std::time::{Duration, Instant};

#[cfg(test)]
mod tests;

/// Bits of tick per level: each level has `2^LEVEL_BITS` slots.
const LEVEL_BITS: u32 = 6;
/// Slots in each level of the wheel.
pub const SLOTS_PER_LEVEL: usize = 1 << LEVEL_BITS;
/// Levels of the wheel. The wheel covers `SLOTS_PER_LEVEL^NUM_LEVELS = 2^36` ticks before
/// far-future timers start to clamp into the top level.
pub const NUM_LEVELS: usize = 6;
/// Ticks covered by the whole wheel (`2^36`).
const WHEEL_SPAN_TICKS: u64 = 1 << (LEVEL_BITS * NUM_LEVELS as u32);
/// Mask of one level's slot digit.
const SLOT_MASK: u64 = (SLOTS_PER_LEVEL as u64) - 1;
/// Index of the list that holds timers already due when inserted.
const OVERDUE_LIST: usize = NUM_LEVELS * SLOTS_PER_LEVEL;
/// Number of intrusive lists: every slot of every level, plus the overdue list.
const NUM_LISTS: usize = OVERDUE_LIST + 1;
/// "No node" in the intrusive links and the free list.
const NIL: usize = usize::MAX;

/// Names a timer in a [`TimerWheel`].
///
/// Ids are generation-checked: once the timer fires, is cancelled or is rescheduled (which
/// hands out a new id), the old id is stale, and a stale id never touches the timer that later
/// reuses the same storage slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimerId {
    index: usize,
    generation: u64,
}

/// A pending timer, linked into one of the wheel's lists.
#[derive(Debug)]
struct Timer<T> {
    value: T,
    /// The deadline as given by the caller.
    deadline: Instant,
    /// The deadline in ticks since `start`, rounded up.
    tick: u64,
    /// Insertion sequence number: orders timers of the same tick.
    seq: u64,
    prev: usize,
    next: usize,
    /// Which list (level * 64 + slot, or [`OVERDUE_LIST`]) the timer is on.
    list: usize,
}

#[derive(Debug)]
enum Entry<T> {
    Vacant { next_free: usize },
    Occupied(Timer<T>),
}

#[derive(Debug)]
struct Node<T> {
    generation: u64,
    entry: Entry<T>,
}

/// Head and tail of an intrusive list.
#[derive(Debug, Clone, Copy)]
struct List {
    head: usize,
    tail: usize,
}

const EMPTY_LIST: List = List {
    head: NIL,
    tail: NIL,
};

/// A hierarchical timer wheel holding payloads of type `T`.
///
/// Calling protocol (sans-IO):
///
/// 1. [`insert`](Self::insert), [`cancel`](Self::cancel) and
///    [`reschedule`](Self::reschedule) at any time, O(1);
/// 2. sleep until [`poll_timeout`](Self::poll_timeout) (or until other I/O arrives);
/// 3. call [`expire`](Self::expire) with the current time and handle what it returns.
///
/// A timer becomes due at the first tick boundary at or after its deadline; `expire(now)`
/// returns every timer due at `now` rounded *down* to a tick. So with a 1 ms tick a deadline
/// of 10.2 ms fires at the first `expire` with `now >= 11 ms`.
#[derive(Debug)]
pub struct TimerWheel<T> {
    start: Instant,
    tick_ns: u128,
    /// The wheel's current tick: every timer with `tick <= elapsed_tick` has been handed out,
    /// except those on the overdue list.
    elapsed_tick: u64,
    /// The latest `now` passed to `expire` (or `start`).
    last_now: Instant,
    nodes: Vec<Node<T>>,
    free_head: usize,
    lists: Vec<List>,
    /// Per level, bit `s` is set when slot `s` is non-empty.
    occupied: [u64; NUM_LEVELS],
    /// Lower bound on the ticks of the overdue list (exact until a cancel).
    overdue_min_tick: u64,
    len: usize,
    next_seq: u64,
    /// Scratch for `expire`: the timers of the slot being processed.
    scratch: Vec<usize>,
    /// Scratch for `expire`: the timers of the slot that fire now.
    firing: Vec<usize>,
}

impl<T> TimerWheel<T> {
    /// Creates an empty wheel whose tick 0 is `start`, with a resolution of `tick`.
    ///
    /// A zero `tick` is taken as 1 ns. Deadlines are rounded up to a whole number of ticks
    /// since `start`; deadlines before `start` count as tick 0.
    pub fn new(start: Instant, tick: Duration) -> Self {
        Self {
            start,
            tick_ns: tick.as_nanos().max(1),
            elapsed_tick: 0,
            last_now: start,
            nodes: Vec::new(),
            free_head: NIL,
            lists: vec![EMPTY_LIST; NUM_LISTS],
            occupied: [0; NUM_LEVELS],
            overdue_min_tick: u64::MAX,
            len: 0,
            next_seq: 0,
            scratch: Vec::new(),
            firing: Vec::new(),
        }
    }

    /// The resolution of the wheel.
    pub fn tick(&self) -> Duration {
        duration_from_nanos(self.tick_ns).unwrap_or(Duration::MAX)
    }

    /// Number of pending timers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no timer is pending.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Schedules `value` for `deadline`, in O(1).
    ///
    /// The timer fires at the first [`expire`](Self::expire) whose `now`, rounded down to a
    /// tick, reaches `deadline` rounded up to a tick. A deadline at or before the last `now`
    /// given to `expire` fires at the next `expire`, whatever its `now`.
    pub fn insert(&mut self, deadline: Instant, value: T) -> TimerId {
        let tick = self.deadline_tick(deadline);
        let seq = self.bump_seq();
        let timer = Timer {
            value,
            deadline,
            tick,
            seq,
            prev: NIL,
            next: NIL,
            list: NIL,
        };
        let index = if self.free_head == NIL {
            self.nodes.push(Node {
                generation: 0,
                entry: Entry::Occupied(timer),
            });
            self.nodes.len() - 1
        } else {
            let index = self.free_head;
            let node = &mut self.nodes[index];
            if let Entry::Vacant { next_free } = node.entry {
                self.free_head = next_free;
            }
            node.entry = Entry::Occupied(timer);
            index
        };
        self.len += 1;
        self.place(index, tick);
        TimerId {
            index,
            generation: self.nodes[index].generation,
        }
    }

    /// Cancels a pending timer in O(1) and returns its value; `None` if `id` is stale (the
    /// timer already fired, was cancelled or was rescheduled).
    pub fn cancel(&mut self, id: TimerId) -> Option<T> {
        self.timer(id)?;
        self.unlink(id.index);
        self.release(id.index)
    }

    /// Moves a pending timer to a new deadline, as [`cancel`](Self::cancel) followed by
    /// [`insert`](Self::insert) of the same value would (in particular, it orders after
    /// timers already scheduled for the same tick). Returns the timer's new id (the old one
    /// becomes stale), or `None` if `id` is stale.
    pub fn reschedule(&mut self, id: TimerId, deadline: Instant) -> Option<TimerId> {
        self.timer(id)?;
        self.unlink(id.index);
        let tick = self.deadline_tick(deadline);
        let seq = self.bump_seq();
        let node = &mut self.nodes[id.index];
        node.generation = node.generation.wrapping_add(1);
        let generation = node.generation;
        if let Entry::Occupied(timer) = &mut node.entry {
            timer.deadline = deadline;
            timer.tick = tick;
            timer.seq = seq;
        }
        self.place(id.index, tick);
        Some(TimerId {
            index: id.index,
            generation,
        })
    }

    /// The deadline of a pending timer, as given to [`insert`](Self::insert) or
    /// [`reschedule`](Self::reschedule) (not rounded); `None` if `id` is stale.
    pub fn deadline(&self, id: TimerId) -> Option<Instant> {
        self.timer(id).map(|t| t.deadline)
    }

    /// Moves every timer due at `now` to the end of `out` (which is not cleared).
    ///
    /// A timer is due when its deadline, rounded up to a tick, is at or before `now` rounded
    /// down to a tick (a timer never fires early). Timers come out in order of their rounded
    /// deadline; timers of the same tick come out in insertion order (a reschedule counts as a
    /// new insertion). An earlier `now` than a previous call's is treated as that previous
    /// `now`.
    ///
    /// Cost: O(fired + cascaded) plus O([`NUM_LEVELS`]) per non-empty slot reached, however
    /// far `now` jumps: empty slots are skipped via the occupancy bitmaps. Each timer cascades
    /// at most `NUM_LEVELS - 1` times (plus once per `2^36` ticks when clamped). A jump of a
    /// whole wheel span (`2^36` ticks, about 795 days at 1 ms) or more instead re-places every
    /// pending timer once: O(pending) plus sorting what fires.
    pub fn expire(&mut self, now: Instant, out: &mut Vec<(TimerId, T)>) {
        if now > self.last_now {
            self.last_now = now;
        }
        let now_tick = self.now_tick(now).max(self.elapsed_tick);
        if now_tick - self.elapsed_tick >= WHEEL_SPAN_TICKS {
            // Slot-by-slot cascading would revisit clamped far-future timers once per top-level
            // rotation; beyond a whole rotation, rebuilding from scratch is cheaper.
            self.rebuild(now_tick, out);
            return;
        }

        // Timers that were already due when inserted: all earlier than anything on the wheel.
        if self.lists[OVERDUE_LIST].head != NIL {
            self.take_list(OVERDUE_LIST);
            self.overdue_min_tick = u64::MAX;
            self.firing.append(&mut self.scratch);
            self.fire(out);
        }

        while let Some((tick, level, slot)) = self.next_slot() {
            if tick > now_tick {
                break;
            }
            self.elapsed_tick = tick;
            self.take_list(level * SLOTS_PER_LEVEL + slot);
            let mut batch = std::mem::take(&mut self.scratch);
            for &index in &batch {
                let Some(timer_tick) = self.timer_at(index).map(|t| t.tick) else {
                    continue;
                };
                if timer_tick <= tick {
                    self.firing.push(index);
                } else {
                    // Cascade: re-placed relative to the new current tick, so it lands in a
                    // lower level (or, if clamped, back in the top level for a later pass).
                    self.place(index, timer_tick);
                }
            }
            batch.clear();
            self.scratch = batch;
            self.fire(out);
        }
        self.elapsed_tick = now_tick;
    }

    /// Fires every timer due at `now_tick` and re-places the rest relative to it: O(n) plus
    /// sorting what fires.
    fn rebuild(&mut self, now_tick: u64, out: &mut Vec<(TimerId, T)>) {
        for list in 0..NUM_LISTS {
            self.take_list(list);
        }
        self.overdue_min_tick = u64::MAX;
        self.elapsed_tick = now_tick;
        let mut batch = std::mem::take(&mut self.scratch);
        for &index in &batch {
            let Some(tick) = self.timer_at(index).map(|t| t.tick) else {
                continue;
            };
            if tick <= now_tick {
                self.firing.push(index);
            } else {
                self.place(index, tick);
            }
        }
        batch.clear();
        self.scratch = batch;
        self.fire(out);
    }

    /// The earliest instant at which [`expire`](Self::expire) may have something to do, or
    /// `None` when no timer is pending. Cost: O([`NUM_LEVELS`]) bit operations.
    ///
    /// Guarantees, with `due` the earliest pending deadline rounded up to a tick and `last`
    /// the latest `now` given to `expire` (or `start`) rounded down to a tick:
    ///
    /// - the result is a tick boundary and **never later than `due`**, so an event loop that
    ///   sleeps until it never fires a timer late;
    /// - if `due > last` (nothing is due yet), the result is **after `last`**, so the loop
    ///   never spins; if `due <= last` (a timer was inserted already due), the result is at
    ///   or before `last`, meaning "call `expire` now";
    /// - it is **exact** (equal to `due`) when `due` lies in the same 64-tick block as `last`
    ///   (the earliest timer sits in level 0); otherwise it may be the start of the
    ///   higher-level slot holding that timer, an early wake-up at which `expire` cascades
    ///   the timer one level down. Sleeping repeatedly until `poll_timeout` therefore wakes
    ///   at most `NUM_LEVELS - 1` times without firing before the earliest timer fires (for
    ///   deadlines within `2^36` ticks).
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.len == 0 {
            return None;
        }
        if self.lists[OVERDUE_LIST].head != NIL {
            return Some(self.tick_instant(self.overdue_min_tick.min(self.elapsed_tick)));
        }
        let (tick, _, _) = self.next_slot()?;
        Some(self.tick_instant(tick))
    }

    // ---- time conversion ----

    /// `deadline` in ticks since `start`, rounded up (saturating at `u64::MAX`).
    fn deadline_tick(&self, deadline: Instant) -> u64 {
        let ns = deadline.saturating_duration_since(self.start).as_nanos();
        u64::try_from(ns.div_ceil(self.tick_ns)).unwrap_or(u64::MAX)
    }

    /// `now` in ticks since `start`, rounded down (saturating at `u64::MAX`).
    fn now_tick(&self, now: Instant) -> u64 {
        let ns = now.saturating_duration_since(self.start).as_nanos();
        u64::try_from(ns / self.tick_ns).unwrap_or(u64::MAX)
    }

    /// The instant of tick `tick`. Falls back to the latest `now` if it is not representable;
    /// that fallback is only reached for ticks after `last_now`, so it stays a lower bound.
    fn tick_instant(&self, tick: u64) -> Instant {
        u128::from(tick)
            .checked_mul(self.tick_ns)
            .and_then(duration_from_nanos)
            .and_then(|d| self.start.checked_add(d))
            .unwrap_or(self.last_now)
    }

    fn bump_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        seq
    }

    // ---- wheel geometry ----

    /// Links node `index` (already occupied) into the list for `tick` relative to the
    /// current tick.
    fn place(&mut self, index: usize, tick: u64) {
        let list = if tick <= self.elapsed_tick {
            self.overdue_min_tick = self.overdue_min_tick.min(tick);
            OVERDUE_LIST
        } else {
            let level = level_for(self.elapsed_tick, tick);
            let slot = slot_of(tick, level);
            level * SLOTS_PER_LEVEL + slot
        };
        self.push_back(list, index);
    }

    /// The next non-empty slot of the wheel: `(tick at which it is reached, level, slot)`,
    /// earliest first, ties to the lower level.
    fn next_slot(&self) -> Option<(u64, usize, usize)> {
        let mut best: Option<(u64, usize, usize)> = None;
        for level in 0..NUM_LEVELS {
            let occupied = self.occupied[level];
            if occupied == 0 {
                continue;
            }
            let shift = LEVEL_BITS * level as u32;
            let now_slot = ((self.elapsed_tick >> shift) & SLOT_MASK) as u32;
            // Slots after the current one first; then wrap around (only clamped far-future
            // timers of the top level can sit at or before the current slot).
            let after = if now_slot == SLOT_MASK as u32 {
                0
            } else {
                occupied & (u64::MAX << (now_slot + 1))
            };
            let slot = if after != 0 {
                after.trailing_zeros()
            } else {
                occupied.trailing_zeros()
            };
            let slot_range = 1u64 << shift;
            let level_range_bits = shift + LEVEL_BITS;
            let level_start = if level_range_bits >= 64 {
                0
            } else {
                self.elapsed_tick & !((1u64 << level_range_bits) - 1)
            };
            let mut tick = level_start.saturating_add(u64::from(slot) * slot_range);
            if tick <= self.elapsed_tick {
                tick = tick.saturating_add(1u64 << level_range_bits.min(63));
            }
            if best.is_none_or(|(t, _, _)| tick < t) {
                best = Some((tick, level, slot as usize));
            }
        }
        best
    }

    // ---- slab and lists ----

    fn timer(&self, id: TimerId) -> Option<&Timer<T>> {
        let node = self.nodes.get(id.index)?;
        if node.generation != id.generation {
            return None;
        }
        match &node.entry {
            Entry::Occupied(timer) => Some(timer),
            Entry::Vacant { .. } => None,
        }
    }

    fn timer_at(&self, index: usize) -> Option<&Timer<T>> {
        match &self.nodes.get(index)?.entry {
            Entry::Occupied(timer) => Some(timer),
            Entry::Vacant { .. } => None,
        }
    }

    fn timer_at_mut(&mut self, index: usize) -> Option<&mut Timer<T>> {
        match &mut self.nodes.get_mut(index)?.entry {
            Entry::Occupied(timer) => Some(timer),
            Entry::Vacant { .. } => None,
        }
    }

    fn push_back(&mut self, list: usize, index: usize) {
        let tail = self.lists[list].tail;
        if let Some(timer) = self.timer_at_mut(index) {
            timer.prev = tail;
            timer.next = NIL;
            timer.list = list;
        }
        if tail == NIL {
            self.lists[list].head = index;
        } else if let Some(prev) = self.timer_at_mut(tail) {
            prev.next = index;
        }
        self.lists[list].tail = index;
        if list < OVERDUE_LIST {
            self.occupied[list / SLOTS_PER_LEVEL] |= 1 << (list % SLOTS_PER_LEVEL);
        }
    }

    /// Removes node `index` from whatever list it is on.
    fn unlink(&mut self, index: usize) {
        let Some(&Timer {
            prev, next, list, ..
        }) = self.timer_at(index)
        else {
            return;
        };
        if list >= NUM_LISTS {
            return;
        }
        match self.timer_at_mut(prev) {
            Some(p) => p.next = next,
            None => self.lists[list].head = next,
        }
        match self.timer_at_mut(next) {
            Some(n) => n.prev = prev,
            None => self.lists[list].tail = prev,
        }
        if let Some(timer) = self.timer_at_mut(index) {
            timer.prev = NIL;
            timer.next = NIL;
            timer.list = NIL;
        }
        if self.lists[list].head == NIL && list < OVERDUE_LIST {
            self.occupied[list / SLOTS_PER_LEVEL] &= !(1 << (list % SLOTS_PER_LEVEL));
        }
    }

    /// Detaches a whole list into `scratch` (in list order), leaving the nodes unlinked.
    fn take_list(&mut self, list: usize) {
        let mut cursor = self.lists[list].head;
        self.lists[list] = EMPTY_LIST;
        if list < OVERDUE_LIST {
            self.occupied[list / SLOTS_PER_LEVEL] &= !(1 << (list % SLOTS_PER_LEVEL));
        }
        while let Some(timer) = self.timer_at_mut(cursor) {
            let next = timer.next;
            timer.prev = NIL;
            timer.next = NIL;
            timer.list = NIL;
            self.scratch.push(cursor);
            cursor = next;
        }
    }

    /// Frees node `index` (already unlinked) and returns its value.
    fn release(&mut self, index: usize) -> Option<T> {
        let node = self.nodes.get_mut(index)?;
        let entry = std::mem::replace(
            &mut node.entry,
            Entry::Vacant {
                next_free: self.free_head,
            },
        );
        match entry {
            Entry::Occupied(timer) => {
                node.generation = node.generation.wrapping_add(1);
                self.free_head = index;
                self.len -= 1;
                Some(timer.value)
            }
            vacant @ Entry::Vacant { .. } => {
                node.entry = vacant;
                None
            }
        }
    }

    /// Hands the nodes in `firing` to `out`, ordered by (tick, insertion order).
    fn fire(&mut self, out: &mut Vec<(TimerId, T)>) {
        let nodes = &self.nodes;
        self.firing.sort_unstable_by_key(|&i| match nodes.get(i) {
            Some(Node {
                entry: Entry::Occupied(t),
                ..
            }) => (t.tick, t.seq),
            _ => (u64::MAX, u64::MAX),
        });
        let mut firing = std::mem::take(&mut self.firing);
        for &index in &firing {
            let generation = self.nodes.get(index).map_or(0, |n| n.generation);
            if let Some(value) = self.release(index) {
                out.push((TimerId { index, generation }, value));
            }
        }
        firing.clear();
        self.firing = firing;
    }
}

/// The level at which a timer for `tick` sits when the wheel is at `elapsed` (`tick >
/// elapsed`): the highest 6-bit group in which they differ, clamped to the top level.
fn level_for(elapsed: u64, tick: u64) -> usize {
    let masked = (elapsed ^ tick) | SLOT_MASK;
    let significant = 63 - masked.leading_zeros();
    ((significant / LEVEL_BITS) as usize).min(NUM_LEVELS - 1)
}

/// The slot of `tick` in `level`.
fn slot_of(tick: u64, level: usize) -> usize {
    ((tick >> (LEVEL_BITS * level as u32)) & SLOT_MASK) as usize
}

fn duration_from_nanos(ns: u128) -> Option<Duration> {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    let secs = u64::try_from(ns / NANOS_PER_SEC).ok()?;
    // Remainder < 10^9 fits in u32.
    let sub = (ns % NANOS_PER_SEC) as u32;
    Some(Duration::new(secs, sub))
}
