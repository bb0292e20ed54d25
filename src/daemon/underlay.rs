//! The underlay as the daemon follows it while it runs: the address `--bind` names, the link
//! that carries it, that link's state and MTU.
//!
//! A route netlink socket (`sys::netlink::LinkWatch`) wakes the event loop when a link or an address
//! changes; the daemon then reads the underlay again ([`UnderlayState::read`]: the interface
//! ioctls and `getifaddrs`, never the netlink messages themselves), at most once per
//! [`REREAD_INTERVAL`], and hands the loop what changed, one [`UnderlayChange`] each, to log
//! and act on (a new MTU becomes the path MTU). A send refused as larger than the link
//! ([`UnderlayWatch::suspect`]) asks for a read too. Without the socket (none could be
//! opened), the underlay is read every [`REREAD_WITHOUT_NETLINK`].

use std::io;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};
use serde::{Deserialize, Serialize};

use crate::sys::ifaddr;
use crate::sys::netlink::LinkWatch;

/// The shortest time between two reads of the underlay, however many notifications arrive.
pub const REREAD_INTERVAL: Duration = Duration::from_millis(100);
/// How often the underlay is read when no netlink socket wakes the loop.
pub const REREAD_WITHOUT_NETLINK: Duration = Duration::from_secs(2);
/// Netlink messages read (and discarded) per turn; more wait for the next.
const NOTIFICATIONS_PER_TURN: usize = 64;

/// A link's state as the interface ioctls read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkState {
    /// Administratively up (`IFF_UP`).
    pub up: bool,
    /// Up with a carrier (`IFF_RUNNING`).
    pub carrier: bool,
    /// The MTU in bytes.
    pub mtu: u32,
}

/// What the underlay is: the link that carries (or last carried) `--bind`, whether the address
/// is there, and the link's state (`None`: no such link any more).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnderlayState {
    /// The link's name.
    pub link: String,
    /// `--bind` is configured on it.
    pub address: bool,
    /// The link's state; `None` when it is gone.
    pub state: Option<LinkState>,
}

/// The underlay in one word, for the log and the status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UnderlayCondition {
    /// The link is up with a carrier and has the address: traffic flows.
    Up,
    /// The address is gone from every link: nothing is sent or received.
    NoAddress,
    /// The link is up but has no carrier.
    NoCarrier,
    /// The link is administratively down.
    Down,
    /// The link is gone.
    Gone,
}

impl UnderlayCondition {
    /// `up`, `no-address`, `no-carrier`, `down` or `gone`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Up => "up",
            Self::NoAddress => "no-address",
            Self::NoCarrier => "no-carrier",
            Self::Down => "down",
            Self::Gone => "gone",
        }
    }
}

/// One change of the underlay, as the log says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnderlayChange {
    /// `--bind` is on no link any more.
    AddressGone,
    /// `--bind` is back (on `link`).
    AddressBack,
    /// `--bind` is now on another link than before.
    LinkMoved {
        /// The link that had it.
        from: String,
    },
    /// The link is gone.
    LinkGone,
    /// The link is there again.
    LinkBack,
    /// The link went administratively down.
    LinkDown,
    /// The link came administratively up.
    LinkUp,
    /// The link lost its carrier.
    CarrierLost,
    /// The link has a carrier again.
    CarrierBack,
    /// The link's MTU changed.
    Mtu {
        /// Before, in bytes.
        from: u32,
        /// Now, in bytes.
        to: u32,
    },
}

