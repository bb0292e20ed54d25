//! Work requests: every posted WR gets a provider-internal `wr_id` mapped back to the caller's
//! [`WrId`] and [`BufId`]; SGEs over the pools' MRs; posting sends and receives.

use std::ptr;

use super::context::HwVerbs;
use super::error::errno_err;
use super::objects::{Owner, Wr};
use crate::verbs::{BufId, QpNum, QpState, QpType, SendWr, VerbsError, WrId};
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

pub(super) fn post_send(v: &mut HwVerbs, qp: QpNum, wr: &SendWr) -> Result<(), VerbsError> {
    let q = v.qps.get(&qp.get()).ok_or(VerbsError::NoSuchQp(qp))?;
    if !matches!(q.state, QpState::Rts | QpState::Sqd | QpState::Err) {
        return Err(VerbsError::InvalidState { qp, state: q.state });
    }
    if q.sends.len() >= q.max_send_wr as usize {
        return Err(VerbsError::QueueFull);
    }
    let (raw, qp_type, pd, sig_all, max_inline) =
        (q.raw, q.qp_type, q.pd, q.sq_sig_all, q.max_inline);
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
    let mut sge = match wr.buf {
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
    // SAFETY: ibv_send_wr is a plain C struct; all-zero is valid.
    let mut w: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
    w.wr_id = id;
    if let Some(s) = sge.as_mut() {
        w.sg_list = s;
        w.num_sge = 1;
    }
    w.opcode = if wr.imm.is_some() {
        ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM
    } else {
        ffi::ibv_wr_opcode::IBV_WR_SEND
    };
    if let Some(imm) = wr.imm {
        w.__bindgen_anon_1.imm_data = imm.to_be();
    }
    // Every send is signaled on the device, so that an unsignaled WR (whose completion
    // the caller never sees) still tells us when its buffer is free again.
    let mut flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
    if wr.solicited {
        flags |= ffi::ibv_send_flags::IBV_SEND_SOLICITED.0;
    }
    // A small payload goes in the WQE itself: the device does not read the buffer (one DMA
    // read fewer per packet); the buffer stays lent until the completion all the same.
    let inline = wr.len > 0 && wr.len <= max_inline as usize;
    if inline {
        flags |= ffi::ibv_send_flags::IBV_SEND_INLINE.0;
    }
    w.send_flags = flags;
    if let Some((ah, d)) = ah {
        w.wr.ud = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
            ah,
            remote_qpn: d.remote_qpn.get(),
            remote_qkey: d.remote_qkey.0,
        };
    }
    let mut bad = ptr::null_mut();
    v.stats.calls.post_send_calls += 1;
    // SAFETY: a live QP of this context; `w` and `sge` outlive the call (the device copies
    // them); the SGE lies inside the pool's registered MR and the buffer is now lent.
    let rc = unsafe {
        match (*v.ctx).ops.post_send {
            Some(f) => f(raw, &mut w, &mut bad),
            None => libc::ENOSYS,
        }
    };
    if rc != 0 {
        v.wrs.remove(&id);
        if let Some(b) = wr.buf {
            v.pools.reclaim(b);
        }
        return Err(if rc == libc::ENOMEM {
            VerbsError::QueueFull
        } else {
            errno_err("post_send", rc)
        });
    }
    v.stats.calls.send_wrs += 1;
    v.stats.calls.inline_sends += u64::from(inline);
    if let Some(q) = v.qps.get_mut(&qp.get()) {
        q.sends.push_back(id);
        q.sends_posted += 1;
        if let (Some(d), true) = (wr.ud, ah.is_some()) {
            v.ahs.note_post(&(pd, d.av), qp.get(), q.sends_posted);
        }
    }
    Ok(())
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
