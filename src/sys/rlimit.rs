//! The process's limit on open file descriptors (`RLIMIT_NOFILE`): read it, and raise the soft
//! limit to the hard one.

use std::io;

/// A resource limit: the soft value the kernel enforces and the hard ceiling an unprivileged
/// process may raise it to; `u64::MAX` is `RLIM_INFINITY`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limit {
    /// The limit in force.
    pub soft: u64,
    /// The most the soft limit may be raised to.
    pub hard: u64,
}

/// `RLIMIT_NOFILE` now.
///
/// # Errors
/// `getrlimit(2)`'s.
pub(crate) fn nofile() -> io::Result<Limit> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a live `rlimit` on this stack frame that the call fills in.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Limit {
        soft: r.rlim_cur,
        hard: r.rlim_max,
    })
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (nothing when it is there already);
/// returns the limit before and after.
///
/// # Errors
/// `getrlimit(2)`'s or `setrlimit(2)`'s.
pub(crate) fn raise_nofile() -> io::Result<(Limit, Limit)> {
    let before = nofile()?;
    if before.soft >= before.hard {
        return Ok((before, before));
    }
    let r = libc::rlimit {
        rlim_cur: before.hard,
        rlim_max: before.hard,
    };
    // SAFETY: `r` is a live, initialised `rlimit` the call only reads.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((before, nofile()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let (before, after) = raise_nofile().unwrap();
        assert!(before.soft <= before.hard);
        assert_eq!(after.soft, before.hard);
        assert_eq!(after.hard, before.hard);
        assert_eq!(nofile().unwrap(), after);
    }
}