impl UnderlayChange {
    /// One line for this change of the underlay of `bind`, now as `s`: a warning for what
    /// stops traffic, info for the rest.
    pub fn log(&self, bind: IpAddr, s: &UnderlayState) {
        let link = &s.link;
        match self {
            Self::AddressGone => tracing::warn!(
                "underlay: --bind {bind} is gone from {link}: nothing is sent or received until it \
                 is back"
            ),
            Self::AddressBack => {
                tracing::info!("underlay: --bind {bind} is back on {link}")
            }
            Self::LinkMoved { from } => {
                tracing::info!("underlay: --bind {bind} moved from {from} to {link}");
            }
            Self::LinkGone => tracing::warn!("underlay: link {link} is gone"),
            Self::LinkBack => tracing::info!("underlay: link {link} is back"),
            Self::LinkDown => tracing::warn!("underlay: link {link} is down"),
            Self::LinkUp => tracing::info!("underlay: link {link} is up"),
            Self::CarrierLost => tracing::warn!("underlay: link {link} has no carrier"),
            Self::CarrierBack => {
                tracing::info!("underlay: link {link} has a carrier again");
            }
            Self::Mtu { from, to } => {
                tracing::info!("underlay: link {link} mtu {from} -> {to}");
            }
        }
    }
}

impl UnderlayState {
    /// Reads the underlay now: the link that has `bind` (else the link `last_link` that had
    /// it), and that link's state.
    #[must_use]
    pub fn read(bind: IpAddr, last_link: &str) -> Self {
        let (link, address) = match ifaddr::interface_of(bind) {
            Some(name) => (name, true),
            None => (last_link.to_owned(), false),
        };
        let state = ifaddr::link_info(&link).ok().map(|l| LinkState {
            up: l.up,
            carrier: l.running,
            mtu: l.mtu,
        });
        Self {
            link,
            address,
            state,
        }
    }

    /// The underlay in one word; a missing link or a link down says more than the address.
    #[must_use]
    pub fn condition(&self) -> UnderlayCondition {
        match self.state {
            None => UnderlayCondition::Gone,
            Some(s) if !s.up => UnderlayCondition::Down,
            Some(s) if !s.carrier => UnderlayCondition::NoCarrier,
            Some(_) if !self.address => UnderlayCondition::NoAddress,
            Some(_) => UnderlayCondition::Up,
        }
    }

    /// The link's MTU, while the link is there.
    #[must_use]
    pub fn mtu(&self) -> Option<u32> {
        self.state.map(|s| s.mtu)
    }

    /// What changed from `before` to `self`, in the order the log should say it.
    #[must_use]
    pub fn changes_since(&self, before: &Self) -> Vec<UnderlayChange> {
        let mut out = Vec::new();
        if self.link != before.link {
            out.push(UnderlayChange::LinkMoved {
                from: before.link.clone(),
            });
        }
        match (before.address, self.address) {
            (true, false) => out.push(UnderlayChange::AddressGone),
            (false, true) => out.push(UnderlayChange::AddressBack),
            _ => {}
        }
        match (before.state, self.state) {
            (Some(_), None) => out.push(UnderlayChange::LinkGone),
            (None, Some(_)) => out.push(UnderlayChange::LinkBack),
            _ => {}
        }
        if let (Some(b), Some(a)) = (before.state, self.state) {
            match (b.up, a.up) {
                (true, false) => out.push(UnderlayChange::LinkDown),
                (false, true) => out.push(UnderlayChange::LinkUp),
                _ => {}
            }
            // A link down has no carrier either: only the carrier of a link that stays up
            // is news.
            if a.up && b.up {
                match (b.carrier, a.carrier) {
                    (true, false) => out.push(UnderlayChange::CarrierLost),
                    (false, true) => out.push(UnderlayChange::CarrierBack),
                    _ => {}
                }
            }
        }
        // The MTU against the last one known, across a link that went and came back.
        if let (Some(from), Some(to)) = (before.mtu(), self.mtu()) {
            if from != to {
                out.push(UnderlayChange::Mtu { from, to });
            }
        }
        out
    }
}

/// Follows the underlay: the netlink wake-ups, when to read it again, and what it was at the
/// last read.
#[derive(Debug)]
pub struct UnderlayWatch {
    bind: IpAddr,
    state: UnderlayState,
    /// The last MTU the link had (kept while the link is gone, to compare when it is back).
    last_mtu: Option<u32>,
    watch: Option<LinkWatch>,
    token: Option<Token>,
    /// A read is asked for, not before this instant.
    due: Option<Instant>,
    /// Notifications are still waiting (the last drain hit its bound).
    more: bool,
    last_read: Instant,
}

