//! Storage of the neighbour entries: a slab of slots (a `Vec` and a free list, so an entry
//! keeps its place while it lives and a removed one's slot is reused), with the learned
//! entries on an intrusive doubly linked list in order of use, least recently used first.
//! The slab holds any entry type `T`; the table stores its `Neigh`s in it.
//!
//! Every operation is O(1): insert, remove, look at, and move to the most recently used end.
//! The slab never holds more slots than the table held entries at its fullest, which the
//! table's caps bound.

use std::net::IpAddr;

/// "No slot" in the links.
const NIL: u32 = u32::MAX;

/// Names a live slot. Valid until the slot's entry is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(in crate::ipoib) struct SlotId(u32);

#[derive(Debug)]
struct Slot<T> {
    ip: IpAddr,
    entry: T,
    /// On the use-order list (learned entries; static ones never are).
    linked: bool,
    prev: u32,
    next: u32,
}

/// The slab and the use-order list.
///
/// Invariant: the list runs `head` → `next` … → `tail` over exactly the live slots with
/// `linked`, each once, and `prev` mirrors `next`.
#[derive(Debug)]
pub(super) struct Slots<T> {
    slots: Vec<Option<Slot<T>>>,
    free: Vec<u32>,
    head: u32,
    tail: u32,
    linked: usize,
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            linked: 0,
        }
    }
}

impl<T> Slots<T> {
    fn slot(&self, i: u32) -> Option<&Slot<T>> {
        self.slots.get(i as usize)?.as_ref()
    }

    fn slot_mut(&mut self, i: u32) -> Option<&mut Slot<T>> {
        self.slots.get_mut(i as usize)?.as_mut()
    }

    /// Stores `entry` for `ip`; a learned one (`linked`) goes to the most recently used end.
    pub(super) fn insert(&mut self, ip: IpAddr, entry: T, linked: bool) -> SlotId {
        let slot = Slot {
            ip,
            entry,
            linked: false,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                if let Some(free) = self.slots.get_mut(i as usize) {
                    *free = Some(slot);
                }
                i
            }
            None => {
                // The table's caps keep this far below u32::MAX.
                let i = u32::try_from(self.slots.len()).unwrap_or(NIL - 1);
                self.slots.push(Some(slot));
                i
            }
        };
        if linked {
            self.push_back(i);
        }
        SlotId(i)
    }

    /// Removes the entry of `id`.
    pub(super) fn remove(&mut self, id: SlotId) -> Option<(IpAddr, T)> {
        if self.slot(id.0)?.linked {
            self.unlink(id.0);
        }
        let slot = self.slots.get_mut(id.0 as usize)?.take()?;
        self.free.push(id.0);
        Some((slot.ip, slot.entry))
    }

    pub(super) fn get(&self, id: SlotId) -> Option<&T> {
        self.slot(id.0).map(|s| &s.entry)
    }

    pub(super) fn get_mut(&mut self, id: SlotId) -> Option<&mut T> {
        self.slot_mut(id.0).map(|s| &mut s.entry)
    }

    /// The address of the entry of `id`.
    pub(super) fn ip(&self, id: SlotId) -> Option<IpAddr> {
        self.slot(id.0).map(|s| s.ip)
    }

    /// Moves a learned entry to the most recently used end (a static one stays off the list).
    pub(super) fn touch(&mut self, id: SlotId) {
        if id.0 == self.tail || !self.slot(id.0).is_some_and(|s| s.linked) {
            return;
        }
        self.unlink(id.0);
        self.push_back(id.0);
    }

    /// The least recently used learned entry.
    pub(super) fn lru(&self) -> Option<SlotId> {
        (self.head != NIL).then_some(SlotId(self.head))
    }

    /// Entries on the use-order list.
    #[cfg(test)]
    pub(super) fn linked_len(&self) -> usize {
        self.linked
    }

    /// Checks the list invariant (tests).
    #[cfg(test)]
    pub(super) fn check(&self) {
        let mut seen = 0;
        let mut prev = NIL;
        let mut at = self.head;
        while at != NIL {
            let s = self.slot(at).expect("a listed slot is live");
            assert!(s.linked);
            assert_eq!(s.prev, prev);
            prev = at;
            at = s.next;
            seen += 1;
            assert!(seen <= self.slots.len(), "the list has a cycle");
        }
        assert_eq!(prev, self.tail);
        assert_eq!(seen, self.linked);
        let live_linked = self.slots.iter().flatten().filter(|s| s.linked).count();
        assert_eq!(live_linked, self.linked);
    }

    fn push_back(&mut self, i: u32) {
        let tail = self.tail;
        if let Some(s) = self.slot_mut(i) {
            s.linked = true;
            s.prev = tail;
            s.next = NIL;
        }
        match self.slot_mut(tail) {
            Some(t) => t.next = i,
            None => self.head = i,
        }
        self.tail = i;
        self.linked += 1;
    }

    fn unlink(&mut self, i: u32) {
        let Some(s) = self.slot_mut(i) else { return };
        let (prev, next) = (s.prev, s.next);
        s.linked = false;
        s.prev = NIL;
        s.next = NIL;
        match self.slot_mut(prev) {
            Some(p) => p.next = next,
            None => self.head = next,
        }
        match self.slot_mut(next) {
            Some(n) => n.prev = prev,
            None => self.tail = prev,
        }
        self.linked -= 1;
    }
}
