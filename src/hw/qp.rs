//! Queue pairs: creation, `modify_qp` (checked by [`check_modify`] against the state the
//! device reports), multicast attachment and destruction.

use std::collections::VecDeque;
use std::ptr;

use super::commands::{self, RawQpInit};
use super::context::HwVerbs;
use super::error::errno_err;
use super::ffi_map::{bit, state_from, state_to};
use super::objects::Owner;
use super::objects::Qp;
use crate::verbs::{check_modify, Gid, QpAttr, QpInit, QpNum, QpState, QpType, VerbsError};
use ibverbs_sys as ffi;

impl HwVerbs {
    /// Whether the QP is in SQD and still draining (`ibv_qp_attr.sq_draining`).
    fn sq_draining(&mut self, raw: *mut ffi::ibv_qp) -> bool {
        self.stats.calls.query_qp_calls += 1;
        // SAFETY: plain C structs; all-zero is valid.
        let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: a live QP and valid out pointers.
        let rc = unsafe {
            ffi::ibv_query_qp(
                raw,
                &mut attr,
                bit(ffi::ibv_qp_attr_mask::IBV_QP_STATE),
                &mut init,
            )
        };
        rc == 0 && attr.sq_draining != 0
    }

    pub(super) fn query_state(&self, raw: *mut ffi::ibv_qp) -> Option<QpState> {
        // SAFETY: plain C structs; all-zero is valid.
        let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: a live QP and valid out pointers.
        let rc = unsafe {
            ffi::ibv_query_qp(
                raw,
                &mut attr,
                bit(ffi::ibv_qp_attr_mask::IBV_QP_STATE),
                &mut init,
            )
        };
        (rc == 0).then(|| state_from(attr.qp_state))
    }
}

/// Creates a QP in RESET: one created ahead on the command thread when one of its kind is
/// ready, else here; then the command thread is asked for what the stash of its kind lacks.
pub(super) fn create(v: &mut HwVerbs, init: &QpInit) -> Result<QpNum, VerbsError> {
    let qp_type = match init.qp_type {
        QpType::Rc => ffi::ibv_qp_type::IBV_QPT_RC,
        QpType::Ud => ffi::ibv_qp_type::IBV_QPT_UD,
        QpType::Gsi => return Err(VerbsError::OutOfResources("QP1 (owned by the kernel)")),
    };
    let raw_init = RawQpInit {
        pd: v.pd_raw(init.pd)?,
        send_cq: v.cq_raw(init.send_cq)?,
        recv_cq: v.cq_raw(init.recv_cq)?,
        srq: match init.srq {
            Some(s) => v.srqs.get(&s.0).ok_or(VerbsError::NoSuchObject("SRQ"))?.raw,
            None => ptr::null_mut(),
        },
        qp_type,
        max_send_wr: init.max_send_wr,
        max_recv_wr: init.max_recv_wr,
    };
    let kind = commands::kind_of(init);
    let created = match v.commands.take(&kind) {
        Some(q) => {
            v.stats.qp_stash_hits += 1;
            q
        }
        None => {
            v.stats.calls.create_qp_calls += 1;
            commands::create(&raw_init).map_err(|rc| errno_err("ibv_create_qp", rc))?
        }
    };
    v.commands.refill(&kind, raw_init);
    // SAFETY: a live QP.
    let qpn = unsafe { (*created.raw).qp_num };
    v.qps.insert(
        qpn,
        Qp {
            raw: created.raw,
            qp_type: init.qp_type,
            state: QpState::Reset,
            pd: init.pd,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            srq: init.srq,
            max_send_wr: init.max_send_wr.max(1),
            max_recv_wr: init.max_recv_wr.max(1),
            sq_sig_all: init.sq_sig_all,
            max_inline: created.max_inline,
            pending: Vec::new(),
            sends: VecDeque::new(),
            sends_posted: 0,
            sends_completed: 0,
            recvs: 0,
            mcast: Vec::new(),
        },
    );
    v.use_pd(init.pd, 1);
    v.use_cq(init.send_cq, 1);
    v.use_cq(init.recv_cq, 1);
    if let Some(s) = init.srq.and_then(|s| v.srqs.get_mut(&s.0)) {
        s.users += 1;
    }
    Ok(QpNum::new(qpn))
}

