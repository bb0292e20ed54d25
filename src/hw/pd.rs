//! Protection domains, the memory registration of each buffer pool, and the address handles
//! of UD sends: the objects a PD owns.

use super::ah_cache::Room;
use super::context::HwVerbs;
use super::error::errno_err;
use super::objects::{Ah, Pd};
use crate::verbs::{AddressVector, PdId, PoolId, VerbsError};
use ibverbs_sys as ffi;

impl HwVerbs {
    pub(super) fn pd_raw(&self, pd: PdId) -> Result<*mut ffi::ibv_pd, VerbsError> {
        self.pds
            .get(&pd.0)
            .map(|p| p.raw)
            .ok_or(VerbsError::NoSuchObject("PD"))
    }

    pub(super) fn use_pd(&mut self, pd: PdId, d: isize) {
        if let Some(p) = self.pds.get_mut(&pd.0) {
            p.users = p.users.saturating_add_signed(d);
        }
    }

    /// The AH of `av` in `pd`: the cached one, else a new one, cached (see
    /// [`super::ah_cache`] for the bound and when an evicted AH is destroyed).
    pub(super) fn ah_for(&mut self, pd: PdId, av: AddressVector) -> Result<Ah, VerbsError> {
        if let Some(ah) = self.ahs.get(&(pd, av)) {
            return Ok(ah);
        }
        let raw_pd = self.pd_raw(pd)?;
        let mut room = self.ahs.make_room();
        if room == Room::Full {
            self.reap_ahs();
            room = self.ahs.make_room();
        }
        match room {
            Room::Full => return Err(VerbsError::OutOfResources("address handle")),
            Room::Evicted => self.stats.ah_evicted += 1,
            Room::Free => {}
        }
        let mut a = super::av::to_ah_attr(&av, self.port, self.gid_index, |g| self.device_mgid(g));
        // SAFETY: valid PD and attribute struct.
        let raw = unsafe { ffi::ibv_create_ah(raw_pd, &mut a) };
        if raw.is_null() {
            return Err(errno_err("ibv_create_ah", -1));
        }
        let ah = Ah { raw, pd };
        self.ahs.insert((pd, av), ah);
        self.use_pd(pd, 1);
        self.stats.ah_created += 1;
        Ok(ah)
    }

    /// Destroys the retired AHs whose posted sends all completed (at most
    /// [`super::ah_cache::MAX_RETIRED_AHS`] looked at).
    pub(super) fn reap_ahs(&mut self) {
        if self.ahs.retired_len() == 0 {
            return;
        }
        let mut done = Vec::new();
        let qps = &self.qps;
        self.ahs
            .reap(|q| qps.get(&q).map(|x| x.sends_completed), &mut done);
        for ah in done {
            // SAFETY: a live AH, out of the cache, that no posted send can still use (the
            // invariant of `ah_cache`); destroyed once.
            let rc = unsafe { ffi::ibv_destroy_ah(ah.raw) };
            if rc == 0 {
                self.stats.ah_destroyed += 1;
                self.use_pd(ah.pd, -1);
            }
        }
    }
}

pub(super) fn alloc(v: &mut HwVerbs) -> Result<PdId, VerbsError> {
    // SAFETY: valid context.
    let raw = unsafe { ffi::ibv_alloc_pd(v.ctx) };
    if raw.is_null() {
        return Err(errno_err("ibv_alloc_pd", -1));
    }
    let id = v.id();
    v.pds.insert(id, Pd { raw, users: 0 });
    Ok(PdId(id))
}

pub(super) fn dealloc(v: &mut HwVerbs, pd: PdId) -> Result<(), VerbsError> {
    let p = v.pds.get(&pd.0).ok_or(VerbsError::NoSuchObject("PD"))?;
    // Pools (MRs) cannot be destroyed through the trait, so a PD with a pool stays busy.
    if p.users > 0 || v.mrs.values().any(|(_, d)| *d == pd) {
        return Err(VerbsError::Busy("PD"));
    }
    let raw = p.raw;
    // QPs created ahead in the PD, or destroyed behind, are gone first.
    v.commands.quiesce();
    // SAFETY: a live PD with no objects.
    let rc = unsafe { ffi::ibv_dealloc_pd(raw) };
    if rc != 0 {
        return Err(errno_err("ibv_dealloc_pd", rc));
    }
    v.pds.remove(&pd.0);
    Ok(())
}

pub(super) fn register_pool(
    v: &mut HwVerbs,
    pd: PdId,
    buf_len: usize,
    count: usize,
) -> Result<PoolId, VerbsError> {
    let raw_pd = v.pd_raw(pd)?;
    let pool = v.pools.create(buf_len, count)?;
    let (base, len) = v
        .pools
        .region(pool)
        .ok_or(VerbsError::NoSuchObject("pool"))?;
    let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as i32;
    // SAFETY: `base..base+len` is the pool's heap memory, which never moves or shrinks
    // while `v` lives; the MR is deregistered in Drop before the pools are freed.
    let mr = unsafe { ffi::ibv_reg_mr(raw_pd, base.cast(), len, access) };
    if mr.is_null() {
        // The pool stays allocated (the trait cannot remove pools) but unregistered.
        return Err(errno_err("ibv_reg_mr", -1));
    }
    v.mrs.insert(pool, (mr, pd));
    Ok(pool)
}
