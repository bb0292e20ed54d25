//! What `ipoib-cm up` checks of the host's limits before any set-up step, so that a limit
//! that cannot hold the daemon ends it at start with one line naming what it needs, instead of
//! an OOM kill under its first heavy traffic or a control socket that never answers:
//!
//! - memory: what the settings need ([`MemoryNeed`]: the buffers, all committed at start, and
//!   the rest of the process) against the memory cgroup's limit ([`cgroup::memory_limit`]);
//! - file descriptors: the soft `RLIMIT_NOFILE` is raised to the hard limit, and what the
//!   settings need ([`FdNeed`]) must fit under it.
//!
//! Both figures and both limits are logged at start ([`log_found`]).

pub mod cgroup;
mod fds;
mod memory;

pub use cgroup::CgroupLimit;
pub use fds::FdNeed;
pub use memory::{MemoryNeed, REST_OF_PROCESS};

use std::sync::OnceLock;

use crate::daemon::config::Config;
use crate::sys::rlimit;

/// A limit of the host that cannot hold the daemon with its settings; one line each.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    /// The memory cgroup's limit is below what the settings need.
    #[error(
        "memory: the settings need {} MiB ({breakdown}), the cgroup allows {} MiB ({}); {hint}",
        need.div_ceil(1 << 20),
        limit.bytes.unwrap_or(0) >> 20,
        file_name(limit)
    )]
    Memory {
        /// Bytes needed.
        need: u64,
        /// The parts of `need` ([`MemoryNeed::breakdown`]).
        breakdown: String,
        /// The limit and its file.
        limit: CgroupLimit,
        /// The settings that shrink `need` ([`MemoryNeed::shrink_hint`]).
        hint: String,
    },
    /// `RLIMIT_NOFILE` is below what the settings need.
    #[error(
        "file descriptors: needs {need} ({breakdown}), RLIMIT_NOFILE allows {limit} \
         (ulimit -n / LimitNOFILE=)"
    )]
    Descriptors {
        /// Descriptors needed.
        need: usize,
        /// The parts of `need` ([`FdNeed::breakdown`]).
        breakdown: String,
        /// The soft limit, raised to the hard one where it could be.
        limit: u64,
    },
}

impl ResourceError {
    /// The exit status: the daemon could not start.
    pub const EXIT_CODE: u8 = 2;
}

/// `memory.max of /sys/fs/cgroup/...`: the limit's file named by its directory.
fn file_name(limit: &CgroupLimit) -> String {
    let name = limit
        .file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match limit.file.parent() {
        Some(dir) => format!("{name} of {}", dir.display()),
        None => name,
    }
}

/// What [`check`] found: the line [`log_found`] writes once the daemon has started.
static FOUND: OnceLock<String> = OnceLock::new();

