//! The software provider's InfiniBand link layer ([`SoftLink::Infiniband`]): a port of a
//! subnet whose SM (opensm on ibsim) assigns its LID and P_Keys, its packets native IB
//! packets (`LRH [GRH] BTH … ICRC VCRC`, [`crate::wire::ib`]) carried in UDP datagrams of
//! the underlay, which stands in for the cable and the switches.
//!
//! - **The port's attributes** ([`IbPortAttr`]: state, LID, LMC, SM, P_Key table, GID, MTU)
//!   are what an HCA's firmware would tell its driver; the caller sets them from what the SM
//!   left in the port's SMA ([`crate::sa::PortWatch`]), never from a configuration.
//! - **Forwarding**: where a unicast DLID is on the underlay is learnt from beacons each port
//!   sends every [`BEACON_INTERVAL`], at once on a change of its own, and at once when it
//!   hears a port new to it (so a port that comes up learns every route within one round
//!   trip, not a period): its GUID, base LID, LMC and whether it is active, to the beacon
//!   group (and to every fan-out peer). A route lives
//!   [`ROUTE_TTL`] after its last beacon; a port that goes down says so and its route goes at
//!   once. At most [`MAX_ROUTES`] are held. A packet for a LID with no route is dropped and
//!   counted, as a switch without a forwarding entry drops it.
//! - **Multicast** to an MLID crosses the underlay as the IP multicast group
//!   [`mlid_group`] of that MLID, which a port joins while a QP is attached with it.
//! - **What a port takes**: only while active, only packets for one of its LIDs (base LID
//!   through `2^LMC` LIDs) or for an MLID a QP is attached with; a BTH P_Key its table does not
//!   hold is a P_Key violation, dropped and counted.
//!
//! Not modelled: credits and flow control, VLs and SL-to-VL maps, switch forwarding tables
//! and hop-by-hop routing (every port reaches every other directly over the underlay),
//! link speeds. Beacons are trusted: the underlay is the cable.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use crate::verbs::{Gid, Lid, PathMtu, Sl};

/// How the provider's port is linked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SoftLink {
    /// RoCEv2: the underlay's IP addresses are the GIDs (the default).
    #[default]
    RoceV2,
    /// Native InfiniBand: LIDs from the SM, packets with an LRH (this module).
    Infiniband,
}

impl SoftLink {
    /// How the link's datagrams begin on the underlay.
    #[must_use]
    pub const fn framing(self) -> crate::wire::Framing {
        match self {
            Self::RoceV2 => crate::wire::Framing::Bth,
            Self::Infiniband => crate::wire::Framing::Lrh,
        }
    }
}

/// Time between two beacons of an unchanged port.
pub const BEACON_INTERVAL: Duration = Duration::from_millis(500);

/// How long a route lives after its port's last beacon.
pub const ROUTE_TTL: Duration = Duration::from_secs(2);

/// Most routes held (ports beaconing on the underlay).
pub const MAX_ROUTES: usize = 4096;

/// Most P_Key table entries a port holds.
pub const MAX_PKEYS: usize = 128;

/// Size of a beacon.
pub const BEACON_LEN: usize = 20;

/// The first bytes of a beacon: `IBsl`, whose first byte as an LRH would carry LVer 9,
/// which no IB packet has (LVer is 0).
const BEACON_MAGIC: [u8; 4] = *b"IBsl";

/// The beacon format's version.
const BEACON_VERSION: u8 = 1;

/// What the port is, as its firmware would report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IbPortAttr {
    /// The port is `Active`: it sends and takes packets.
    pub active: bool,
    /// Base LID.
    pub lid: Lid,
    /// LID mask control: the port has `2^lmc` LIDs from `lid`.
    pub lmc: u8,
    /// The SM's LID.
    pub sm_lid: Lid,
    /// The SL to reach the SM.
    pub sm_sl: Sl,
    /// The port's GID (subnet prefix and port GUID).
    pub gid: Gid,
    /// The P_Key table's entries in use, in table order (at most [`MAX_PKEYS`]).
    pub pkeys: Vec<u16>,
    /// The active MTU.
    pub mtu: PathMtu,
}

