//! The process's effective capabilities, as `/proc/self/status` shows them.

use std::io;

/// `CAP_NET_ADMIN`'s bit in the capability sets (linux/capability.h).
const CAP_NET_ADMIN: u32 = 12;

/// Whether this process holds `CAP_NET_ADMIN` in its effective set (root normally does; a
/// service can hold it without being root).
///
/// # Errors
/// `/proc/self/status` cannot be read or has no `CapEff` line.
pub(crate) fn has_net_admin() -> io::Result<bool> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    effective_has(&status, CAP_NET_ADMIN)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no CapEff in /proc/self/status"))
}

/// Whether the `CapEff:` line of a `/proc/PID/status` text has capability `cap`.
fn effective_has(status: &str, cap: u32) -> Option<bool> {
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))?
        .trim();
    let set = u64::from_str_radix(hex, 16).ok()?;
    Some(set & (1 << cap) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_effective_set() {
        let root = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(effective_has(root, CAP_NET_ADMIN), Some(true));
        let user = "CapEff:\t0000000000000000\n";
        assert_eq!(effective_has(user, CAP_NET_ADMIN), Some(false));
        let only_net_admin = "CapEff:\t0000000000001000\n";
        assert_eq!(effective_has(only_net_admin, CAP_NET_ADMIN), Some(true));
        assert_eq!(effective_has("Name:\tx\n", CAP_NET_ADMIN), None);
        assert_eq!(effective_has("CapEff:\tzz\n", CAP_NET_ADMIN), None);
    }
}
