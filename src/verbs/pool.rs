//! Registered buffer pools: memory the provider owns and lends out by [`BufId`].
//!
//! A buffer is in exactly one of three states:
//!
//! - **free**: on the pool's free list;
//! - **held**: the caller owns it ([`BufPools::alloc`], or a completion returned it) and may read
//!   and write it;
//! - **posted**: a WR that uses it is outstanding; nobody but the provider may touch it.
//!
//! Posting a WR moves a held buffer to posted ([`BufPools::lend`]); its completion moves it
//! back ([`BufPools::reclaim`]). Because the caller never has a pointer to a posted buffer, the
//! safe API cannot dangle, and a double post is an error instead of memory corruption. On the
//! hardware provider each pool is one memory region registered with the PD.

use super::error::VerbsError;
use super::types::{BufId, PoolId};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BufState {
    Free,
    Held,
    Posted,
}

#[derive(Debug)]
struct Pool {
    buf_len: usize,
    data: Vec<u8>,
    state: Vec<BufState>,
    free: Vec<u32>,
}

/// All buffer pools of one provider.
#[derive(Debug, Default)]
pub struct BufPools {
    pools: Vec<Pool>,
    /// Pools are committed at creation ([`BufPools::commit_at_creation`]).
    commit: bool,
}

/// Bytes between two writes of [`commit`]: the smallest page size Linux uses.
const PAGE: usize = 4096;

/// Writes every page of `buf` (each page's first byte, with the value it holds), so that the
/// kernel backs it with memory now and charges it to the process's memory cgroup: a limit
/// that cannot hold it ends the process there, at start, instead of under load later. The
/// contents are unchanged.
pub fn commit(buf: &mut [u8]) {
    // Hidden from the optimiser, which would otherwise drop the writes of a value the
    // allocator's zeroed pages already read as.
    let buf = std::hint::black_box(buf);
    for page in buf.chunks_mut(PAGE) {
        if let Some(b) = page.first_mut() {
            *b = std::hint::black_box(*b);
        }
    }
}

/// Pool sizes are bounded so a bad configuration fails cleanly instead of aborting on OOM.
const MAX_POOL_BYTES: usize = 4 << 30;

impl BufPools {
    /// An empty set of pools.
    pub fn new() -> Self {
        Self::default()
    }

    /// From now on every pool is written through at creation, before any of its buffers can
    /// be posted, so that its memory is the process's from the start (and charged to its
    /// memory cgroup then) rather than page by page as packets first reach it. Without it a
    /// pool's pages stay uncommitted until used, which keeps the many endpoints of a
    /// simulated fabric cheap.
    pub fn commit_at_creation(&mut self) {
        self.commit = true;
    }

    /// Bytes of all pools.
    pub fn total_bytes(&self) -> usize {
        self.pools.iter().map(|p| p.data.len()).sum()
    }

    /// Creates a pool of `count` buffers of `buf_len` bytes each, all free.
    ///
    /// # Errors
    /// [`VerbsError::OutOfResources`] if the pool would exceed 4 GiB or 65535 pools exist;
    /// [`VerbsError::InvalidWr`] for a zero size.
    pub fn create(&mut self, buf_len: usize, count: usize) -> Result<PoolId, VerbsError> {
        if buf_len == 0 || count == 0 {
            return Err(VerbsError::InvalidWr("empty buffer pool"));
        }
        let total = buf_len
            .checked_mul(count)
            .filter(|t| *t <= MAX_POOL_BYTES)
            .ok_or(VerbsError::OutOfResources("pool memory"))?;
        let count32 = u32::try_from(count).map_err(|_| VerbsError::OutOfResources("buffers"))?;
        let id = u16::try_from(self.pools.len())
            .ok()
            .filter(|i| *i < u16::MAX)
            .ok_or(VerbsError::OutOfResources("pools"))?;
        let mut data = vec![0; total];
        if self.commit {
            commit(&mut data);
        }
        self.pools.push(Pool {
            buf_len,
            data,
            state: vec![BufState::Free; count],
            free: (0..count32).rev().collect(),
        });
        Ok(PoolId(id))
    }