impl IbPortAttr {
    /// A port that is not active yet: no LID, no SM, the default partition, MTU 2048.
    #[must_use]
    pub fn down(gid: Gid) -> Self {
        Self {
            active: false,
            lid: Lid::NONE,
            lmc: 0,
            sm_lid: Lid::NONE,
            sm_sl: Sl::ZERO,
            gid,
            pkeys: vec![0xFFFF],
            mtu: PathMtu::Mtu2048,
        }
    }

    /// The port's GUID (the low half of its GID).
    #[must_use]
    pub fn guid(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.gid.0[8..]);
        u64::from_be_bytes(b)
    }

    /// Whether `dlid` is one of the port's LIDs.
    #[must_use]
    pub fn owns_lid(&self, dlid: u16) -> bool {
        owns(self.lid.0, self.lmc, dlid)
    }

    /// The table index of `pkey`: a full member's entry of the same partition first.
    #[must_use]
    pub fn pkey_index(&self, pkey: u16) -> Option<u16> {
        let same = |k: &u16| k & 0x7FFF == pkey & 0x7FFF && k & 0x7FFF != 0;
        let full = self.pkeys.iter().position(|k| same(k) && k & 0x8000 != 0);
        full.or_else(|| self.pkeys.iter().position(same))
            .and_then(|i| u16::try_from(i).ok())
    }

    /// Whether a packet with `pkey` passes the port's P_Key check: an entry of the same
    /// partition, and not both limited members.
    #[must_use]
    pub fn admits(&self, pkey: u16) -> bool {
        self.pkeys
            .iter()
            .any(|k| k & 0x7FFF == pkey & 0x7FFF && k & 0x7FFF != 0 && (k | pkey) & 0x8000 != 0)
    }
}

/// Whether `dlid` is among the `2^lmc` LIDs from `base`.
fn owns(base: u16, lmc: u8, dlid: u16) -> bool {
    let span = 1u32 << lmc.min(7);
    base != 0 && u32::from(dlid) >= u32::from(base) && u32::from(dlid) < u32::from(base) + span
}

/// A port's beacon: who it is on the fabric now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beacon {
    /// The port is active.
    pub active: bool,
    /// LMC.
    pub lmc: u8,
    /// Port GUID.
    pub guid: u64,
    /// Base LID.
    pub lid: u16,
}

impl Beacon {
    /// The 20 bytes of a beacon.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; BEACON_LEN] {
        let mut b = [0u8; BEACON_LEN];
        b[..4].copy_from_slice(&BEACON_MAGIC);
        b[4] = BEACON_VERSION;
        b[5] = u8::from(self.active);
        b[6] = self.lmc & 0x07;
        b[8..16].copy_from_slice(&self.guid.to_be_bytes());
        b[16..18].copy_from_slice(&self.lid.to_be_bytes());
        b
    }

    /// A beacon, if `buf` is one (magic, version, length).
    #[must_use]
    pub fn parse(buf: &[u8]) -> Option<Self> {
        let b = buf.first_chunk::<BEACON_LEN>()?;
        if buf.len() != BEACON_LEN || b[..4] != BEACON_MAGIC || b[4] != BEACON_VERSION {
            return None;
        }
        let mut guid = [0u8; 8];
        guid.copy_from_slice(&b[8..16]);
        Some(Self {
            active: b[5] & 1 != 0,
            lmc: b[6] & 0x07,
            guid: u64::from_be_bytes(guid),
            lid: u16::from_be_bytes([b[16], b[17]]),
        })
    }

    /// Whether `buf` starts as a beacon does (and so is no IB packet).
    #[must_use]
    pub fn is_beacon(buf: &[u8]) -> bool {
        buf.starts_with(&BEACON_MAGIC)
    }
}

