//! The transmit path: the next datagram from the multicast fan-out, the fault injector or the
//! next ready QP.

use std::net::SocketAddr;
use std::time::Instant;

use super::SoftVerbs;
use crate::soft::device::Device;
use crate::soft::ib::{beacon_group, BEACON_INTERVAL};
use crate::soft::qp::Qp;
use crate::verbs::QpType;

impl SoftVerbs {
    /// Writes the next datagram to send into `buf` (replacing its contents) and returns where
    /// it goes, or `None` when there is nothing to send.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<SocketAddr> {
        buf.clear();
        self.poll_transmit_append(now, buf)
    }

    /// As [`poll_transmit`](Self::poll_transmit), but appends the datagram to `buf` (which
    /// keeps its contents; unchanged when `None`), so that a transport can build a train of
    /// datagrams in place.
    pub fn poll_transmit_append(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<SocketAddr> {
        if self.lost {
            return None;
        }
        let start = buf.len();
        if let Some(to) = self.dev.beacon_due(now, buf) {
            return Some(to);
        }
        loop {
            if let Some((dst, d)) = self.dev.mcast.fanout.pop_front() {
                self.dev.stats.tx_packets += 1;
                if self.faults.config().is_clean() {
                    buf.extend_from_slice(&d);
                    return Some(dst);
                }
                self.faults.push(dst, d);
                continue;
            }
            if let Some((dst, d)) = self.faults.pop() {
                buf.extend_from_slice(&d);
                return Some(dst);
            }
            let Some(qpn) = self.dev.sched.next_ready() else {
                self.faults.flush_held();
                let (dst, d) = self.faults.pop()?;
                buf.extend_from_slice(&d);
                return Some(dst);
            };
            let Some(qp) = self.qps.get_mut(qpn) else {
                continue;
            };
            qp.ready_queued = false;
            if self.faults.config().is_clean() {
                // Straight into the caller's buffer.
                let dst = self.dev.next_packet(qp, now, buf);
                if qp.has_work() {
                    self.dev.sched.mark_ready(qp);
                }
                match dst {
                    Some(dst) => {
                        self.dev.stats.tx_packets += 1;
                        return Some(dst);
                    }
                    None => {
                        buf.truncate(start);
                        continue;
                    }
                }
            }
            let mut out = std::mem::take(&mut self.scratch);
            out.clear();
            let dst = self.dev.next_packet(qp, now, &mut out);
            if qp.has_work() {
                self.dev.sched.mark_ready(qp);
            }
            if let Some(dst) = dst {
                self.dev.stats.tx_packets += 1;
                self.faults.push(dst, out.clone());
            }
            self.scratch = out;
        }
    }
}

impl Device {
    /// On an InfiniBand link whose beacon is due: the routes past their time forgotten, the
    /// beacon appended to `out` for the beacon group, and queued for every fan-out peer;
    /// returns where the first copy goes.
    fn beacon_due(&mut self, now: Instant, out: &mut Vec<u8>) -> Option<SocketAddr> {
        let ib = self.ib.as_mut()?;
        if ib.beacon_at.is_none_or(|at| now < at) {
            return None;
        }
        ib.beacon_at = Some(now + BEACON_INTERVAL);
        ib.routes.expire(now);
        let b = ib.beacon().to_bytes();
        let port = self.cfg.dst_port;
        let group = SocketAddr::new(beacon_group(self.cfg.local_ip), port);
        for peer in &self.mcast.peers {
            self.mcast
                .fanout
                .push_back((SocketAddr::new(*peer, port), b.to_vec()));
        }
        self.stats.tx_beacons += 1;
        if self.cfg.multicast {
            out.extend_from_slice(&b);
            Some(group)
        } else {
            let (to, d) = self.mcast.fanout.pop_front()?;
            out.extend_from_slice(&d);
            Some(to)
        }
    }

    /// Builds the next packet of `qp` into `out`, a response it owes before a request;
    /// returns its destination.
    fn next_packet(&mut self, qp: &mut Qp, now: Instant, out: &mut Vec<u8>) -> Option<SocketAddr> {
        if let Some(r) = qp.resp.responses.pop_front() {
            return self.emit_response(qp, r, out);
        }
        if !qp.may_send() {
            return None;
        }
        match qp.qp_type {
            QpType::Rc => self.emit_rc_request(qp, now, out),
            QpType::Ud | QpType::Gsi => self.emit_ud(qp, out),
        }
    }
}