    fn pool(&self, id: PoolId) -> Result<&Pool, VerbsError> {
        self.pools
            .get(usize::from(id.0))
            .ok_or(VerbsError::NoSuchObject("pool"))
    }

    fn pool_mut(&mut self, id: PoolId) -> Result<&mut Pool, VerbsError> {
        self.pools
            .get_mut(usize::from(id.0))
            .ok_or(VerbsError::NoSuchObject("pool"))
    }

    fn state(&self, b: BufId) -> Option<BufState> {
        self.pools
            .get(usize::from(b.pool.0))?
            .state
            .get(b.index as usize)
            .copied()
    }

    /// Size of each buffer in the pool.
    ///
    /// # Errors
    /// [`VerbsError::NoSuchObject`] for an unknown pool.
    pub fn buf_len(&self, pool: PoolId) -> Result<usize, VerbsError> {
        Ok(self.pool(pool)?.buf_len)
    }

    /// Number of free buffers in the pool.
    pub fn free_count(&self, pool: PoolId) -> usize {
        self.pool(pool).map_or(0, |p| p.free.len())
    }

    /// Takes a free buffer; the caller holds it. `None` when the pool is exhausted or unknown.
    pub fn alloc(&mut self, pool: PoolId) -> Option<BufId> {
        let p = self.pool_mut(pool).ok()?;
        let index = p.free.pop()?;
        if let Some(s) = p.state.get_mut(index as usize) {
            *s = BufState::Held;
        }
        Some(BufId { pool, index })
    }

    /// Returns a held buffer to the free list.
    ///
    /// # Errors
    /// [`VerbsError::BufferNotHeld`] if the caller does not hold it.
    pub fn free(&mut self, b: BufId) -> Result<(), VerbsError> {
        self.transition(b, BufState::Held, BufState::Free)?;
        if let Ok(p) = self.pool_mut(b.pool) {
            p.free.push(b.index);
        }
        Ok(())
    }

    /// A held buffer's bytes.
    ///
    /// # Errors
    /// [`VerbsError::BufferNotHeld`] unless the caller holds it.
    pub fn get(&self, b: BufId) -> Result<&[u8], VerbsError> {
        if self.state(b) != Some(BufState::Held) {
            return Err(VerbsError::BufferNotHeld(b));
        }
        self.bytes(b).ok_or(VerbsError::BufferNotHeld(b))
    }

    /// A held buffer's bytes, writable.
    ///
    /// # Errors
    /// [`VerbsError::BufferNotHeld`] unless the caller holds it.
    pub fn get_mut(&mut self, b: BufId) -> Result<&mut [u8], VerbsError> {
        if self.state(b) != Some(BufState::Held) {
            return Err(VerbsError::BufferNotHeld(b));
        }
        self.bytes_mut(b).ok_or(VerbsError::BufferNotHeld(b))
    }

    fn transition(&mut self, b: BufId, from: BufState, to: BufState) -> Result<(), VerbsError> {
        let s = self
            .pools
            .get_mut(usize::from(b.pool.0))
            .and_then(|p| p.state.get_mut(b.index as usize))
            .filter(|s| **s == from)
            .ok_or(VerbsError::BufferNotHeld(b))?;
        *s = to;
        Ok(())
    }

    /// Provider side: a WR that uses `b` is being posted. Held → posted.
    ///
    /// # Errors
    /// [`VerbsError::BufferNotHeld`] unless the caller holds it (this catches double posts).
    pub fn lend(&mut self, b: BufId) -> Result<(), VerbsError> {
        self.transition(b, BufState::Held, BufState::Posted)
    }