/// The underlay multicast group of `mlid` on an underlay of `underlay`'s family: IPv4
/// `239.254.<MLID>`, IPv6 `ff12::1b:<MLID>`. The beacon group is that of LID 0, which no
/// group has.
#[must_use]
pub fn mlid_group(mlid: u16, underlay: IpAddr) -> IpAddr {
    let [hi, lo] = mlid.to_be_bytes();
    match underlay {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::new(239, 254, hi, lo)),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::new(0xff12, 0, 0, 0, 0, 0, 0x1b, mlid)),
    }
}

/// The group beacons go to on `underlay`'s family.
#[must_use]
pub fn beacon_group(underlay: IpAddr) -> IpAddr {
    mlid_group(0, underlay)
}

/// One port of an interface's workers as a follower's provider sees it: control's provider
/// reads the port's SMA and learns the routes from beacons; each other worker's provider sends
/// and takes packets on that port by a copy of both, which control publishes whenever either
/// changes ([`SoftVerbs::ib_port_view`](crate::soft::SoftVerbs::ib_port_view),
/// [`SoftVerbs::follow_ib_port`](crate::soft::SoftVerbs::follow_ib_port)). One port, one
/// beacon: a follower sends none and learns no route itself.
#[derive(Debug, Clone)]
pub struct IbPortView {
    port: IbPortAttr,
    routes: LidTable,
}

impl IbPortView {
    /// The port's attributes.
    #[must_use]
    pub fn port(&self) -> &IbPortAttr {
        &self.port
    }

    /// How many routes it holds.
    #[must_use]
    pub fn routes(&self) -> usize {
        self.routes.len()
    }

    pub(super) const fn routes_table(&self) -> &LidTable {
        &self.routes
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Route {
    lmc: u8,
    guid: u64,
    addr: SocketAddr,
    expires: Instant,
}

/// Where the LIDs of the fabric are on the underlay, learnt from beacons.
#[derive(Debug, Clone, Default)]
pub(super) struct LidTable {
    /// By base LID.
    routes: BTreeMap<u16, Route>,
    /// Changes whenever a route is added, removed or moved (not when one is only refreshed).
    generation: u64,
}

/// What a beacon did to the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Learnt {
    /// A route added or refreshed.
    Route,
    /// A port that went down, or gave up a LID, removed.
    Removed,
    /// Not taken: the table is full.
    Full,
    /// Nothing to do (an inactive port with no route).
    Nothing,
}

impl LidTable {
    /// Takes `b`, heard from `from` at `now`: a route for an active port (replacing any
    /// other route of its GUID or its LID), none for an inactive one.
    pub(super) fn learn(&mut self, now: Instant, b: &Beacon, from: SocketAddr) -> Learnt {
        let before = self.routes.len();
        let prior = self.routes.get(&b.lid).copied();
        // A port holds one route: its GUID's old LIDs, and whatever else held this LID, go.
        self.routes
            .retain(|&lid, r| r.guid != b.guid && !(b.active && lid == b.lid));
        let removed = self.routes.len() != before;
        if !b.active || !Lid(b.lid).is_unicast() {
            self.generation += u64::from(removed);
            return if removed {
                Learnt::Removed
            } else {
                Learnt::Nothing
            };
        }
        if self.routes.len() >= MAX_ROUTES {
            self.expire(now);
            if self.routes.len() >= MAX_ROUTES {
                self.generation += u64::from(removed);
                return Learnt::Full;
            }
        }
        let route = Route {
            lmc: b.lmc,
            guid: b.guid,
            addr: from,
            expires: now + ROUTE_TTL,
        };
        // Only the same route again (its time renewed): the table did not change.
        let same = |r: Route| (r.lmc, r.guid, r.addr) == (route.lmc, route.guid, route.addr);
        let refreshed = before - self.routes.len() == 1 && prior.is_some_and(same);
        self.routes.insert(b.lid, route);
        self.generation += u64::from(!refreshed);
        Learnt::Route
    }

