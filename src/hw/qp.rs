//! Queue pairs: creation, `modify_qp` (checked by [`check_modify`] against the state the
//! device reports), multicast attachment and destruction.

use std::collections::VecDeque;
use std::ptr;

use super::commands::{self, RawMoves, RawQpInit};
use super::context::HwVerbs;
use super::error::errno_err;
use super::ffi_map::{bit, state_from, state_to};
use super::objects::Owner;
use super::objects::{Moving, Qp};
use crate::verbs::{
    check_modify, Gid, Moved, Moves, QpAttr, QpInit, QpNum, QpState, QpType, VerbsError,
};
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
            moving: None,
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
    settle(v, qp);
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
    let (mut a, mask, to) = raw_attr(v, qp_type, current, attr)?;
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
    v.stats.calls.modify_qp_calls += 1;
    // SAFETY: a live QP and a filled attribute struct whose mask names the set fields.
    let rc = unsafe { ffi::ibv_modify_qp(raw, &mut a, mask) };
    if rc != 0 {
        return Err(errno_err("ibv_modify_qp", rc));
    }
    moved_to(v, qp, to);
    Ok(())
}

/// The `ibv_modify_qp` arguments of `attr` for a QP of `qp_type` in `current`, once
/// [`check_modify`] passed them: the attribute struct, its mask, and the state it moves to.
fn raw_attr(
    v: &HwVerbs,
    qp_type: QpType,
    current: QpState,
    attr: &QpAttr,
) -> Result<(ffi::ibv_qp_attr, i32, QpState), VerbsError> {
    check_modify(qp_type, current, attr)?;
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
    Ok((a, mask, to))
}

/// The wrapper's record of `qp` follows a move to `to` that the device made.
fn moved_to(v: &mut HwVerbs, qp: QpNum, to: QpState) {
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
}

/// Starts `qp`'s moves through `attrs` ([`Verbs::begin_moves`]): each checked against the
/// state before it and handed, with its `ibv_modify_qp` arguments, to the command thread,
/// whose answer [`poll_moved`] passes on. Done here instead (as [`modify`] does each) when a
/// check fails from the tracked state (the device is then asked for its own), for moves to
/// or from SQD or to RESET (the wrapper has its own work there), and when the thread cannot
/// take them.
///
/// [`Verbs::begin_moves`]: crate::verbs::Verbs::begin_moves
pub(super) fn begin_moves(
    v: &mut HwVerbs,
    qp: QpNum,
    attrs: &[QpAttr],
) -> Result<Moves, VerbsError> {
    settle(v, qp);
    super::wr::flush_sends(v, qp);
    let q = v.qps.get(&qp.get()).ok_or(VerbsError::NoSuchQp(qp))?;
    let (raw, qp_type, mut state) = (q.raw, q.qp_type, q.state);
    let mut here = attrs.is_empty()
        || state == QpState::Sqd
        || attrs
            .iter()
            .any(|a| matches!(a.state, Some(QpState::Sqd | QpState::Reset)));
    let mut steps = Vec::with_capacity(attrs.len());
    let mut states = Vec::with_capacity(attrs.len());
    for a in attrs {
        if here {
            break;
        }
        match raw_attr(v, qp_type, state, a) {
            Ok((raw_attr, mask, to)) => {
                steps.push((raw_attr, mask));
                states.push(to);
                state = to;
            }
            Err(_) => here = true,
        }
    }
    if !here {
        v.next_moves = v.next_moves.wrapping_add(1);
        let token = v.next_moves;
        let moves = RawMoves {
            qp: raw,
            qpn: qp.get(),
            token,
            steps,
        };
        if v.commands.modify(moves).is_ok() {
            if let Some(q) = v.qps.get_mut(&qp.get()) {
                q.moving = Some(Moving { token, states });
            }
            v.moving_qps += 1;
            return Ok(Moves::Started);
        }
    }
    for a in attrs {
        modify(v, qp, a)?;
    }
    Ok(Moves::Done)
}

/// The next result of moves the command thread answered ([`Verbs::poll_moved`]).
///
/// [`Verbs::poll_moved`]: crate::verbs::Verbs::poll_moved
pub(super) fn poll_moved(v: &mut HwVerbs) -> Option<Moved> {
    if v.moving_qps > 0 || v.commands.has_moved() {
        v.commands.collect();
        take_moved(v);
    }
    v.moved.pop_front()
}

/// Takes in the moves the thread answered: each QP's tracked state follows the moves done,
/// and the result waits for [`poll_moved`]. An answer for a QP destroyed or retired since
/// (its token no longer its record's) is dropped.
fn take_moved(v: &mut HwVerbs) {
    while let Some(m) = v.commands.take_moved() {
        let Some(q) = v.qps.get_mut(&m.qpn) else {
            continue;
        };
        if q.moving.as_ref().is_none_or(|mv| mv.token != m.token) {
            continue;
        }
        let Some(mv) = q.moving.take() else {
            continue;
        };
        v.moving_qps = v.moving_qps.saturating_sub(1);
        if let Some(to) = m.done.checked_sub(1).and_then(|i| mv.states.get(i)) {
            q.state = *to;
        }
        v.moved.push_back(Moved {
            qp: QpNum::new(m.qpn),
            result: m.result.map_err(|rc| errno_err("ibv_modify_qp", rc)),
        });
    }
}

/// Waits for `qp`'s moves on the command thread, if it has any: a verb on it sees them done.
pub(super) fn settle(v: &mut HwVerbs, qp: QpNum) {
    if v.moving_qps == 0 {
        return;
    }
    let Some(token) = v
        .qps
        .get(&qp.get())
        .and_then(|q| q.moving.as_ref().map(|m| m.token))
    else {
        return;
    };
    v.commands.wait_for(token);
    take_moved(v);
}

pub(super) fn query_qp_state(v: &HwVerbs, qp: QpNum) -> Result<QpState, VerbsError> {
    let q = v.qps.get(&qp.get()).ok_or(VerbsError::NoSuchQp(qp))?;
    Ok(v.query_state(q.raw).unwrap_or(q.state))
}

/// Destroys `qp` here: its multicast attachments are undone and its CQs swept (what the
/// device completed for it reaches the backlog before the destroy can clean it from them),
/// then `ibv_destroy_qp`, then the wrapper forgets it.
pub(super) fn destroy(v: &mut HwVerbs, qp: QpNum) -> Result<(), VerbsError> {
    settle(v, qp);
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
    if !v.moved.is_empty() {
        v.moved.retain(|m| m.qp != qp);
    }
    if let Some(q) = v.qps.remove(&qp.get()) {
        if q.moving.is_some() {
            // Its moves' answer (a retired QP's destroy waits behind them) is dropped.
            v.moving_qps = v.moving_qps.saturating_sub(1);
        }
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
