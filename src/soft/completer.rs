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
                let acked = self.acknowledged_before(qp, psn.add(1), now);
                if qp.req.recovery.is_none() {
                    qp.req.window_grow(acked);
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
                let advanced = self.acknowledged_before(qp, psn, now) > 0;
                if advanced {
                    self.progress(qp, now);
                }
                if qp.req.retrying_from == Some(psn) && !advanced {
                    return;
                }
                if qp.req.resending(psn, now, qp.resend_guard()) {
                    // The packet this NAK answers was sent before the go-back-N in
                    // progress, which resends it (or has, less than an RTT ago).
                    self.stats.naks_ignored_in_recovery += 1;
                    self.catch_up(qp);
                    return;
                }
                if qp.req.retry_left == 0 {
                    self.fail_requester(qp, WcStatus::RetryExcErr);
                    return;
                }
                qp.req.retry_left -= 1;
                qp.req.retrying_from = Some(psn);
                let guard = qp.resend_guard();
                if qp
                    .req
                    .shrunk_at
                    .is_none_or(|t| now.saturating_duration_since(t) >= guard)
                {
                    qp.req.shrunk_at = Some(now);
                    self.shrink_window(qp);
                }
                qp.req.go_back(psn, now);
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
                self.acknowledged_before(qp, psn, now);
                if qp.req.rnr_retry_left == 0 {
                    self.fail_requester(qp, WcStatus::RnrRetryExcErr);
                    return;
                }
                if qp.req.rnr_retry_left != 7 {
                    qp.req.rnr_retry_left -= 1;
                }
                qp.req.rewind(psn);
                // What is resent after the back-off measures no round trip.
                qp.req.rtt_probe = None;
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

    /// The peer acknowledged every PSN before `to`, explicitly or implicitly (a NAK): retires
    /// the WQEs that completes, counts the PSNs newly delivered (returned), measures the RTT
    /// when the timed PSN is among them, and ends a recovery they complete.
    fn acknowledged_before(&mut self, qp: &mut Qp, to: Psn, now: Instant) -> u32 {
        self.retire_through(qp, to.sub(1));
        let newly = u32::try_from(to.diff(qp.req.comp_psn)).unwrap_or(0);
        if newly == 0 {
            return 0;
        }
        qp.req.comp_psn = to;
        self.stats.tx_delivered += u64::from(newly);
        if let Some((timed, sent)) = qp.req.rtt_probe {
            if to.diff(timed) > 0 {
                qp.req.rtt_probe = None;
                qp.req.rtt.sample(now.saturating_duration_since(sent));
                // Karn: a packet sent once was acknowledged, so the back-off ends.
                qp.req.timeouts_in_row = 0;
                if let Some(s) = qp.req.rtt.srtt() {
                    self.stats.srtt_us = u64::try_from(s.as_micros()).unwrap_or(u64::MAX);
                }
            }
        }
        if qp.req.recovery.is_some_and(|r| to.diff(r.to) >= 0) {
            qp.req.recovery = None;
        }
        newly
    }

    /// A loss started a go-back-N: halve the send window.
    fn shrink_window(&mut self, qp: &mut Qp) {
        qp.req.window_shrink();
        self.stats.window_shrinks += 1;
    }

    /// The peer acknowledged something: reset the retry budgets, re-arm or stop the timer.
    fn progress(&mut self, qp: &mut Qp, now: Instant) {
        qp.req.retry_left = qp.attrs.retry_cnt;
        // Both budgets are per episode, not per QP life: rxe's `reset_retry_counters`
        // restores `rnr_retry` with `retry_cnt` on every ACK.
        qp.req.rnr_retry_left = qp.attrs.rnr_retry;
        qp.req.retrying_from = None;
        if qp.req.unacked() == 0 {
            qp.req.retransmit_at = None;
        } else if let Some(at) = qp.retransmit_deadline(now) {
            self.sched.arm(qp, TimerKind::Retransmit, at);
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
        // Back off while timeouts follow each other with no round trip measured since: 1, 2,
        // 4, then 8 times the timeout (ConnectX's adaptive retransmission does likewise). A
        // peer that is merely slow, or a CPU that did not run us for a while, then costs
        // retries over ~47 timeouts instead of 8, while a dead peer still fails after
        // `retry_cnt` timeouts.
        qp.req.timeouts_in_row = qp.req.timeouts_in_row.saturating_add(1);
        self.shrink_window(qp);
        let from = qp.req.comp_psn;
        qp.req.go_back(from, now);
        if let Some(at) = qp.retransmit_deadline(now) {
            self.sched.arm(qp, TimerKind::Retransmit, at);
        }
    }
}
