//! Which local interface carries an address (`getifaddrs`), and what a link is now (its
//! index, MTU and state, by the interface ioctls), so the daemon can derive the RoCE path MTU
//! from the underlay link as rxe does and follow the link while it runs; whether a link
//! carries IP multicast (its index then), for the software provider's multicast groups.

use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::ifreq::{ctl_socket, ifreq, ioctl};

/// The name of the interface that has `ip` configured, if any.
pub(crate) fn interface_of(ip: IpAddr) -> Option<String> {
    interface_and_flags_of(ip).map(|(name, _)| name)
}

/// The index of the interface that has `ip` configured, when that interface is up and can
/// send and receive IP multicast (`IFF_UP` and `IFF_MULTICAST`; loopback, for one, cannot).
pub(crate) fn multicast_ifindex_of(ip: IpAddr) -> Option<u32> {
    let (name, flags) = interface_and_flags_of(ip)?;
    let wanted = (libc::IFF_UP | libc::IFF_MULTICAST) as libc::c_uint;
    if flags & wanted != wanted {
        return None;
    }
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: `name` is a NUL-terminated string that outlives the call, which only reads it.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    (index != 0).then_some(index)
}

/// One IP address of an interface, as `getifaddrs` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IfAddr {
    /// The interface's name.
    pub(crate) name: String,
    /// The address.
    pub(crate) addr: IpAddr,
    /// The interface's `ifa_flags` (`IFF_UP`, ...).
    pub(crate) flags: libc::c_uint,
}

/// Every IP address of every interface of this network namespace; empty when `getifaddrs`
/// fails.
pub(crate) fn addresses() -> Vec<IfAddr> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a pointer to a list it allocates into `head`; we check the
    // return value and free the list with freeifaddrs below, exactly once.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Vec::new();
    }
    let mut found = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a non-null node of the list getifaddrs returned, alive until
        // freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points to a sockaddr whose family field says which
        // concrete type it is; we read only the type the family names.
        let addr = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                        sin.sin_addr.s_addr,
                    ))))
                }
                libc::AF_INET6 => {
                    let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
                }
                _ => None,
            }
        };
        if let Some(addr) = addr {
            // SAFETY: ifa_name is a non-null NUL-terminated string owned by the list.
            let name = unsafe { CStr::from_ptr(ifa.ifa_name) };
            found.push(IfAddr {
                name: name.to_string_lossy().into_owned(),
                addr,
                flags: ifa.ifa_flags,
            });
        }
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once; no reference into
    // the list outlives this call (the names were copied).
    unsafe { libc::freeifaddrs(head) };
    found
}

/// The name and `ifa_flags` of the interface that has `ip` configured, if any.
fn interface_and_flags_of(ip: IpAddr) -> Option<(String, libc::c_uint)> {
    addresses()
        .into_iter()
        .find(|a| a.addr == ip)
        .map(|a| (a.name, a.flags))
}

/// What a link is now: its index, MTU and whether it is up and has a carrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LinkInfo {
    /// The interface index.
    pub(crate) index: u32,
    /// The MTU in bytes.
    pub(crate) mtu: u32,
    /// `IFF_UP`: administratively up.
    pub(crate) up: bool,
    /// `IFF_RUNNING`: up with a carrier (the operational state is up).
    pub(crate) running: bool,
}

/// The index, MTU and flags of the interface named `name` (`SIOCGIFINDEX`, `SIOCGIFMTU`,
/// `SIOCGIFFLAGS`, in this thread's network namespace).
///
/// # Errors
/// No such interface (`ENODEV`), or the ioctl's error.
pub(crate) fn link_info(name: &str) -> io::Result<LinkInfo> {
    use std::os::fd::AsRawFd;
    let sock = ctl_socket(libc::AF_INET)?;
    let fd = sock.as_raw_fd();
    let mut req = ifreq(name)?;
    // SAFETY: SIOCGIFINDEX fills ifru_ifindex of the struct ifreq it is given.
    unsafe { ioctl(fd, libc::SIOCGIFINDEX, &mut req, "SIOCGIFINDEX")? };
    // SAFETY: the ioctl above wrote ifru_ifindex, so reading that union field is valid.
    let index = unsafe { req.ifr_ifru.ifru_ifindex };
    let mut req = ifreq(name)?;
    // SAFETY: SIOCGIFMTU fills ifru_mtu of the struct ifreq it is given.
    unsafe { ioctl(fd, libc::SIOCGIFMTU, &mut req, "SIOCGIFMTU")? };
    // SAFETY: the ioctl above wrote ifru_mtu.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu };
    let mut req = ifreq(name)?;
    // SAFETY: SIOCGIFFLAGS fills ifru_flags of the struct ifreq it is given.
    unsafe { ioctl(fd, libc::SIOCGIFFLAGS, &mut req, "SIOCGIFFLAGS")? };
    // SAFETY: the ioctl above wrote ifru_flags.
    let flags = i32::from(unsafe { req.ifr_ifru.ifru_flags });
    Ok(LinkInfo {
        index: u32::try_from(index).unwrap_or(0),
        mtu: u32::try_from(mtu).unwrap_or(0),
        up: flags & libc::IFF_UP != 0,
        running: flags & libc::IFF_RUNNING != 0,
    })
}

/// The MTU of the interface that has `ip` configured.
pub(crate) fn link_mtu_for(ip: IpAddr) -> Option<u32> {
    let name = interface_of(ip)?;
    link_info(&name).ok().map(|l| l.mtu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_found() {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        assert_eq!(interface_of(lo).as_deref(), Some("lo"));
        assert!(link_mtu_for(lo).is_some_and(|m| m >= 1500));
        let info = link_info("lo").unwrap();
        assert!(info.up && info.index > 0, "{info:?}");
        assert_eq!(Some(info.mtu), link_mtu_for(lo));
        assert!(link_info("no-such-if0").is_err());
        assert!(addresses().iter().any(|a| a.name == "lo" && a.addr == lo));
        assert_eq!(interface_of("192.0.2.77".parse().unwrap()), None);
        assert_eq!(
            multicast_ifindex_of(lo),
            None,
            "loopback carries no multicast"
        );
    }
}
