//! Which local interface carries an address, its MTU (`getifaddrs` plus sysfs), so the daemon
//! can derive the RoCE path MTU from the underlay link as rxe does, and whether it carries IP
//! multicast (its index then), for the software provider's multicast groups.

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

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

/// The name and `ifa_flags` of the interface that has `ip` configured, if any.
fn interface_and_flags_of(ip: IpAddr) -> Option<(String, libc::c_uint)> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a pointer to a list it allocates into `head`; we check the
    // return value and free the list with freeifaddrs below, exactly once.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut found = None;
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
        if addr == Some(ip) {
            // SAFETY: ifa_name is a non-null NUL-terminated string owned by the list.
            let name = unsafe { CStr::from_ptr(ifa.ifa_name) };
            found = Some((name.to_string_lossy().into_owned(), ifa.ifa_flags));
            break;
        }
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once; no reference into
    // the list outlives this call (the name was copied).
    unsafe { libc::freeifaddrs(head) };
    found
}

/// The MTU of the interface that has `ip` configured.
pub(crate) fn link_mtu_for(ip: IpAddr) -> Option<u32> {
    let name = interface_of(ip)?;
    if name.contains('/') || name.starts_with('.') {
        return None;
    }
    std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_found() {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        assert_eq!(interface_of(lo).as_deref(), Some("lo"));
        assert!(link_mtu_for(lo).is_some_and(|m| m >= 1500));
        assert_eq!(interface_of("192.0.2.77".parse().unwrap()), None);
        assert_eq!(
            multicast_ifindex_of(lo),
            None,
            "loopback carries no multicast"
        );
    }
}