/// Logs what [`check`] found, one info line next to the start-up line: the memory the settings
/// need and the cgroup's limit, the descriptors they need and `RLIMIT_NOFILE`. Nothing
/// before a check; a start that fails after the check stays one error line.
pub fn log_found() {
    if let Some(line) = FOUND.get() {
        tracing::info!("resources: {line}");
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit, then checks that the limit holds the
/// descriptors `cfg` needs and that the memory cgroup's limit (if any) holds the memory it
/// needs; what it found is [`log_found`]'s line.
///
/// # Errors
/// The first limit that cannot hold the daemon.
pub fn check(cfg: &Config) -> Result<(), ResourceError> {
    let memory = check_memory(cfg, cgroup::memory_limit())?;
    let descriptors = check_descriptors(cfg)?;
    let _ = FOUND.set(format!("{memory}; {descriptors}"));
    Ok(())
}

/// The memory check against `limit` (`None`: no memory cgroup found); what to log.
fn check_memory(cfg: &Config, limit: Option<CgroupLimit>) -> Result<String, ResourceError> {
    let need = MemoryNeed::of(cfg);
    let total = need.total() as u64;
    let breakdown = need.breakdown(cfg);
    let allows = match limit {
        Some(limit) => match limit.bytes {
            Some(bytes) if bytes < total => {
                return Err(ResourceError::Memory {
                    need: total,
                    breakdown,
                    limit,
                    hint: MemoryNeed::shrink_hint(cfg),
                })
            }
            Some(bytes) => format!("{} MiB ({})", bytes >> 20, file_name(&limit)),
            None => format!("no limit ({})", file_name(&limit)),
        },
        None => "no limit (no memory cgroup)".to_owned(),
    };
    Ok(format!(
        "memory: the settings need {} MiB ({breakdown}), the cgroup allows {allows}",
        total.div_ceil(1 << 20)
    ))
}

/// The descriptor check, after raising the soft limit; what to log.
fn check_descriptors(cfg: &Config) -> Result<String, ResourceError> {
    let (limit, raised) = match rlimit::raise_nofile() {
        Ok((before, after)) if before.soft < after.soft => {
            (after.soft, format!(" (raised from {})", before.soft))
        }
        Ok((_, after)) => (after.soft, String::new()),
        Err(e) => match rlimit::nofile() {
            Ok(now) => (now.soft, format!(" (not raised: {e})")),
            Err(_) => (u64::MAX, format!(" (unknown: {e})")),
        },
    };
    let notify = std::env::var_os("NOTIFY_SOCKET").is_some_and(|v| !v.is_empty());
    let need = FdNeed::of(cfg, open_descriptors(limit), notify);
    let total = need.total();
    if total as u64 > limit {
        return Err(ResourceError::Descriptors {
            need: total,
            breakdown: need.breakdown(),
            limit,
        });
    }
    Ok(format!(
        "file descriptors: need {total} ({}), RLIMIT_NOFILE allows {limit}{raised}",
        need.breakdown()
    ))
}

/// Descriptors open now whose numbers are below `limit` (those above it take no room under
/// it): `/proc/self/fd` less the one that reads it; all of the limit when not one more can
/// be opened, 3 (the standard ones) where `/proc` cannot tell.
fn open_descriptors(limit: u64) -> usize {
    match std::fs::read_dir("/proc/self/fd") {
        Ok(dir) => dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
            .filter(|fd| *fd < limit)
            .count()
            .saturating_sub(1),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
            usize::try_from(limit).unwrap_or(usize::MAX)
        }
        Err(_) => 3,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::daemon::config::{resolve_str, Settings};
    use std::path::Path;

    /// A configuration from file text, with `bind = "198.18.0.1"` unless it has a bind.
    pub(crate) fn config(extra: &str) -> Config {
        let text = if extra.contains("bind =") {
            extra.to_owned()
        } else {
            format!("bind = \"198.18.0.1\"\n{extra}")
        };
        resolve_str(Path::new("t.toml"), &text, &Settings::default()).unwrap()
    }

    #[test]
    fn a_limit_below_the_need_is_one_line_naming_the_file_and_the_settings() {
        let cfg = config("");
        let limit = CgroupLimit {
            bytes: Some(16 << 20),
            file: "/sys/fs/cgroup/memory/a/memory.limit_in_bytes".into(),
        };
        let e = check_memory(&cfg, Some(limit)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "memory: the settings need 65 MiB (receive pool 32.0 MiB (srq_depth 256 + rx_spare \
             256 buffers of 64 KiB), send pool 8.0 MiB, UD 2.0 MiB, CM 0.4 MiB, UDP batches 8.0 \
             MiB, reorder hold 4.1 MiB (reorder_hold 1024 packets), the rest 10.0 MiB), the \
             cgroup allows 16 MiB (memory.limit_in_bytes of /sys/fs/cgroup/memory/a); lower \
             --srq-depth or --rx-spare (64 KiB a buffer); --no-udp-offload saves 3.7 MiB; lower \
             --reorder-hold (4 KiB a packet)"
        );
        assert_eq!(ResourceError::EXIT_CODE, 2);
    }

    #[test]
    fn a_limit_that_holds_the_need_is_logged_with_it() {
        let cfg = config("srq_depth = 64\nrx_spare = 32\n");
        let need = MemoryNeed::of(&cfg).total() as u64;
        let limit = |bytes| CgroupLimit {
            bytes,
            file: "/sys/fs/cgroup/x/memory.max".into(),
        };
        let line = check_memory(&cfg, Some(limit(Some(need)))).unwrap();
        assert!(
            line.starts_with("memory: the settings need 39 MiB ("),
            "{line}"
        );
        assert!(
            line.ends_with(", the cgroup allows 38 MiB (memory.max of /sys/fs/cgroup/x)"),
            "{line}"
        );
        assert!(check_memory(&cfg, Some(limit(Some(need - 1)))).is_err());
        let line = check_memory(&cfg, Some(limit(None))).unwrap();
        assert!(
            line.ends_with("allows no limit (memory.max of /sys/fs/cgroup/x)"),
            "{line}"
        );
        let line = check_memory(&cfg, None).unwrap();
        assert!(
            line.ends_with("allows no limit (no memory cgroup)"),
            "{line}"
        );
    }

    #[test]
    fn descriptors_open_now_are_counted_below_the_limit() {
        let open = open_descriptors(u64::MAX);
        assert!(open >= 3, "{open}");
        assert_eq!(open_descriptors(0), 0);
    }

    #[test]
    fn the_descriptor_check_passes_under_the_raised_limit() {
        let line = check_descriptors(&config("")).unwrap();
        assert!(line.starts_with("file descriptors: need "), "{line}");
        assert!(line.contains(", RLIMIT_NOFILE allows "), "{line}");
    }
}
