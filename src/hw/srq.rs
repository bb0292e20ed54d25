//! Shared receive queues.

use std::ptr;

use super::context::HwVerbs;
use super::error::errno_err;
use super::objects::Owner;
use super::objects::Srq;
use crate::verbs::{BufId, SrqId, SrqInit, VerbsError, WrId};
use ibverbs_sys as ffi;

pub(super) fn create(v: &mut HwVerbs, init: &SrqInit) -> Result<SrqId, VerbsError> {
    let raw_pd = v.pd_raw(init.pd)?;
    let mut a = ffi::ibv_srq_init_attr {
        srq_context: ptr::null_mut(),
        attr: ffi::ibv_srq_attr {
            max_wr: init.max_wr.max(1),
            max_sge: 1,
            srq_limit: init.limit,
        },
    };
    // SAFETY: valid PD and attribute struct.
    let raw = unsafe { ffi::ibv_create_srq(raw_pd, &mut a) };
    if raw.is_null() {
        return Err(errno_err("ibv_create_srq", -1));
    }
    let id = v.id();
    v.srqs.insert(
        id,
        Srq {
            raw,
            pd: init.pd,
            max_wr: init.max_wr.max(1),
            users: 0,
            posted: 0,
        },
    );
    v.use_pd(init.pd, 1);
    Ok(SrqId(id))
}

pub(super) fn modify(v: &mut HwVerbs, srq: SrqId, limit: u32) -> Result<(), VerbsError> {
    let s = v.srqs.get(&srq.0).ok_or(VerbsError::NoSuchObject("SRQ"))?;
    let mut a = ffi::ibv_srq_attr {
        max_wr: 0,
        max_sge: 0,
        srq_limit: limit,
    };
    // SAFETY: a live SRQ and attribute struct.
    let rc = unsafe { ffi::ibv_modify_srq(s.raw, &mut a, ffi::IBV_SRQ_LIMIT as i32) };
    if rc != 0 {
        return Err(errno_err("ibv_modify_srq", rc));
    }
    Ok(())
}

pub(super) fn post_recv(
    v: &mut HwVerbs,
    srq: SrqId,
    wr_id: WrId,
    buf: BufId,
) -> Result<(), VerbsError> {
    let s = v.srqs.get(&srq.0).ok_or(VerbsError::NoSuchObject("SRQ"))?;
    if s.posted >= s.max_wr as usize {
        return Err(VerbsError::QueueFull);
    }
    v.post_recv_raw(Owner::Srq(srq), wr_id, buf)?;
    if let Some(s) = v.srqs.get_mut(&srq.0) {
        s.posted += 1;
    }
    Ok(())
}

pub(super) fn posted(v: &HwVerbs, srq: SrqId) -> Result<usize, VerbsError> {
    let s = v.srqs.get(&srq.0).ok_or(VerbsError::NoSuchObject("SRQ"))?;
    Ok(s.posted)
}

pub(super) fn destroy(v: &mut HwVerbs, srq: SrqId) -> Result<(), VerbsError> {
    let s = v.srqs.get(&srq.0).ok_or(VerbsError::NoSuchObject("SRQ"))?;
    if s.users > 0 {
        return Err(VerbsError::Busy("SRQ"));
    }
    let (raw, pd) = (s.raw, s.pd);
    // QPs created ahead on the SRQ, or destroyed behind, are gone first.
    v.commands.quiesce();
    // SAFETY: a live SRQ no QP uses.
    let rc = unsafe { ffi::ibv_destroy_srq(raw) };
    if rc != 0 {
        return Err(errno_err("ibv_destroy_srq", rc));
    }
    v.srqs.remove(&srq.0);
    v.release_owner(Owner::Srq(srq));
    v.use_pd(pd, -1);
    Ok(())
}
