//! The neighbour table: IP address → IPoIB hardware address, as Linux's ARP/ND caches plus
//! IPoIB's per-neighbour queue.
//!
//! A packet for an unknown address creates an `Incomplete` entry, queues the packet (up to
//! `tx_queue_len`, the rest are dropped), and makes the caller send an ARP request or a
//! Neighbor Solicitation; retries follow a timer. A reply makes the entry `Reachable` and
//! hands the queued packets back in order. Entries not used for `neigh_timeout` are removed
//! (and with them the TX connection), as Linux ties TX connection lifetime to neighbour
//! ageing. Static entries never age.
//!
//! A learned mapping is never silently replaced by a different hardware address: a conflicting
//! ARP/ND message for a `Reachable` entry is counted and ignored, so a forged reply cannot
//! redirect traffic that already flows. The entry is re-learned only after it ages out or its
//! connection fails. The one exception is a restart of the same node (same GID, new UD QPN),
//! and only from the UDP source port the mapping was learned from, where the provider reports
//! ports: a message from the peer's address but another port is not from the peer's UD QP.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::timer::TimerId;
use crate::wire::ipoib::HwAddr;
use crate::wire::PeerMap;

/// Resolution state of a neighbour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NeighState {
    /// Waiting for an ARP reply / Neighbor Advertisement.
    Incomplete {
        /// Requests still to send before giving up.
        retries_left: u8,
    },
    /// Address known.
    Reachable,
    /// Configured statically; never ages, never replaced.
    Static,
}

impl NeighState {
    /// Lowercase name for status output.
    pub fn name(self) -> &'static str {
        match self {
            Self::Incomplete { .. } => "incomplete",
            Self::Reachable => "reachable",
            Self::Static => "permanent",
        }
    }
}

/// One neighbour.
#[derive(Debug)]
pub(super) struct Neigh {
    /// Its hardware address, once known.
    pub(super) hw: Option<HwAddr>,
    /// Resolution state.
    pub(super) state: NeighState,
    /// Packets waiting for resolution.
    pub(super) queue: VecDeque<Vec<u8>>,
    /// Last time a packet was sent to it.
    pub(super) last_used: Instant,
    /// Resolution retry or ageing timer.
    pub(super) timer: Option<TimerId>,
    /// The UDP source port of the message the mapping was learned from (where the provider
    /// reports it): a restart may replace the mapping only from this port.
    pub(super) src_port: Option<u16>,
}

impl Neigh {
    /// Its hardware address when it is resolved (not still being resolved).
    pub(super) fn resolved(&self) -> Option<HwAddr> {
        match self.state {
            NeighState::Incomplete { .. } => None,
            _ => self.hw,
        }
    }
}

/// What learning a mapping did.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Learned {
    /// New or unchanged mapping; these queued packets can now go out.
    Resolved(Vec<Vec<u8>>),
    /// The same node (GID) came back with a new UD QPN (it restarted): the mapping was
    /// updated; connections to the old address must go.
    Replaced {
        /// The previous hardware address.
        old: HwAddr,
    },
    /// The mapping conflicts with an established one and was ignored.
    Conflict,
    /// A restart of the same node, but not from the UDP source port the mapping was learned
    /// from: ignored.
    ForeignPort,
    /// Nothing to learn (not a neighbour we asked about, and not addressed to us).
    Ignored,
}

/// What a neighbour's resolution timer asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Retry {
    /// Send the request again (one retry fewer left).
    Resend,
    /// No answer after the last retry: give the neighbour up.
    GiveUp,
    /// A timer that is no longer the entry's, or an entry no longer resolving.
    Nothing,
}

/// What a neighbour's ageing timer did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ageing {
    /// Used since: check again at this time (arm the timer and [`Neighbours::set_timer`]).
    Recheck(Instant),
    /// Removed; no other neighbour uses this hardware address, so neither does any packet.
    Unused(HwAddr),
    /// Removed (its hardware address, if any, is still some other neighbour's), or nothing
    /// to do.
    Nothing,
}

/// The neighbour table.
#[derive(Debug, Default)]
pub(super) struct Neighbours {
    map: PeerMap<IpAddr, Neigh>,
}

impl Neighbours {
    /// The entry for `ip`.
    pub(super) fn get(&self, ip: &IpAddr) -> Option<&Neigh> {
        self.map.get(ip)
    }

    /// The entry for `ip`, writable.
    pub(super) fn get_mut(&mut self, ip: &IpAddr) -> Option<&mut Neigh> {
        self.map.get_mut(ip)
    }

    /// Adds a static entry.
    pub(super) fn add_static(&mut self, ip: IpAddr, hw: HwAddr, now: Instant) {
        self.map.insert(
            ip,
            Neigh {
                hw: Some(hw),
                state: NeighState::Static,
                queue: VecDeque::new(),
                last_used: now,
                timer: None,
                src_port: None,
            },
        );
    }

