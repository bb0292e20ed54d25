//! What the UD QP lets through, and what it answers.
//!
//! # IP over UD: the source must be its sender's
//!
//! Anyone on the underlay can send a datagram to the UD QP (its QPN is in every ARP/ND
//! message, the broadcast group reaches it). An IP packet that arrives there goes to the TUN
//! device only if its source address is consistent with the sender the provider names (the
//! GRH's source GID, or the path of the SLID; the completion's `src_qp`), as Linux's strict
//! `rp_filter` or WireGuard's allowed IPs relate a packet's source to where it came from:
//!
//! - **bound source**: the source address has a resolved neighbour entry (learned or
//!   static): delivered if that entry is the sender's (its GID, and its UD QPN where the
//!   provider reports the sender's QPN), dropped otherwise (`rx_ud_spoofed_drops`);
//! - **unbound source** (no entry, or one still being resolved): dropped
//!   (`rx_ud_unbound_drops`). A node is bound by ARP/ND (it resolved us, or we it), by a
//!   static entry, or by nothing else: the endpoint never resolves a packet's source on its
//!   behalf, and the host never sees the packet, so the host asks for no entry because of it;
//! - **unspecified source** (`0.0.0.0`, `::`): delivered only to a multicast destination and
//!   only from a sender the node knows ([`Endpoint::knows`]: a resolved or static entry's
//!   endpoint, or a `--peer`), else dropped (`rx_ud_unknown_sender_drops`);
//! - **loose** ([`SourceCheck::Loose`], for routers: packets from other subnets arrive from
//!   the router, not from their source): a source outside the interface's prefixes (and not
//!   link-local) is delivered from a sender the node knows (`rx_ud_unknown_sender_drops`
//!   otherwise); a source inside them is checked as in strict. So the host answers such a
//!   packet through its routes, never by resolving an on-link address for it.
//!
//! Multicast and broadcast destinations take the same rule, so "from a sender the node
//! knows" holds for them too (a bound source is a known sender). ARP and ND are not IP to
//! deliver: they go to resolution (`resolve.rs`).
//!
//! # Answers go to their asker, within a budget
//!
//! An ARP reply or a Neighbor Advertisement goes to the hardware address of the request's
//! sender, which must be the address it came from (ARP's sender hardware address, ND's source
//! link-layer option: `neigh_unvouched_drops` otherwise); a solicitation without that option
//! (duplicate address detection's, from `::`) is answered to the sender the provider names,
//! one unicast datagram (RFC 6085 allows a link-layer unicast of a multicast IPv6 packet),
//! never through a multicast group that the underlay may fan out to every `--peer`. Each
//! sender GID has an [`AnswerBudget`] of [`ANSWER_BURST`] answers, refilled at
//! [`ANSWER_RATE`] per second (`neigh_answer_budget_drops` beyond). So no datagram that
//! arrives makes the endpoint send a datagram to any address but the one that sent it: at
//! most one datagram out per datagram in, none of them towards a third party.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::str::FromStr;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::ud::UdSource;
use super::Endpoint;
use crate::choice::ParseChoiceError;
use crate::verbs::{Gid, QpNum};
use crate::wire::ipoib::{classify, HwAddr};

/// How the source of an IP packet that arrives over UD is checked (setting
/// `ud_source_check`); see the `ipoib::guard` module in the source.
///
/// Its name (`strict`, `loose`) is the same in flags and the config file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceCheck {
    /// The source must be bound to the sender.
    #[default]
    Strict,
    /// As strict for on-link sources; an off-link source from any sender the node knows.
    Loose,
}

impl SourceCheck {
    /// `strict` or `loose`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Strict => "strict",
            Self::Loose => "loose",
        }
    }
}

impl fmt::Display for SourceCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SourceCheck {
    type Err = ParseChoiceError;
    fn from_str(s: &str) -> Result<Self, ParseChoiceError> {
        match s {
            "strict" => Ok(Self::Strict),
            "loose" => Ok(Self::Loose),
            _ => Err(ParseChoiceError::new("\"strict\" or \"loose\"", s)),
        }
    }
}

/// Answers a sender may draw at once.
pub const ANSWER_BURST: u32 = 16;

/// Answers per second a sender's budget regains.
pub const ANSWER_RATE: u32 = 8;

/// Buckets of the [`AnswerBudget`]: senders share one when their GIDs hash alike.
const ANSWER_BUCKETS: usize = 256;

/// One sender's (or a few senders') answers left and when they were last counted.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: u32,
    /// The instant the last whole token was added (or the bucket first used).
    at: Option<Instant>,
}

/// Per-sender budgets of ARP/ND answers: [`ANSWER_BUCKETS`] token buckets, a sender's chosen
/// by a keyed hash of its GID (the key from the endpoint's seed, so that no sender picks
/// another's bucket): a fixed size whatever arrives, O(1) per answer.
#[derive(Debug)]
pub(super) struct AnswerBudget {
    key: u64,
    buckets: Box<[Bucket]>,
}