    /// Where `dlid` is, if a route holds it (routes past their time go at the next
    /// [`expire`](Self::expire), which the beacon clock runs).
    pub(super) fn lookup(&self, dlid: u16) -> Option<SocketAddr> {
        let (&base, r) = self.routes.range(..=dlid).next_back()?;
        owns(base, r.lmc, dlid).then_some(r.addr)
    }

    /// Forgets the routes past their time.
    pub(super) fn expire(&mut self, now: Instant) {
        let before = self.routes.len();
        self.routes.retain(|_, r| now < r.expires);
        self.generation += u64::from(self.routes.len() != before);
    }

    /// Routes held.
    pub(super) fn len(&self) -> usize {
        self.routes.len()
    }

    /// Changes whenever a route is added, removed or moved.
    pub(super) const fn generation(&self) -> u64 {
        self.generation
    }
}

/// The link state of an IB port: its attributes, routes, and when it beacons next.
#[derive(Debug)]
pub(super) struct IbLink {
    pub(super) port: IbPortAttr,
    pub(super) routes: LidTable,
    /// When the next beacon is due; `None` until the port's attributes are first set, and
    /// always on a follower's link ([`IbPortView`]), which neither beacons nor learns.
    pub(super) beacon_at: Option<Instant>,
    /// Changes whenever `port` does.
    pub(super) port_generation: u64,
}

impl IbLink {
    pub(super) fn new(gid: Gid) -> Self {
        Self {
            port: IbPortAttr::down(gid),
            routes: LidTable::default(),
            beacon_at: None,
            port_generation: 0,
        }
    }

    /// Changes whenever the port's attributes or its routes do.
    pub(super) const fn view_generation(&self) -> u64 {
        self.port_generation.wrapping_add(self.routes.generation())
    }

    /// What the followers of this port copy.
    pub(super) fn view(&self) -> IbPortView {
        IbPortView {
            port: self.port.clone(),
            routes: self.routes.clone(),
        }
    }