    /// Starts resolving `ip`; returns false if an entry exists already.
    pub(super) fn start(&mut self, ip: IpAddr, now: Instant, retries: u8) -> bool {
        if self.map.contains_key(&ip) {
            return false;
        }
        self.map.insert(
            ip,
            Neigh {
                hw: None,
                state: NeighState::Incomplete {
                    retries_left: retries,
                },
                queue: VecDeque::new(),
                last_used: now,
                timer: None,
                src_port: None,
            },
        );
        true
    }

    /// Learns `ip` → `hw` from a message that came from UDP source port `src_port` (`None`
    /// where the provider does not say). `solicited_or_for_us` says the message answered our
    /// request or was addressed to us (only then is a new entry created).
    pub(super) fn learn(
        &mut self,
        ip: IpAddr,
        hw: HwAddr,
        src_port: Option<u16>,
        now: Instant,
        solicited_or_for_us: bool,
    ) -> Learned {
        match self.map.get_mut(&ip) {
            Some(n) => match n.state {
                NeighState::Incomplete { .. } => {
                    n.hw = Some(hw);
                    n.state = NeighState::Reachable;
                    n.last_used = now;
                    n.src_port = src_port;
                    Learned::Resolved(n.queue.drain(..).collect())
                }
                NeighState::Reachable | NeighState::Static => {
                    match n.hw {
                        Some(h) if same_endpoint(&h, &hw) => {
                            if n.state == NeighState::Reachable {
                                // The peer may have switched CM support on or off.
                                n.hw = Some(hw);
                                n.src_port = n.src_port.or(src_port);
                            }
                            Learned::Resolved(Vec::new())
                        }
                        // Same node, new UD QPN, but not from the peer's port.
                        Some(h)
                            if h.gid == hw.gid
                                && n.state == NeighState::Reachable
                                && matches!((n.src_port, src_port), (Some(a), Some(b)) if a != b) =>
                        {
                            Learned::ForeignPort
                        }
                        // Same node, new UD QPN: the peer restarted.
                        Some(h) if h.gid == hw.gid && n.state == NeighState::Reachable => {
                            n.hw = Some(hw);
                            n.last_used = now;
                            n.src_port = src_port;
                            Learned::Replaced { old: h }
                        }
                        _ => Learned::Conflict,
                    }
                }
            },
            None if solicited_or_for_us => {
                self.map.insert(
                    ip,
                    Neigh {
                        hw: Some(hw),
                        state: NeighState::Reachable,
                        queue: VecDeque::new(),
                        last_used: now,
                        timer: None,
                        src_port,
                    },
                );
                Learned::Resolved(Vec::new())
            }
            None => Learned::Ignored,
        }
    }

    /// Records `t` as `ip`'s resolution or ageing timer.
    pub(super) fn set_timer(&mut self, ip: &IpAddr, t: TimerId) {
        if let Some(n) = self.map.get_mut(ip) {
            n.timer = Some(t);
        }
    }

    /// `ip`'s resolution timer `id` fired: one retry fewer, or none left.
    pub(super) fn resolve_timer_fired(&mut self, ip: &IpAddr, id: TimerId) -> Retry {
        let Some(n) = self.map.get_mut(ip).filter(|n| n.timer == Some(id)) else {
            return Retry::Nothing;
        };
        n.timer = None;
        match n.state {
            NeighState::Incomplete { retries_left } if retries_left > 1 => {
                n.state = NeighState::Incomplete {
                    retries_left: retries_left - 1,
                };
                Retry::Resend
            }
            NeighState::Incomplete { .. } => Retry::GiveUp,
            _ => Retry::Nothing,
        }
    }

    /// `ip`'s ageing timer `id` fired: an entry unused for `timeout` is removed.
    pub(super) fn age_timer_fired(
        &mut self,
        ip: &IpAddr,
        id: TimerId,
        now: Instant,
        timeout: Duration,
    ) -> Ageing {
        let Some(n) = self
            .map
            .get_mut(ip)
            .filter(|n| n.timer == Some(id) && n.state == NeighState::Reachable)
        else {
            return Ageing::Nothing;
        };
        n.timer = None;
        let idle_until = n.last_used + timeout;
        if idle_until > now {
            return Ageing::Recheck(idle_until);
        }
        let Some(hw) = self.map.remove(ip).and_then(|n| n.hw) else {
            return Ageing::Nothing;
        };
        let still_used = self
            .map
            .values()
            .any(|m| m.hw.is_some_and(|h| same_endpoint(&h, &hw)));
        if still_used {
            Ageing::Nothing
        } else {
            Ageing::Unused(hw)
        }
    }

    /// Removes an entry; returns it.
    pub(super) fn remove(&mut self, ip: &IpAddr) -> Option<Neigh> {
        self.map.remove(ip)
    }

    /// Forgets every learned (non-static) entry whose hardware address is `hw`'s endpoint;
    /// returns their addresses.
    pub(super) fn forget_hw(&mut self, hw: &HwAddr) -> Vec<IpAddr> {
        let ips: Vec<IpAddr> = self
            .map
            .iter()
            .filter(|(_, n)| {
                n.state == NeighState::Reachable && n.hw.is_some_and(|h| same_endpoint(&h, hw))
            })
            .map(|(ip, _)| *ip)
            .collect();
        for ip in &ips {
            self.map.remove(ip);
        }
        ips
    }