impl AnswerBudget {
    pub(super) fn new(key: u64) -> Self {
        Self {
            key,
            buckets: vec![
                Bucket {
                    tokens: ANSWER_BURST,
                    at: None,
                };
                ANSWER_BUCKETS
            ]
            .into_boxed_slice(),
        }
    }

    /// Takes one answer from `gid`'s budget at `now`; false when it is spent.
    pub(super) fn take(&mut self, gid: Gid, now: Instant) -> bool {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.key.hash(&mut h);
        gid.hash(&mut h);
        let i = (h.finish() % ANSWER_BUCKETS as u64) as usize;
        let Some(b) = self.buckets.get_mut(i) else {
            return false;
        };
        let per_token = Duration::from_secs(1) / ANSWER_RATE;
        match b.at {
            None => b.at = Some(now),
            Some(at) => {
                let gained = now.saturating_duration_since(at).as_nanos() / per_token.as_nanos();
                if gained > 0 {
                    let gained = u32::try_from(gained).unwrap_or(u32::MAX);
                    b.tokens = b.tokens.saturating_add(gained).min(ANSWER_BURST);
                    b.at = Some(at + per_token * gained.min(ANSWER_BURST));
                    if b.tokens == ANSWER_BURST {
                        b.at = Some(now);
                    }
                }
            }
        }
        if b.tokens == 0 {
            return false;
        }
        b.tokens -= 1;
        true
    }
}

/// Why an IP packet over UD was not delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SourceDrop {
    /// Its source is bound to another sender.
    Spoofed,
    /// Its source is bound to no one.
    Unbound,
    /// Its sender is not known (loose mode's off-link sources, the unspecified source).
    UnknownSender,
}

impl Endpoint {
    /// Whether the IP packet `packet` that arrived over UD from `src` may go to the TUN
    /// device, by its source address; counts a drop. See the [module documentation](self).
    pub(super) fn ud_source_ok(&mut self, src: UdSource, packet: &[u8]) -> bool {
        let Ok(info) = classify(packet) else {
            // Not IP: `deliver` counts it.
            return true;
        };
        let verdict = self.check_source(src, info.src, info.is_multicast_or_broadcast());
        match verdict {
            Ok(()) => return true,
            Err(SourceDrop::Spoofed) => self.counters.rx_ud_spoofed_drops += 1,
            Err(SourceDrop::Unbound) => self.counters.rx_ud_unbound_drops += 1,
            Err(SourceDrop::UnknownSender) => self.counters.rx_ud_unknown_sender_drops += 1,
        }
        false
    }

    fn check_source(&self, src: UdSource, ip: IpAddr, multicast: bool) -> Result<(), SourceDrop> {
        if ip.is_unspecified() {
            return if multicast && self.knows(src) {
                Ok(())
            } else {
                Err(SourceDrop::UnknownSender)
            };
        }
        if let Some(hw) = self.neigh.get(&ip).and_then(|n| n.resolved()) {
            return if src.is(hw) {
                Ok(())
            } else {
                Err(SourceDrop::Spoofed)
            };
        }
        let off_link = !self.on_link(ip);
        match self.cfg.ud_source_check {
            SourceCheck::Loose if off_link && self.knows(src) => Ok(()),
            SourceCheck::Loose if off_link => Err(SourceDrop::UnknownSender),
            _ => Err(SourceDrop::Unbound),
        }
    }

    /// Whether the node knows the sender `src`: a resolved or static entry maps to its GID
    /// (and UD QPN, where the provider reports it), or its GID is a `--peer`'s.
    pub(super) fn knows(&self, src: UdSource) -> bool {
        let Some(gid) = src.gid else {
            return false;
        };
        if self.peers.contains_key(&gid) {
            return true;
        }
        let qpn = src.sender_qp.unwrap_or(QpNum::new(0));
        let probe = HwAddr::new(0, qpn, gid);
        match src.sender_qp {
            Some(_) => self.neigh.endpoint_used(&probe),
            None => self.neigh.learned_ip_at(&gid).is_some(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_gives_its_burst_then_its_rate() {
        let t = Instant::now();
        let mut b = AnswerBudget::new(7);
        let g = Gid::from(std::net::Ipv4Addr::new(198, 18, 0, 99));
        let first = (0..100).filter(|_| b.take(g, t)).count();
        assert_eq!(first, ANSWER_BURST as usize);
        // One second later: the rate's worth.
        let later = (0..100)
            .filter(|_| b.take(g, t + Duration::from_secs(1)))
            .count();
        assert_eq!(later, ANSWER_RATE as usize);
        // Ten seconds idle refill the burst, no more.
        let again = (0..100)
            .filter(|_| b.take(g, t + Duration::from_secs(11)))
            .count();
        assert_eq!(again, ANSWER_BURST as usize);
    }

    #[test]
    fn source_check_names_round_trip() {
        for c in [SourceCheck::Strict, SourceCheck::Loose] {
            assert_eq!(c.as_str().parse::<SourceCheck>(), Ok(c));
        }
        assert!("lax".parse::<SourceCheck>().is_err());
    }
}
