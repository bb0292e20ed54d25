//! Work requests: every posted WR gets a provider-internal `wr_id` mapped back to the caller's
//! [`WrId`] and [`BufId`]; SGEs over the pools' MRs; posting sends and receives.

use std::ptr;

use super::context::HwVerbs;
use super::error::errno_err;
use super::objects::{Owner, PendingSend, Wr};
use crate::verbs::{
    BufId, Completion, CqId, QpNum, QpState, QpType, SendWr, SrqId, VerbsError, WcStatus, WrId,
};
use ibverbs_sys as ffi;

impl HwVerbs {
    /// One SGE over `buf` (its first `len` bytes) in its pool's MR.
    fn sge(&mut self, buf: BufId, len: usize) -> Result<ffi::ibv_sge, VerbsError> {
        let blen = self.pools.buf_len(buf.pool)?;
        if len > blen {
            return Err(VerbsError::TooLong { len, limit: blen });
        }
        let &(mr, _) = self
            .mrs
            .get(&buf.pool)
            .ok_or(VerbsError::NoSuchObject("pool"))?;
        let (base, total) = self
            .pools
            .region(buf.pool)
            .ok_or(VerbsError::NoSuchObject("pool"))?;
        let off = (buf.index as usize)
            .checked_mul(blen)
            .filter(|o| o + blen <= total)
            .ok_or(VerbsError::BufferNotHeld(buf))?;
        // SAFETY: the MR is live (pools and MRs live as long as `self`).
        let lkey = unsafe { (*mr).lkey };
        Ok(ffi::ibv_sge {
            addr: base as u64 + off as u64,
            length: u32::try_from(len).map_err(|_| VerbsError::TooLong {
                len,
                limit: u32::MAX as usize,
            })?,
            lkey,
        })
    }

    fn new_wr(&mut self, wr: Wr) -> u64 {
        self.wrs.insert(wr)
    }

    /// Frees the buffers of every outstanding WR of `owner`.
    pub(super) fn release_owner(&mut self, owner: Owner) {
        let ids: Vec<u64> = self
            .wrs
            .iter()
            .filter(|(_, w)| w.owner == owner)
            .map(|(i, _)| i)
            .collect();
        for i in ids {
            if let Some(w) = self.wrs.remove(&i) {
                if let Some(b) = w.buf {
                    self.pools.release(b);
                }
            }
        }
    }

