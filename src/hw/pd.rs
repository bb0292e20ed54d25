//! Protection domains, the memory registration of each buffer pool, and the address handles
//! of UD sends: the objects a PD owns.

use super::error::errno_err;
use super::HwVerbs;
use crate::verbs::{AddressVector, PdId, PoolId, VerbsError};
use ibverbs_sys as ffi;

/// A PD and how many objects (QPs, SRQs, AHs) use it.
#[derive(Debug)]
pub(super) struct Pd {
    pub(super) raw: *mut ffi::ibv_pd,
    pub(super) users: usize,
}

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

    pub(super) fn ah_for(
        &mut self,
        pd: PdId,
        av: AddressVector,
    ) -> Result<*mut ffi::ibv_ah, VerbsError> {
        if let Some(ah) = self.ahs.get(&(pd, av)) {
            return Ok(*ah);
        }
        let raw_pd = self.pd_raw(pd)?;
        // SAFETY: ibv_ah_attr is a plain C struct; all-zero is valid.
        let mut a: ffi::ibv_ah_attr = unsafe { std::mem::zeroed() };
        a.is_global = 1;
        a.port_num = self.port;
        a.grh.dgid = ffi::ibv_gid {
            raw: self.device_mgid(av.dgid).0,
        };
        a.grh.sgid_index = self.gid_index;
        a.grh.hop_limit = av.hop_limit;
        a.grh.traffic_class = av.traffic_class;
        a.grh.flow_label = av.flow_label;
        // SAFETY: valid PD and attribute struct.
        let ah = unsafe { ffi::ibv_create_ah(raw_pd, &mut a) };
        if ah.is_null() {
            return Err(errno_err("ibv_create_ah", -1));
        }
        self.ahs.insert((pd, av), ah);
        self.use_pd(pd, 1);
        Ok(ah)
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
    // SAFETY: a live PD with no objects.
    let rc = unsafe { ffi::ibv_dealloc_pd(p.raw) };
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
