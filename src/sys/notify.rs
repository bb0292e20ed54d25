//! The systemd notification protocol (`sd_notify(3)`): state lines such as `READY=1` sent as
//! one datagram each to the Unix socket named by `$NOTIFY_SOCKET` (a path, or `@name` for an
//! abstract socket), and the watchdog interval from `$WATCHDOG_USEC`.
//!
//! The socket is non-blocking: a message the receiver has no room for is dropped, never
//! waited for.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// A connection to the service manager's notification socket.
#[derive(Debug)]
pub(crate) struct Notifier {
    socket: UnixDatagram,
    to: SocketAddr,
}

impl Notifier {
    /// The notifier of `$NOTIFY_SOCKET`; `Ok(None)` when it is not set (not run by systemd
    /// with `Type=notify`).
    ///
    /// # Errors
    /// The variable names no usable address, or the socket cannot be made.
    pub(crate) fn from_env() -> io::Result<Option<Self>> {
        match std::env::var_os("NOTIFY_SOCKET") {
            None => Ok(None),
            Some(v) if v.is_empty() => Ok(None),
            Some(v) => Self::new(&v.to_string_lossy()).map(Some),
        }
    }

    /// A notifier sending to `address`: a path, or `@name` for an abstract socket.
    ///
    /// # Errors
    /// The address is not a valid Unix socket address, or the socket cannot be made.
    pub(crate) fn new(address: &str) -> io::Result<Self> {
        let to = match address.strip_prefix('@') {
            Some(name) => SocketAddr::from_abstract_name(name.as_bytes())?,
            None => SocketAddr::from_pathname(address)?,
        };
        let socket = UnixDatagram::unbound()?;
        socket.set_nonblocking(true)?;
        Ok(Self { socket, to })
    }

    /// Sends one state message (`READY=1`, `STOPPING=1`, `WATCHDOG=1`, several lines joined
    /// by `\n`); returns whether it left. Never blocks.
    pub(crate) fn notify(&self, state: &str) -> bool {
        self.socket.send_to_addr(state.as_bytes(), &self.to).is_ok()
    }
}

/// `CLOCK_MONOTONIC` in microseconds, what `RELOADING=1` carries as `MONOTONIC_USEC`.
pub(crate) fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through the valid, exclusive pointer it gets.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000).saturating_add(nanos / 1000)
}

/// Half the watchdog timeout of `$WATCHDOG_USEC`, how often to send `WATCHDOG=1`; `None`
/// when no watchdog is asked for of this process (`$WATCHDOG_PID`, if set, names another).
pub(crate) fn watchdog_interval_from_env() -> Option<Duration> {
    let usec = std::env::var("WATCHDOG_USEC").ok()?;
    let pid = std::env::var("WATCHDOG_PID").ok();
    watchdog_interval(&usec, pid.as_deref(), std::process::id())
}

/// [`watchdog_interval_from_env`] on the variables' values. Pure.
pub(crate) fn watchdog_interval(usec: &str, pid: Option<&str>, own_pid: u32) -> Option<Duration> {
    if let Some(pid) = pid {
        if pid.trim().parse::<u32>().ok() != Some(own_pid) {
            return None;
        }
    }
    let usec: u64 = usec.trim().parse().ok().filter(|&u| u > 0)?;
    Some(Duration::from_micros(usec) / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_interval_is_half_the_timeout_for_this_process_only() {
        assert_eq!(
            watchdog_interval("4000000", None, 7),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            watchdog_interval("4000000", Some("7"), 7),
            Some(Duration::from_secs(2))
        );
        assert_eq!(watchdog_interval("4000000", Some("8"), 7), None);
        assert_eq!(watchdog_interval("0", None, 7), None);
        assert_eq!(watchdog_interval("soon", None, 7), None);
    }

    #[test]
    fn messages_reach_a_path_and_an_abstract_socket() {
        let dir = std::env::temp_dir().join(format!("ipoib-cm-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let rx = UnixDatagram::bind(&path).unwrap();
        let n = Notifier::new(&path.to_string_lossy()).unwrap();
        assert!(n.notify("READY=1"));
        let mut buf = [0u8; 64];
        let k = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..k], b"READY=1");
        drop(rx);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(!n.notify("STOPPING=1"), "nobody listens any more");

        let name = format!("ipoib-cm-test-notify-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let rx = UnixDatagram::bind_addr(&addr).unwrap();
        let n = Notifier::new(&format!("@{name}")).unwrap();
        assert!(n.notify("WATCHDOG=1"));
        let k = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..k], b"WATCHDOG=1");
    }
}