    /// Provider side: the WR that used `b` completed. Posted → held by the caller again.
    /// Reclaiming a buffer that is not posted is a provider bug and is ignored.
    pub fn reclaim(&mut self, b: BufId) {
        let _ = self.transition(b, BufState::Posted, BufState::Held);
    }

    /// Provider side: the QP that had `b` posted was destroyed. Posted → free.
    pub fn release(&mut self, b: BufId) {
        if self.transition(b, BufState::Posted, BufState::Free).is_ok() {
            if let Ok(p) = self.pool_mut(b.pool) {
                p.free.push(b.index);
            }
        }
    }

    /// Provider side: the bytes of any buffer, whatever its state.
    pub fn bytes(&self, b: BufId) -> Option<&[u8]> {
        let p = self.pools.get(usize::from(b.pool.0))?;
        let start = (b.index as usize).checked_mul(p.buf_len)?;
        p.data.get(start..start.checked_add(p.buf_len)?)
    }

    /// Provider side: the bytes of any buffer, writable.
    pub fn bytes_mut(&mut self, b: BufId) -> Option<&mut [u8]> {
        let p = self.pools.get_mut(usize::from(b.pool.0))?;
        let start = (b.index as usize).checked_mul(p.buf_len)?;
        p.data.get_mut(start..start.checked_add(p.buf_len)?)
    }

    /// Provider side: a pool's memory as (base pointer, length), for registering it as one
    /// memory region. A pool's `Vec` is allocated once at creation and never grows, so the
    /// pointer stays valid while the pool exists (pools are never removed).
    pub fn region(&mut self, pool: PoolId) -> Option<(*mut u8, usize)> {
        let p = self.pools.get_mut(usize::from(pool.0))?;
        Some((p.data.as_mut_ptr(), p.data.len()))
    }

    /// Number of buffers currently posted, over all pools (a leak check for tests).
    pub fn posted_count(&self) -> usize {
        self.pools
            .iter()
            .map(|p| p.state.iter().filter(|s| **s == BufState::Posted).count())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifecycle_free_held_posted() {
        let mut p = BufPools::new();
        let id = p.create(64, 2).unwrap();
        let a = p.alloc(id).unwrap();
        let b = p.alloc(id).unwrap();
        assert!(p.alloc(id).is_none());
        p.get_mut(a).unwrap()[0] = 7;
        p.lend(a).unwrap();
        assert_eq!(p.get(a), Err(VerbsError::BufferNotHeld(a)));
        assert_eq!(p.lend(a), Err(VerbsError::BufferNotHeld(a)), "double post");
        assert_eq!(p.posted_count(), 1);
        p.reclaim(a);
        assert_eq!(p.get(a).unwrap()[0], 7);
        p.free(a).unwrap();
        assert!(p.free(a).is_err(), "double free");
        p.lend(b).unwrap();
        p.release(b);
        assert_eq!(p.free_count(id), 2);
        assert_eq!(p.posted_count(), 0);
    }

    #[test]
    fn committing_leaves_the_contents_as_they_were() {
        let mut buf: Vec<u8> = (0..3 * PAGE + 5).map(|i| (i % 251) as u8).collect();
        let before = buf.clone();
        commit(&mut buf);
        assert_eq!(buf, before);
        commit(&mut []);
        let mut p = BufPools::new();
        p.commit_at_creation();
        let id = p.create(64, 3).unwrap();
        assert_eq!(p.total_bytes(), 192);
        assert_eq!(p.free_count(id), 3);
    }

    #[test]
    fn rejects_bad_sizes_and_ids() {
        let mut p = BufPools::new();
        assert!(p.create(0, 1).is_err());
        assert!(p.create(1 << 20, 1 << 20).is_err());
        let bogus = BufId {
            pool: PoolId(9),
            index: 0,
        };
        assert!(p.get(bogus).is_err());
        assert!(p.alloc(PoolId(9)).is_none());
    }
}