    pub(super) fn post_recv_raw(
        &mut self,
        owner: Owner,
        wr_id: WrId,
        buf: BufId,
    ) -> Result<(), VerbsError> {
        let blen = self.pools.buf_len(buf.pool)?;
        let mut sge = self.sge(buf, blen)?;
        self.pools.lend(buf)?;
        let id = self.new_wr(Wr {
            owner,
            user: wr_id,
            buf: Some(buf),
            send: false,
            signaled: true,
        });
        let mut wr = ffi::ibv_recv_wr {
            wr_id: id,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = ptr::null_mut();
        self.stats.calls.post_recv_calls += 1;
        // SAFETY: the QP/SRQ pointers are live objects of this context; `wr` and `sge` outlive
        // the call (the device copies them); the SGE lies inside the pool's registered MR.
        let rc = unsafe {
            match owner {
                Owner::Qp(q) => {
                    let raw = self.qps.get(&q.get()).map_or(ptr::null_mut(), |x| x.raw);
                    match (*self.ctx).ops.post_recv {
                        Some(f) if !raw.is_null() => f(raw, &mut wr, &mut bad),
                        _ => libc::EINVAL,
                    }
                }
                Owner::Srq(s) => {
                    let raw = self.srqs.get(&s.0).map_or(ptr::null_mut(), |x| x.raw);
                    match (*self.ctx).ops.post_srq_recv {
                        Some(f) if !raw.is_null() => f(raw, &mut wr, &mut bad),
                        _ => libc::EINVAL,
                    }
                }
            }
        };
        if rc != 0 {
            self.wrs.remove(&id);
            self.pools.reclaim(buf);
            return Err(if rc == libc::ENOMEM {
                VerbsError::QueueFull
            } else {
                errno_err("post_recv", rc)
            });
        }
        self.stats.calls.recv_wrs += 1;
        Ok(())
    }
}

/// Posts `wrs` on `srq` as one chain of `ibv_recv_wr` (one `ibv_post_srq_recv`, one
/// doorbell): at most the room the SRQ has, up to the first buffer that cannot be lent;
/// returns how many the device took (those before the one it reported bad).
pub(super) fn post_srq_chain(
    v: &mut HwVerbs,
    srq: SrqId,
    wrs: &[(WrId, BufId)],
) -> Result<usize, VerbsError> {
    let s = v.srqs.get(&srq.0).ok_or(VerbsError::NoSuchObject("SRQ"))?;
    let (raw, room) = (s.raw, (s.max_wr as usize).saturating_sub(s.posted));
    let mut sges = Vec::with_capacity(wrs.len().min(room));
    let mut taken = Vec::with_capacity(sges.capacity());
    for &(wr_id, buf) in wrs.iter().take(room) {
        let Ok(blen) = v.pools.buf_len(buf.pool) else {
            break;
        };
        let Ok(sge) = v.sge(buf, blen) else { break };
        if v.pools.lend(buf).is_err() {
            break;
        }
        let id = v.new_wr(Wr {
            owner: Owner::Srq(srq),
            user: wr_id,
            buf: Some(buf),
            send: false,
            signaled: true,
        });
        sges.push(sge);
        taken.push((id, buf));
    }
    let n = taken.len();
    if n == 0 {
        return Ok(0);
    }
    let mut chain: Vec<ffi::ibv_recv_wr> = taken
        .iter()
        .zip(sges.iter_mut())
        .map(|(&(id, _), sge)| ffi::ibv_recv_wr {
            wr_id: id,
            next: ptr::null_mut(),
            sg_list: sge,
            num_sge: 1,
        })
        .collect();
    let base = chain.as_mut_ptr();
    for i in 1..n {
        // SAFETY: `i - 1` and `i` are below `chain.len()`; the vector is not resized while the
        // pointers live.
        unsafe { (*base.add(i - 1)).next = base.add(i) };
    }
    let mut bad: *mut ffi::ibv_recv_wr = ptr::null_mut();
    v.stats.calls.post_recv_calls += 1;
    // SAFETY: a live SRQ of this context; the chain and its SGEs outlive the call (the device
    // copies them); each SGE lies inside its pool's registered MR.
    let rc = unsafe {
        match (*v.ctx).ops.post_srq_recv {
            Some(f) if !raw.is_null() => f(raw, base, &mut bad),
            _ => libc::EINVAL,
        }
    };
    let posted = if rc == 0 {
        n
    } else if bad.is_null() {
        0
    } else {
        ((bad as usize).saturating_sub(base as usize) / size_of::<ffi::ibv_recv_wr>()).min(n)
    };
    for &(id, buf) in taken.get(posted..).unwrap_or(&[]) {
        v.wrs.remove(&id);
        v.pools.reclaim(buf);
    }
    if let Some(s) = v.srqs.get_mut(&srq.0) {
        s.posted += posted;
    }
    v.stats.calls.recv_wrs += posted as u64;
    Ok(posted)
}

pub(super) fn post_send(v: &mut HwVerbs, qp: QpNum, wr: &SendWr) -> Result<(), VerbsError> {
    let q = v.qps.get(&qp.get()).ok_or(VerbsError::NoSuchQp(qp))?;
    if !matches!(q.state, QpState::Rts | QpState::Sqd | QpState::Err) {
        return Err(VerbsError::InvalidState { qp, state: q.state });
    }
    if q.sends.len() >= q.max_send_wr as usize {
        return Err(VerbsError::QueueFull);
    }
    let (qp_type, pd, sig_all, max_inline) = (q.qp_type, q.pd, q.sq_sig_all, q.max_inline);
    if qp_type != QpType::Rc {
        let mtu = v.attr.active_mtu.bytes();
        if wr.len > mtu {
            return Err(VerbsError::TooLong {
                len: wr.len,
                limit: mtu,
            });
        }
    } else if wr.len > v.attr.max_msg_size {
        return Err(VerbsError::TooLong {
            len: wr.len,
            limit: v.attr.max_msg_size,
        });
    }
    let ah = match (qp_type, wr.ud) {
        (QpType::Rc, _) => None,
        (_, Some(d)) => Some((v.ah_for(pd, d.av)?.raw, d)),
        (_, None) => return Err(VerbsError::InvalidWr("UD send without a destination")),
    };
    let sge = match wr.buf {
        Some(b) => Some(v.sge(b, wr.len)?),
        None if wr.len > 0 => return Err(VerbsError::InvalidWr("length without a buffer")),
        None => None,
    };
    if let Some(b) = wr.buf {
        v.pools.lend(b)?;
    }
    let signaled = wr.signaled || sig_all;
    let id = v.new_wr(Wr {
        owner: Owner::Qp(qp),
        user: wr.wr_id,
        buf: wr.buf,
        send: true,
        signaled,
    });
    // A small payload goes in the WQE itself: the device does not read the buffer (one DMA
    // read fewer per packet); the buffer stays lent until the completion all the same.
    let inline = wr.len > 0 && wr.len <= max_inline as usize;
    let Some(q) = v.qps.get_mut(&qp.get()) else {
        return Err(VerbsError::NoSuchQp(qp));
    };
    q.sends.push_back(id);
    q.sends_posted += 1;
    q.pending.push(PendingSend {
        id,
        sge,
        imm: wr.imm,
        solicited: wr.solicited,
        inline,
        ud: ah.map(|(ah, d)| (ah, d.remote_qpn.get(), d.remote_qkey.0)),
    });
    if let (Some(d), true) = (wr.ud, ah.is_some()) {
        v.ahs.note_post(&(pd, d.av), qp.get(), q.sends_posted);
    }
    let full = q.pending.len() >= MAX_CHAIN;
    if q.pending.len() == 1 {
        v.chained.push(qp.get());
    }
    if full {
        flush_sends(v, qp);
    }
    Ok(())
}

/// The most sends one doorbell carries: a chain this long is posted at once.
pub(super) const MAX_CHAIN: usize = 32;

/// One send in `SIGNAL_EVERY` of a chain asks the device for a completion, and so does the
/// last: the completion of a send tells that every earlier send of its QP is done (sends
/// complete in order), which is how the others are reclaimed and reported.
pub(super) const SIGNAL_EVERY: usize = 16;

/// Posts the sends chained on `qp` since its last doorbell: one `ibv_post_send` for all of
/// them, every [`SIGNAL_EVERY`]th and the last signaled on the device. A send the device
/// refuses (with those after it) completes with [`WcStatus::LocQpOpErr`] if its caller asked
/// for a completion; its buffer is given back either way.
pub(super) fn flush_sends(v: &mut HwVerbs, qp: QpNum) {
    let Some(q) = v.qps.get_mut(&qp.get()) else {
        return;
    };
    let chain = std::mem::take(&mut q.pending);
    if chain.is_empty() {
        return;
    }
    let (raw, send_cq) = (q.raw, q.send_cq);
    let mut sges: Vec<ffi::ibv_sge> = chain
        .iter()
        .map(|p| {
            p.sge.unwrap_or(ffi::ibv_sge {
                addr: 0,
                length: 0,
                lkey: 0,
            })
        })
        .collect();
    // SAFETY: ibv_send_wr is a plain C struct; all-zero is valid.
    let mut wrs: Vec<ffi::ibv_send_wr> = vec![unsafe { std::mem::zeroed() }; chain.len()];
    let last = chain.len() - 1;
    for (i, (p, w)) in chain.iter().zip(wrs.iter_mut()).enumerate() {
        w.wr_id = p.id;
        w.opcode = if p.imm.is_some() {
            ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM
        } else {
            ffi::ibv_wr_opcode::IBV_WR_SEND
        };
        if let Some(imm) = p.imm {
            w.__bindgen_anon_1.imm_data = imm.to_be();
        }
        let mut flags = 0;
        if i == last || (i + 1) % SIGNAL_EVERY == 0 {
            flags |= ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if p.solicited {
            flags |= ffi::ibv_send_flags::IBV_SEND_SOLICITED.0;
        }
        if p.inline {
            flags |= ffi::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        w.send_flags = flags;
        if let Some((ah, remote_qpn, remote_qkey)) = p.ud {
            w.wr.ud = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
                ah,
                remote_qpn,
                remote_qkey,
            };
        }
    }
    // Link the chain now that neither vector moves any more.
    let base = wrs.as_mut_ptr();
    for (i, p) in chain.iter().enumerate() {
        // SAFETY: `i` and `i + 1` are within `wrs` (checked by the range); the pointers stay
        // valid until both vectors drop after the post.
        unsafe {
            let w = base.add(i);
            if p.sge.is_some() {
                (*w).sg_list = sges.as_mut_ptr().add(i);
                (*w).num_sge = 1;
            }
            if i < last {
                (*w).next = base.add(i + 1);
            }
        }
    }
    let mut bad: *mut ffi::ibv_send_wr = ptr::null_mut();
    v.stats.calls.post_send_calls += 1;
    // SAFETY: a live QP of this context; the chain and its SGEs outlive the call (the device
    // copies them); each SGE lies inside its pool's registered MR over a lent buffer.
    let rc = unsafe {
        match (*v.ctx).ops.post_send {
            Some(f) => f(raw, base, &mut bad),
            None => libc::ENOSYS,
        }
    };
    let posted = if rc == 0 {
        chain.len()
    } else if bad.is_null() {
        0
    } else {
        // SAFETY: `bad` points into `wrs` (the provider names the first WR it refused).
        usize::try_from(unsafe { bad.offset_from(base) }).unwrap_or(0)
    };
    v.stats.calls.send_wrs += posted as u64;
    v.stats.calls.inline_sends += chain.iter().take(posted).filter(|p| p.inline).count() as u64;
    if posted < chain.len() {
        tracing::debug!(qp = %qp, refused = chain.len() - posted, rc, "post_send refused a chain's tail");
        refuse_sends(v, qp, send_cq, chain.get(posted..).unwrap_or_default());
    }
}

/// The sends of `refused` never reached the device: out of the QP's send queue, their
/// buffers back, a [`WcStatus::LocQpOpErr`] completion for those whose caller asked for one.
fn refuse_sends(v: &mut HwVerbs, qp: QpNum, cq: CqId, refused: &[PendingSend]) {
    if let Some(q) = v.qps.get_mut(&qp.get()) {
        q.sends.retain(|id| !refused.iter().any(|p| p.id == *id));
        q.sends_posted = q.sends_posted.saturating_sub(refused.len() as u64);
    }
    for p in refused {
        let Some(w) = v.wrs.remove(&p.id) else {
            continue;
        };
        if !w.signaled {
            if let Some(b) = w.buf {
                v.pools.release(b);
            }
            continue;
        }
        if let Some(b) = w.buf {
            v.pools.reclaim(b);
        }
        let c = Completion::of_send(w.user, qp, w.buf, WcStatus::LocQpOpErr);
        if let Some(x) = v.cqs.get_mut(&cq.0) {
            x.backlog.push_back(c);
        }
    }
}

/// Posts every chain waiting for its doorbell.
pub(super) fn flush_all(v: &mut HwVerbs) {
    for qpn in std::mem::take(&mut v.chained) {
        flush_sends(v, QpNum::new(qpn));
    }
}

pub(super) fn post_recv(
    v: &mut HwVerbs,
    qp: QpNum,
    wr_id: WrId,
    buf: BufId,
) -> Result<(), VerbsError> {
    let q = v.qps.get(&qp.get()).ok_or(VerbsError::NoSuchQp(qp))?;
    if q.srq.is_some() {
        return Err(VerbsError::UsesSrq(qp));
    }
    if q.state == QpState::Reset {
        return Err(VerbsError::InvalidState { qp, state: q.state });
    }
    if q.recvs >= q.max_recv_wr as usize {
        return Err(VerbsError::QueueFull);
    }
    v.post_recv_raw(Owner::Qp(qp), wr_id, buf)?;
    if let Some(q) = v.qps.get_mut(&qp.get()) {
        q.recvs += 1;
    }
    Ok(())
}