    /// The beacon this port sends now.
    pub(super) fn beacon(&self) -> Beacon {
        Beacon {
            active: self.port.active,
            lmc: self.port.lmc,
            guid: self.port.guid(),
            lid: self.port.lid.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(n: u8) -> SocketAddr {
        SocketAddr::from(([198, 18, 0, n], 4791))
    }

    fn beacon(guid: u64, lid: u16, active: bool) -> Beacon {
        Beacon {
            active,
            lmc: 0,
            guid,
            lid,
        }
    }

    #[test]
    fn beacons_round_trip_and_are_no_ib_packets() {
        let b = Beacon {
            active: true,
            lmc: 2,
            guid: 0x0010_0004,
            lid: 4,
        };
        assert_eq!(Beacon::parse(&b.to_bytes()), Some(b));
        assert!(Beacon::is_beacon(&b.to_bytes()));
        let lver = b.to_bytes()[0] & 0x0F;
        assert_ne!(lver, 0);
        assert_eq!(Beacon::parse(&b.to_bytes()[..19]), None);
        let mut long = b.to_bytes().to_vec();
        long.push(0);
        assert_eq!(Beacon::parse(&long), None);
    }

    #[test]
    fn routes_follow_what_ports_say_and_expire() {
        let t0 = Instant::now();
        let mut t = LidTable::default();
        assert_eq!(t.learn(t0, &beacon(1, 4, true), addr(2)), Learnt::Route);
        assert_eq!(t.lookup(4), Some(addr(2)));
        assert_eq!(t.lookup(5), None);
        // The SM moved the port to LID 9: the old LID goes with the new beacon.
        assert_eq!(t.learn(t0, &beacon(1, 9, true), addr(2)), Learnt::Route);
        assert_eq!(t.lookup(4), None);
        assert_eq!(t.lookup(9), Some(addr(2)));
        // Another port takes LID 9 over.
        t.learn(t0, &beacon(2, 9, true), addr(3));
        assert_eq!(t.lookup(9), Some(addr(3)));
        assert_eq!(t.len(), 1);
        // It goes down: its route goes at once.
        assert_eq!(t.learn(t0, &beacon(2, 9, false), addr(3)), Learnt::Removed);
        assert_eq!(t.lookup(9), None);
        // Silence: a route expires.
        t.learn(t0, &beacon(3, 12, true), addr(4));
        assert_eq!(t.lookup(12), Some(addr(4)));
        t.expire(t0 + ROUTE_TTL);
        assert_eq!(t.lookup(12), None);
        assert_eq!(t.len(), 0);
    }

    /// The table's generation moves when a route comes, goes or moves, not when a beacon
    /// only renews one (so control republishes its view to the workers on changes only).
    #[test]
    fn the_generation_moves_with_the_routes_not_with_their_renewal() {
        let t0 = Instant::now();
        let mut t = LidTable::default();
        let mut last = t.generation();
        let mut moved = |t: &LidTable| {
            let m = t.generation() != last;
            last = t.generation();
            m
        };
        t.learn(t0, &beacon(1, 4, true), addr(2));
        assert!(moved(&t), "a new route");
        t.learn(t0 + BEACON_INTERVAL, &beacon(1, 4, true), addr(2));
        assert!(!moved(&t), "renewed only");
        t.learn(t0, &beacon(1, 4, true), addr(3));
        assert!(moved(&t), "another underlay address");
        t.learn(t0, &beacon(1, 5, true), addr(3));
        assert!(moved(&t), "another LID");
        t.learn(t0, &beacon(7, 5, false), addr(9));
        assert!(!moved(&t), "a down port with no route");
        t.expire(t0);
        assert!(!moved(&t), "nothing past its time");
        t.expire(t0 + ROUTE_TTL);
        assert!(moved(&t), "expired");
        t.learn(t0, &beacon(1, 6, true), addr(3));
        t.learn(t0, &beacon(1, 6, false), addr(3));
        assert!(moved(&t), "gone down");
    }

    #[test]
    fn an_lmc_port_answers_its_whole_range() {
        let t0 = Instant::now();
        let mut t = LidTable::default();
        let b = Beacon {
            active: true,
            lmc: 2,
            guid: 5,
            lid: 8,
        };
        t.learn(t0, &b, addr(5));
        assert_eq!(t.lookup(11), Some(addr(5)));
        assert_eq!(t.lookup(12), None);
        assert_eq!(t.lookup(7), None);
    }

    #[test]
    fn the_table_is_bounded() {
        let t0 = Instant::now();
        let mut t = LidTable::default();
        for i in 0..MAX_ROUTES as u16 {
            assert_eq!(
                t.learn(t0, &beacon(u64::from(i), i + 1, true), addr(1)),
                Learnt::Route
            );
        }
        let over = beacon(1 << 40, 0xB000, true);
        assert_eq!(t.learn(t0, &over, addr(1)), Learnt::Full);
        assert_eq!(t.learn(t0 + ROUTE_TTL, &over, addr(1)), Learnt::Route);
    }

    #[test]
    fn the_p_key_check_is_an_hcas() {
        let mut p = IbPortAttr::down(Gid::default());
        p.pkeys = vec![0xFFFF, 0x0002];
        assert!(p.admits(0xFFFF) && p.admits(0x7FFF));
        assert!(p.admits(0x8002), "a full member reaches a limited one");
        assert!(!p.admits(0x0002), "two limited members do not");
        assert!(!p.admits(0x8003));
        assert_eq!(p.pkey_index(0x8002), Some(1));
        assert_eq!(p.pkey_index(0x7FFF), Some(0));
    }

    #[test]
    fn groups_are_kept_apart_from_roce_ones() {
        let v4 = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(
            mlid_group(0xC001, v4),
            IpAddr::V4(Ipv4Addr::new(239, 254, 0xC0, 1))
        );
        assert_eq!(beacon_group(v4), IpAddr::V4(Ipv4Addr::new(239, 254, 0, 0)));
        let v6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
        assert!(mlid_group(0xC000, v6).is_multicast());
    }
}