/// Moves `qp` as `attr` says, checked against the state this wrapper tracks (no
/// `ibv_query_qp`, a firmware command on most devices); only when the check or the device
/// refuses is the device asked for its state, which it may have changed on its own (to ERR
/// or SQE, after an error completion), and the modify tried once more from there.
pub(super) fn modify(v: &mut HwVerbs, qp: QpNum, attr: &QpAttr) -> Result<(), VerbsError> {
    // What was posted before the modify reaches the device before it.
    super::wr::flush_sends(v, qp);
    let q = v.qps.get(&qp.get()).ok_or(VerbsError::NoSuchQp(qp))?;
    let (raw, tracked) = (q.raw, q.state);
    match modify_from(v, qp, tracked, attr) {
        Err(e) => {
            v.stats.calls.query_qp_calls += 1;
            match v.query_state(raw) {
                Some(device) if device != tracked => modify_from(v, qp, device, attr),
                _ => Err(e),
            }
        }
        ok => ok,
    }
}

/// [`modify`] from the state `current`.
fn modify_from(
    v: &mut HwVerbs,
    qp: QpNum,
    current: QpState,
    attr: &QpAttr,
) -> Result<(), VerbsError> {
    let q = v.qps.get(&qp.get()).ok_or(VerbsError::NoSuchQp(qp))?;
    let (raw, qp_type) = (q.raw, q.qp_type);
    check_modify(qp_type, current, attr)?;
    if current == QpState::Sqd && !matches!(attr.state, Some(QpState::Err | QpState::Reset)) {
        // A device may refuse to leave SQD while the send queue is still draining (rxe
        // does, with EINVAL): wait for the drain, at most a second.
        for _ in 0..1000 {
            if !v.sq_draining(raw) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    use ffi::ibv_qp_attr_mask as M;
    // SAFETY: ibv_qp_attr is a plain C struct; all-zero is valid.
    let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
    let mut mask = 0i32;
    let to = attr.state.unwrap_or(current);
    a.qp_state = state_to(to);
    mask |= bit(M::IBV_QP_STATE);
    if let Some(s) = attr.cur_state {
        a.cur_qp_state = state_to(s);
        mask |= bit(M::IBV_QP_CUR_STATE);
    }
    if let Some(v) = attr.pkey_index {
        a.pkey_index = v;
        mask |= bit(M::IBV_QP_PKEY_INDEX);
    }
    if let Some(v) = attr.port {
        a.port_num = v;
        mask |= bit(M::IBV_QP_PORT);
    }
    if let Some(v) = attr.qkey {
        a.qkey = v.0;
        mask |= bit(M::IBV_QP_QKEY);
    }
    if let Some(acc) = attr.access {
        use ffi::ibv_access_flags as F;
        let mut f = 0;
        if acc.remote_write {
            f |= F::IBV_ACCESS_REMOTE_WRITE.0;
        }
        if acc.remote_read {
            f |= F::IBV_ACCESS_REMOTE_READ.0;
        }
        if acc.remote_atomic {
            f |= F::IBV_ACCESS_REMOTE_ATOMIC.0;
        }
        a.qp_access_flags = f;
        mask |= bit(M::IBV_QP_ACCESS_FLAGS);
    }
    if let Some(av) = attr.av {
        a.ah_attr = super::av::to_ah_attr(&av, attr.port.unwrap_or(v.port), v.gid_index, |g| g);
        mask |= bit(M::IBV_QP_AV);
    }
    if let Some(m) = attr.path_mtu {
        a.path_mtu = ffi::ibv_mtu::from(m.to_enum());
        mask |= bit(M::IBV_QP_PATH_MTU);
    }
    if let Some(v) = attr.dest_qpn {
        a.dest_qp_num = v.get();
        mask |= bit(M::IBV_QP_DEST_QPN);
    }
    if let Some(v) = attr.rq_psn {
        a.rq_psn = v.get();
        mask |= bit(M::IBV_QP_RQ_PSN);
    }
    if let Some(v) = attr.max_dest_rd_atomic {
        a.max_dest_rd_atomic = v;
        mask |= bit(M::IBV_QP_MAX_DEST_RD_ATOMIC);
    }
    if let Some(v) = attr.min_rnr_timer {
        a.min_rnr_timer = v;
        mask |= bit(M::IBV_QP_MIN_RNR_TIMER);
    }
    if let Some(v) = attr.timeout {
        a.timeout = v;
        mask |= bit(M::IBV_QP_TIMEOUT);
    }
    if let Some(v) = attr.retry_cnt {
        a.retry_cnt = v;
        mask |= bit(M::IBV_QP_RETRY_CNT);
    }
    if let Some(v) = attr.rnr_retry {
        a.rnr_retry = v;
        mask |= bit(M::IBV_QP_RNR_RETRY);
    }
    if let Some(v) = attr.sq_psn {
        a.sq_psn = v.get();
        mask |= bit(M::IBV_QP_SQ_PSN);
    }
    if let Some(v) = attr.max_rd_atomic {
        a.max_rd_atomic = v;
        mask |= bit(M::IBV_QP_MAX_QP_RD_ATOMIC);
    }
    if let Some(v) = attr.en_sqd_async_notify {
        a.en_sqd_async_notify = u8::from(v);
        mask |= bit(M::IBV_QP_EN_SQD_ASYNC_NOTIFY);
    }
    v.stats.calls.modify_qp_calls += 1;
    // SAFETY: a live QP and a filled attribute struct whose mask names the set fields.
    let rc = unsafe { ffi::ibv_modify_qp(raw, &mut a, mask) };
    if rc != 0 {
        return Err(errno_err("ibv_modify_qp", rc));
    }
    if let Some(q) = v.qps.get_mut(&qp.get()) {
        q.state = to;
        if to == QpState::Reset {
            // RESET discards every outstanding WR without completions: none will be
            // processed, so they count as completed.
            q.pending.clear();
            q.sends.clear();
            q.sends_completed = q.sends_posted;
            q.recvs = 0;
        }
    }
    if to == QpState::Reset {
        v.release_owner(Owner::Qp(qp));
        v.reap_ahs();
    }
    Ok(())
}

pub(super) fn query_qp_state(v: &HwVerbs, qp: QpNum) -> Result<QpState, VerbsError> {
    let q = v.qps.get(&qp.get()).ok_or(VerbsError::NoSuchQp(qp))?;
    Ok(v.query_state(q.raw).unwrap_or(q.state))
}

/// Destroys `qp` here: its multicast attachments are undone and its CQs swept (what the
/// device completed for it reaches the backlog before the destroy can clean it from them),
/// then `ibv_destroy_qp`, then the wrapper forgets it.
pub(super) fn destroy(v: &mut HwVerbs, qp: QpNum) -> Result<(), VerbsError> {
    let raw = v.qps.get(&qp.get()).ok_or(VerbsError::NoSuchQp(qp))?.raw;
    detach_all(v, qp);
    sweep(v, qp);
    v.stats.calls.destroy_qp_calls += 1;
    // SAFETY: a live QP; nothing else refers to it.
    let rc = unsafe { ffi::ibv_destroy_qp(raw) };
    if rc != 0 {
        return Err(errno_err("ibv_destroy_qp", rc));
    }
    forget(v, qp);
    Ok(())
}

/// Destroys a drained `qp` ([`Verbs::retire_qp`]): the wrapper forgets it now and the command
/// thread destroys it. One with work the wrapper still sees outstanding (sends not completed,
/// receives of its own posted), or multicast attachments, or with no room on the thread, is
/// destroyed here as by [`destroy`].
///
/// [`Verbs::retire_qp`]: crate::verbs::Verbs::retire_qp
pub(super) fn retire(v: &mut HwVerbs, qp: QpNum) -> Result<(), VerbsError> {
    let q = v.qps.get(&qp.get()).ok_or(VerbsError::NoSuchQp(qp))?;
    let idle = q.qp_type == QpType::Rc
        && q.mcast.is_empty()
        && q.pending.is_empty()
        && q.sends_completed >= q.sends_posted
        && (q.srq.is_some() || q.recvs == 0);
    let raw = q.raw;
    if !idle {
        return destroy(v, qp);
    }
    sweep(v, qp);
    if !v.commands.destroy(raw) {
        return destroy(v, qp);
    }
    forget(v, qp);
    Ok(())
}

/// Undoes `qp`'s multicast attachments (each device attachment once).
fn detach_all(v: &mut HwVerbs, qp: QpNum) {
    let Some(q) = v.qps.get(&qp.get()) else {
        return;
    };
    let raw = q.raw;
    let mut detached = Vec::new();
    for g in q.mcast.clone() {
        let dev = v.device_mgid(g);
        if !detached.contains(&dev) {
            let gid = ffi::ibv_gid { raw: dev.0 };
            // SAFETY: a live QP attached to `gid`.
            unsafe { ffi::ibv_detach_mcast(raw, &gid, 0) };
            detached.push(dev);
        }
        v.leave_ipv4(dev);
    }
}

/// Moves what the device completed for `qp` into the backlog of its CQs.
fn sweep(v: &mut HwVerbs, qp: QpNum) {
    let Some((send_cq, recv_cq)) = v.qps.get(&qp.get()).map(|q| (q.send_cq, q.recv_cq)) else {
        return;
    };
    let mut swept = super::cq::sweep(v, recv_cq, qp);
    if send_cq != recv_cq {
        swept += super::cq::sweep(v, send_cq, qp);
    }
    v.stats.destroy_swept_completions += swept;
}

/// Forgets a destroyed (or handed over) `qp`: its record, its WRs, its uses of the PD, CQs
/// and SRQ.
fn forget(v: &mut HwVerbs, qp: QpNum) {
    if let Some(q) = v.qps.remove(&qp.get()) {
        if q.qp_type != QpType::Rc {
            // Its sends will never be processed: the AHs they used may go.
            v.ahs.qp_gone(qp.get());
            v.reap_ahs();
        }
        v.use_pd(q.pd, -1);
        v.use_cq(q.send_cq, -1);
        v.use_cq(q.recv_cq, -1);
        if let Some(s) = q.srq.and_then(|s| v.srqs.get_mut(&s.0)) {
            s.users = s.users.saturating_sub(1);
        }
    }
    v.release_owner(Owner::Qp(qp));
}

/// `mlid` goes to `ibv_attach_mcast`'s `lid` (the SA's MLID on InfiniBand, 0 on RoCE).
pub(super) fn attach_mcast(
    v: &mut HwVerbs,
    qp: QpNum,
    mgid: Gid,
    mlid: u16,
) -> Result<(), VerbsError> {
    let q = v.qps.get(&qp.get()).ok_or(VerbsError::NoSuchQp(qp))?;
    if q.qp_type == QpType::Rc {
        return Err(VerbsError::InvalidWr("multicast on a non-UD QP"));
    }
    if mgid.0[0] != 0xFF && !mgid.to_ip().is_multicast() {
        return Err(VerbsError::InvalidWr("not a multicast GID"));
    }
    let dev = v.device_mgid(mgid);
    // Groups the device knows by one GID (the IPoIB groups of a partition on a RoCEv2 IPv4
    // port) are one device attachment, made by the first of them.
    if !q.mcast.iter().any(|g| v.device_mgid(*g) == dev) {
        let gid = ffi::ibv_gid { raw: dev.0 };
        // SAFETY: a live UD QP and a GID.
        let rc = unsafe { ffi::ibv_attach_mcast(q.raw, &gid, mlid) };
        if rc != 0 {
            return Err(errno_err("ibv_attach_mcast", rc));
        }
    }
    v.join_ipv4(dev);
    if let Some(q) = v.qps.get_mut(&qp.get()) {
        q.mcast.push(mgid);
    }
    Ok(())
}

pub(super) fn detach_mcast(v: &mut HwVerbs, qp: QpNum, mgid: Gid) -> Result<(), VerbsError> {
    let q = v.qps.get(&qp.get()).ok_or(VerbsError::NoSuchQp(qp))?;
    if !q.mcast.contains(&mgid) {
        return Err(VerbsError::NoSuchObject("multicast attachment"));
    }
    let dev = v.device_mgid(mgid);
    // The device attachment stays while another group of the QP shares it.
    let shared = q
        .mcast
        .iter()
        .any(|g| *g != mgid && v.device_mgid(*g) == dev);
    if !shared {
        let gid = ffi::ibv_gid { raw: dev.0 };
        // SAFETY: a live QP attached to `gid`.
        let rc = unsafe { ffi::ibv_detach_mcast(q.raw, &gid, 0) };
        if rc != 0 {
            return Err(errno_err("ibv_detach_mcast", rc));
        }
    }
    v.leave_ipv4(dev);
    if let Some(q) = v.qps.get_mut(&qp.get()) {
        q.mcast.retain(|g| *g != mgid);
    }
    Ok(())
}