    /// All entries.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&IpAddr, &Neigh)> {
        self.map.iter()
    }
}

/// Two hardware addresses name the same endpoint (GID and QPN; the flags may differ).
pub(super) fn same_endpoint(a: &HwAddr, b: &HwAddr) -> bool {
    a.gid == b.gid && a.qpn == b.qpn
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::{Gid, QpNum};

    fn hw(q: u32) -> HwAddr {
        HwAddr::new(
            0x80,
            QpNum::new(q),
            Gid::from(std::net::Ipv4Addr::new(198, 18, 0, 2)),
        )
    }

    #[test]
    fn resolve_then_conflict_is_ignored() {
        let t = Instant::now();
        let ip: IpAddr = "198.19.0.2".parse().unwrap();
        let mut n = Neighbours::default();
        assert!(n.start(ip, t, 3));
        n.get_mut(&ip).unwrap().queue.push_back(vec![1]);
        assert_eq!(
            n.learn(ip, hw(5), None, t, true),
            Learned::Resolved(vec![vec![1]])
        );
        assert_eq!(
            n.learn(ip, hw(6), None, t, true),
            Learned::Replaced { old: hw(5) }
        );
        assert_eq!(n.get(&ip).unwrap().hw, Some(hw(6)));
        let other_node = HwAddr::new(
            0x80,
            QpNum::new(6),
            Gid::from(std::net::Ipv4Addr::new(198, 18, 0, 9)),
        );
        assert_eq!(n.learn(ip, other_node, None, t, true), Learned::Conflict);
        assert_eq!(n.get(&ip).unwrap().hw, Some(hw(6)));
        assert_eq!(n.forget_hw(&hw(6)), vec![ip]);
        assert!(n.get(&ip).is_none());
    }

    /// A restart (same GID, new UD QPN) replaces the mapping only from the UDP source port
    /// it was learned from, where ports are known.
    #[test]
    fn a_restart_replaces_only_from_the_learned_port() {
        let t = Instant::now();
        let ip: IpAddr = "198.19.0.2".parse().unwrap();
        let mut n = Neighbours::default();
        assert!(n.start(ip, t, 3));
        assert_eq!(
            n.learn(ip, hw(5), Some(4791), t, true),
            Learned::Resolved(Vec::new())
        );
        assert_eq!(
            n.learn(ip, hw(6), Some(50_000), t, true),
            Learned::ForeignPort
        );
        assert_eq!(n.get(&ip).unwrap().hw, Some(hw(5)));
        assert_eq!(
            n.learn(ip, hw(6), Some(4791), t, true),
            Learned::Replaced { old: hw(5) }
        );
        // A provider that reports no port: the address alone decides, as before.
        assert_eq!(
            n.learn(ip, hw(7), None, t, true),
            Learned::Replaced { old: hw(6) }
        );
    }

    #[test]
    fn unsolicited_unknown_is_ignored_and_static_never_replaced() {
        let t = Instant::now();
        let ip: IpAddr = "198.19.0.3".parse().unwrap();
        let mut n = Neighbours::default();
        assert_eq!(n.learn(ip, hw(5), None, t, false), Learned::Ignored);
        n.add_static(ip, hw(7), t);
        assert_eq!(n.learn(ip, hw(5), None, t, true), Learned::Conflict);
        assert!(n.forget_hw(&hw(7)).is_empty(), "static entries stay");
    }

    #[test]
    fn resolution_retries_run_out_and_a_used_entry_is_rechecked() {
        let t = Instant::now();
        let ip: IpAddr = "198.19.0.4".parse().unwrap();
        let mut wheel = crate::timer::TimerWheel::new(t, Duration::from_millis(1));
        let mut timer = || wheel.insert(t, ());
        let mut n = Neighbours::default();
        assert!(n.start(ip, t, 2));
        let (first, second, stray) = (timer(), timer(), timer());
        n.set_timer(&ip, first);
        assert_eq!(n.resolve_timer_fired(&ip, stray), Retry::Nothing);
        assert_eq!(n.resolve_timer_fired(&ip, first), Retry::Resend);
        n.set_timer(&ip, second);
        assert_eq!(n.resolve_timer_fired(&ip, second), Retry::GiveUp);

        let timeout = Duration::from_secs(3);
        assert_eq!(
            n.learn(ip, hw(5), None, t, true),
            Learned::Resolved(Vec::new())
        );
        let age = timer();
        n.set_timer(&ip, age);
        n.get_mut(&ip).unwrap().last_used = t + Duration::from_secs(1);
        assert_eq!(
            n.age_timer_fired(&ip, age, t + timeout, timeout),
            Ageing::Recheck(t + Duration::from_secs(4))
        );
        let again = timer();
        n.set_timer(&ip, again);
        let other: IpAddr = "198.19.0.5".parse().unwrap();
        n.add_static(other, hw(5), t);
        assert_eq!(
            n.age_timer_fired(&ip, again, t + Duration::from_secs(4), timeout),
            Ageing::Nothing,
            "another neighbour still uses the address"
        );
        assert!(n.get(&ip).is_none());
    }
}
