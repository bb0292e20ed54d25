//! The completer (rxe `rxe_comp.c`): ACKs, NAKs and RNR NAKs retire send WQEs, rewind the
//! requester for go-back-N, and drive the retransmit timer and the retry budgets.

use std::time::Instant;

use super::device::Device;
use super::qp::Qp;
use super::sched::TimerKind;
use crate::verbs::{Psn, QpState, WcStatus};
use crate::wire::ext::{rnr_timer_duration, NakCode, Syndrome};
use crate::wire::roce::RocePacket;

impl Device {
    /// A transport error on the send side: the head WQE completes with `status`, then ERR.
    fn fail_requester(&mut self, qp: &mut Qp, status: WcStatus) {
        if let Some(w) = qp.req.sq.pop_front() {
            self.complete_send(qp, &w, status);
        }
        self.enter_error(qp);
    }

    /// Retires every WQE whose last PSN is at or before `psn`.
    fn retire_through(&mut self, qp: &mut Qp, psn: Psn) {
        while let Some(w) = qp.req.sq.front() {
            // `psn` is below `high_psn`, so a WQE ending at or before it was sent entirely.
            if w.npkts == 0 || w.last_psn().diff(psn) > 0 {
                break;
            }
            if let Some(w) = qp.req.sq.pop_front() {
                if qp.req.send_idx > 0 {
                    qp.req.send_idx -= 1;
                } else {
                    qp.req.send_pkt = 0;
                }
                self.complete_send(qp, &w, WcStatus::Success);
            }
        }
    }

    pub(super) fn on_ack(&mut self, qp: &mut Qp, now: Instant, pkt: &RocePacket<'_>) {
        if !matches!(qp.state, QpState::Rts | QpState::Sqd) {
            self.stats.rx_bad_state += 1;
            return;
        }
        let Some(aeth) = pkt.aeth else {
            self.stats.rx_malformed += 1;
            return;
        };
        let psn = Psn::new(pkt.bth.psn);
        let req = &qp.req;
        // An ACK may cover PSNs in [comp_psn - 1, psn - 1]; a NAK names a PSN in
        // [comp_psn, psn]. Anything else is stale or bogus.
        let last_sent = req.high_psn.sub(1);
        let lo = req.comp_psn.sub(1);
        let in_window = psn.diff(lo) >= 0 && last_sent.diff(psn) >= 0;
        match aeth.syndrome {
            Syndrome::Ack { .. } => {
                if !in_window || psn.diff(req.comp_psn) < 0 {
                    // Duplicate ACK of what is already retired, or beyond what was sent.
                    if !in_window {
                        self.stats.rx_bad_ack += 1;
                    }
                    return;
                }
                self.retire_through(qp, psn);
                let acked = psn.add(1).diff(qp.req.comp_psn);
                qp.req.comp_psn = psn.add(1);
                if qp.req.retrying_from.is_none() {
                    qp.req.window_grow(u32::try_from(acked).unwrap_or(0));
                }
                self.catch_up(qp);
                self.progress(qp, now);
            }
            Syndrome::Nak(NakCode::PsnSequenceError) => {
                let nak_ok = psn.diff(req.comp_psn) >= 0 && req.high_psn.diff(psn) >= 0;
                if !nak_ok {
                    self.stats.rx_bad_ack += 1;
                    return;
                }
                self.stats.rx_seq_naks += 1;
                if qp.req.rnr_at.is_some() {
                    return;
                }
                self.retire_through(qp, psn.sub(1));
                let advanced = psn != qp.req.comp_psn;
                qp.req.comp_psn = psn;
                if advanced {
                    self.progress(qp, now);
                }
                if qp.req.retrying_from == Some(psn) && !advanced {
                    return;
                }
                if qp.req.retry_left == 0 {
                    self.fail_requester(qp, WcStatus::RetryExcErr);
                    return;
                }
                qp.req.retry_left -= 1;
                qp.req.retrying_from = Some(psn);
                qp.req.window_shrink();
                qp.req.rewind(psn);
            }
            Syndrome::RnrNak { timer } => {
                let nak_ok = psn.diff(req.comp_psn) >= 0 && req.high_psn.diff(psn) > 0;
                if !nak_ok {
                    self.stats.rx_bad_ack += 1;
                    return;
                }
                self.stats.rx_rnr_naks += 1;
                // A second RNR NAK for the PSN whose back-off is still running (the wire
                // duplicated it) reports no new attempt: nothing was resent since the first,
                // so it spends no RNR retry.
                if qp.req.rnr_at.is_some() && qp.req.retrying_from == Some(psn) {
                    return;
                }
                self.retire_through(qp, psn.sub(1));
                qp.req.comp_psn = psn;
                if qp.req.rnr_retry_left == 0 {
                    self.fail_requester(qp, WcStatus::RnrRetryExcErr);
                    return;
                }
                if qp.req.rnr_retry_left != 7 {
                    qp.req.rnr_retry_left -= 1;
                }
                qp.req.rewind(psn);
                qp.req.retrying_from = Some(psn);
                qp.req.retransmit_at = None;
                self.sched
                    .arm(qp, TimerKind::Rnr, now + rnr_timer_duration(timer));
            }
            Syndrome::Nak(code) => {
                if !in_window {
                    self.stats.rx_bad_ack += 1;
                    return;
                }
                self.retire_through(qp, psn.sub(1));
                let status = match code {
                    NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                    NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                    _ => WcStatus::RemOpErr,
                };
                self.fail_requester(qp, status);
            }
        }
    }