impl UnderlayWatch {
    /// Follows the underlay of `bind` from now on: its state now, and a netlink socket to
    /// wake the loop when it changes (without one it is read every
    /// [`REREAD_WITHOUT_NETLINK`], said in one line).
    pub fn open(bind: IpAddr, now: Instant) -> Self {
        let state = UnderlayState::read(bind, "");
        let watch = match LinkWatch::open() {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "no netlink socket for link and address changes: the underlay is read every {}s",
                    REREAD_WITHOUT_NETLINK.as_secs()
                );
                None
            }
        };
        Self::new(bind, state, watch, now)
    }

    /// Starts following the underlay of `bind`, as it is now (`state`, read at start). Without
    /// a netlink socket (`watch` `None`) it is read every [`REREAD_WITHOUT_NETLINK`].
    #[must_use]
    pub fn new(bind: IpAddr, state: UnderlayState, watch: Option<LinkWatch>, now: Instant) -> Self {
        Self {
            bind,
            last_mtu: state.mtu(),
            state,
            watch,
            token: None,
            due: None,
            more: false,
            last_read: now,
        }
    }

    /// Registers the netlink socket (if any) on `token`.
    ///
    /// # Errors
    /// The registry's.
    pub fn register(&mut self, registry: &Registry, token: Token) -> io::Result<()> {
        if let Some(w) = &self.watch {
            registry.register(&mut SourceFd(&w.as_raw_fd()), token, Interest::READABLE)?;
            self.token = Some(token);
        }
        Ok(())
    }

    /// The underlay at the last read.
    #[must_use]
    pub fn state(&self) -> &UnderlayState {
        &self.state
    }

    /// Whether `token` is the netlink socket's; if so, a read is asked for.
    pub fn note_readiness(&mut self, token: Token, now: Instant) -> bool {
        if self.token != Some(token) {
            return false;
        }
        self.more = true;
        self.ask(now);
        true
    }

    /// Something suggests the link changed (a send refused as too big): read it soon.
    pub fn suspect(&mut self, now: Instant) {
        self.ask(now);
    }

    fn ask(&mut self, now: Instant) {
        let at = now.max(self.last_read + REREAD_INTERVAL);
        self.due = Some(self.due.map_or(at, |t| t.min(at)));
    }

    /// When the next read is due.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        match (&self.watch, self.due) {
            (_, Some(t)) => Some(t),
            (None, None) => Some(self.last_read + REREAD_WITHOUT_NETLINK),
            (Some(_), None) => None,
        }
    }

    /// Reads the notifications waiting and, when a read is due, the underlay: `None` when it
    /// was not read this turn, else what changed since the last read (perhaps nothing: the
    /// caller may check what else a notification may concern, such as its own interface).
    pub fn turn(&mut self, now: Instant) -> Option<Vec<UnderlayChange>> {
        if self.more {
            self.more = false;
            if let Some(w) = &self.watch {
                match w.drain(NOTIFICATIONS_PER_TURN) {
                    Ok((n, _)) if n == NOTIFICATIONS_PER_TURN => self.more = true,
                    Ok(_) => {}
                    Err(e) => tracing::debug!(error = %e, "reading the netlink socket failed"),
                }
            }
        }
        if self.watch.is_none() && self.due.is_none() {
            self.due = Some(self.last_read + REREAD_WITHOUT_NETLINK);
        }
        if self.due.is_none_or(|t| now < t) {
            return None;
        }
        self.due = None;
        self.last_read = now;
        let now_state = UnderlayState::read(self.bind, &self.state.link);
        let before = std::mem::replace(&mut self.state, now_state);
        let mut changes = self.state.changes_since(&before);
        // A link that went and is back at another MTU than it had: that is a change too.
        if let (None, Some(from), Some(to)) = (before.state, self.last_mtu, self.state.mtu()) {
            if from != to {
                changes.push(UnderlayChange::Mtu { from, to });
            }
        }
        if let Some(m) = self.state.mtu() {
            self.last_mtu = Some(m);
        }
        Some(changes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(address: bool, up: bool, carrier: bool, mtu: u32) -> UnderlayState {
        UnderlayState {
            link: "eth0".into(),
            address,
            state: Some(LinkState { up, carrier, mtu }),
        }
    }

    #[test]
    fn the_condition_names_the_worst_of_link_carrier_and_address() {
        assert_eq!(
            state(true, true, true, 1500).condition(),
            UnderlayCondition::Up
        );
        assert_eq!(
            state(false, true, true, 1500).condition(),
            UnderlayCondition::NoAddress
        );
        assert_eq!(
            state(true, true, false, 1500).condition(),
            UnderlayCondition::NoCarrier
        );
        assert_eq!(
            state(false, false, false, 1500).condition(),
            UnderlayCondition::Down
        );
        let gone = UnderlayState {
            state: None,
            ..state(false, false, false, 0)
        };
        assert_eq!(gone.condition(), UnderlayCondition::Gone);
        assert_eq!(gone.condition().as_str(), "gone");
    }

    #[test]
    fn each_change_is_one_item() {
        let up = state(true, true, true, 9000);
        assert!(up.changes_since(&up).is_empty());
        assert_eq!(
            state(true, true, true, 1500).changes_since(&up),
            [UnderlayChange::Mtu {
                from: 9000,
                to: 1500
            }]
        );
        assert_eq!(
            state(false, true, true, 9000).changes_since(&up),
            [UnderlayChange::AddressGone]
        );
        assert_eq!(
            up.changes_since(&state(false, true, true, 9000)),
            [UnderlayChange::AddressBack]
        );
        // Down: the carrier goes with it and is not news of its own.
        assert_eq!(
            state(true, false, false, 9000).changes_since(&up),
            [UnderlayChange::LinkDown]
        );
        assert_eq!(
            state(true, true, false, 9000).changes_since(&up),
            [UnderlayChange::CarrierLost]
        );
        assert_eq!(
            up.changes_since(&state(true, true, false, 9000)),
            [UnderlayChange::CarrierBack]
        );
        let moved = UnderlayState {
            link: "eth1".into(),
            ..state(true, true, true, 1500)
        };
        assert_eq!(
            moved.changes_since(&up),
            [
                UnderlayChange::LinkMoved {
                    from: "eth0".into()
                },
                UnderlayChange::Mtu {
                    from: 9000,
                    to: 1500
                }
            ]
        );
    }

    /// The watch reads the loopback underlay at most once per interval, however often it is
    /// woken, and reports nothing when nothing changed.
    #[test]
    fn reads_are_spaced_and_report_changes_only() {
        let lo = IpAddr::from([127, 0, 0, 1]);
        let t0 = Instant::now();
        let st = UnderlayState::read(lo, "lo");
        assert!(st.address && st.mtu().is_some(), "{st:?}");
        let mut w = UnderlayWatch::new(lo, st, None, t0);
        assert_eq!(w.poll_timeout(), Some(t0 + REREAD_WITHOUT_NETLINK));
        assert_eq!(w.turn(t0), None);
        w.suspect(t0);
        assert_eq!(w.poll_timeout(), Some(t0 + REREAD_INTERVAL));
        assert_eq!(w.turn(t0 + REREAD_INTERVAL / 2), None);
        assert_eq!(w.turn(t0 + REREAD_INTERVAL), Some(Vec::new()));
        w.suspect(t0 + REREAD_INTERVAL);
        assert_eq!(w.poll_timeout(), Some(t0 + 2 * REREAD_INTERVAL));
        // A link that is gone is reported once, and its MTU is not a change.
        w.state.link = "no-such-if0".into();
        w.state.address = false;
        w.bind = IpAddr::from([192, 0, 2, 77]);
        let changes = w.turn(t0 + 2 * REREAD_INTERVAL).unwrap();
        assert_eq!(changes, [UnderlayChange::LinkGone]);
        assert_eq!(w.state().condition(), UnderlayCondition::Gone);
    }
}
