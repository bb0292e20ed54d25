//! Multicast groups on a RoCEv2 IPv4 port, where rdma_rxe needs two things the verbs do not
//! give it.
//!
//! - rxe maps an MGID to an IP destination as `rdma_gid2ip` does: only IPv4-mapped MGIDs
//!   (`::ffff:a.b.c.d`) have an IPv4 address, so an AH to an IPoIB group
//!   (`ff12:401b:...`) on an IPv4 GID goes nowhere, and a received IPv4 multicast packet is
//!   matched against the attachments as `::ffff:<destination>`. The device therefore knows each
//!   IPoIB group by the IPv4-mapped form of its group ([`Gid::multicast_group`]), the address
//!   the software provider sends it to.
//! - rxe only programs the link-layer filter (`dev_mc_add`) and never joins the IP group, so
//!   the kernel drops the group's datagrams before rxe sees them. A UDP socket of this process
//!   joins the group on the port's address while some QP is attached to it.
//!
//! IPv6 and native InfiniBand ports keep the MGID as given.

use std::net::{IpAddr, UdpSocket};

use super::context::HwVerbs;
use crate::verbs::Gid;

impl HwVerbs {
    /// The GID the device knows multicast group `mgid` by: on a RoCEv2 IPv4 port an MGID that
    /// is not IPv4-mapped becomes the IPv4-mapped form of its IPv4 group; otherwise `mgid`.
    pub(super) fn device_mgid(&self, mgid: Gid) -> Gid {
        let port = self.attr.gid;
        if mgid.0[0] != 0xFF || !port.is_ipv4_mapped() {
            return mgid;
        }
        match mgid.multicast_group(port.to_ip()) {
            Some(group) => Gid::from_ip(group),
            None => mgid,
        }
    }

    /// Joins the IPv4 group of device MGID `dev_mgid` on the port's address (once for all the
    /// attachments that use it). A failure is logged: the attachment stands, and the group's
    /// packets reach it only if something else joined the group.
    pub(super) fn join_ipv4(&mut self, dev_mgid: Gid) {
        let (IpAddr::V4(group), IpAddr::V4(local)) = (dev_mgid.to_ip(), self.attr.gid.to_ip())
        else {
            return;
        };
        if !group.is_multicast() {
            return;
        }
        if let Some((_, users)) = self.ipv4_joins.0.get_mut(&group) {
            *users += 1;
            return;
        }
        let joined = UdpSocket::bind((local, 0)).and_then(|s| {
            s.join_multicast_v4(&group, &local)?;
            Ok(s)
        });
        match joined {
            Ok(sock) => {
                self.ipv4_joins.0.insert(group, (sock, 1));
            }
            Err(e) => {
                tracing::warn!(%group, %local, error = %e, "could not join the IPv4 group of a multicast attachment");
            }
        }
    }

    /// Undoes one [`join_ipv4`](Self::join_ipv4): the last user's leave closes the socket,
    /// which leaves the group.
    pub(super) fn leave_ipv4(&mut self, dev_mgid: Gid) {
        let IpAddr::V4(group) = dev_mgid.to_ip() else {
            return;
        };
        if let Some((_, users)) = self.ipv4_joins.0.get_mut(&group) {
            *users -= 1;
            if *users == 0 {
                self.ipv4_joins.0.remove(&group);
            }
        }
    }
}