    /// After an acknowledgement moved `comp_psn` past the resend position (a go-back-N that
    /// turned out unnecessary), skip ahead instead of resending acknowledged packets.
    fn catch_up(&mut self, qp: &mut Qp) {
        if qp.req.psn.diff(qp.req.comp_psn) < 0 {
            let to = qp.req.comp_psn;
            qp.req.rewind(to);
        }
    }

    /// The peer acknowledged something: reset the retry budgets, re-arm or stop the timer.
    fn progress(&mut self, qp: &mut Qp, now: Instant) {
        qp.req.retry_left = qp.attrs.retry_cnt;
        // Both budgets are per episode, not per QP life: rxe's `reset_retry_counters`
        // restores `rnr_retry` with `retry_cnt` on every ACK.
        qp.req.rnr_retry_left = qp.attrs.rnr_retry;
        qp.req.retrying_from = None;
        qp.req.timeouts_in_row = 0;
        if qp.req.unacked() == 0 {
            qp.req.retransmit_at = None;
        } else if let Some(iv) = qp.retransmit_interval() {
            self.sched.arm(qp, TimerKind::Retransmit, now + iv);
        }
    }

    pub(super) fn on_retransmit_timeout(&mut self, qp: &mut Qp, now: Instant) {
        qp.req.retransmit_at = None;
        // SQD still completes what it has begun, so its losses are recovered too.
        if qp.req.unacked() == 0 || !matches!(qp.state, QpState::Rts | QpState::Sqd) {
            return;
        }
        self.stats.retransmit_timeouts += 1;
        if qp.req.retry_left == 0 {
            self.fail_requester(qp, WcStatus::RetryExcErr);
            return;
        }
        qp.req.retry_left -= 1;
        // Back off while timeouts follow each other without progress: 1, 2, 4, then 8 times
        // the interval (ConnectX's adaptive retransmission does likewise). A peer that is
        // merely slow, or a CPU that did not run us for a while, then costs retries over ~47
        // intervals instead of 8, while a dead peer still fails after `retry_cnt` timeouts.
        qp.req.timeouts_in_row = qp.req.timeouts_in_row.saturating_add(1);
        qp.req.window_shrink();
        let from = qp.req.comp_psn;
        qp.req.rewind(from);
        if let Some(iv) = qp.retransmit_interval() {
            let backoff = 1u32 << qp.req.timeouts_in_row.min(3);
            self.sched
                .arm(qp, TimerKind::Retransmit, now + iv * backoff);
        }
    }
}
