//! The memory limit of the process's cgroup: cgroup v2's `memory.max` or cgroup v1's
//! `memory.limit_in_bytes`, of its own cgroup and every parent up to the hierarchy's root (a
//! parent's limit holds its children too), the tightest one and the file that sets it.
//!
//! The cgroup comes from `/proc/self/cgroup` (v1's `memory` line where a v1 memory hierarchy
//! is mounted, else the v2 line), the hierarchy's mount from `/proc/self/mountinfo`. The
//! parsing is pure; [`memory_limit`] reads the files.

use std::path::{Path, PathBuf};

/// A memory limit, and where it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLimit {
    /// The limit in bytes; `None`: none (`max`, or v1's unlimited value) in the cgroup and
    /// every parent.
    pub bytes: Option<u64>,
    /// The file of the tightest limit (the process's own cgroup's when there is none).
    pub file: PathBuf,
}

/// The two ways a memory cgroup is mounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    /// The `memory` controller's own hierarchy: `memory.limit_in_bytes`.
    V1,
    /// The unified hierarchy: `memory.max`.
    V2,
}

impl Version {
    /// The file of the cgroup's limit.
    const fn limit_file(self) -> &'static str {
        match self {
            Self::V1 => "memory.limit_in_bytes",
            Self::V2 => "memory.max",
        }
    }
}

/// v1 says "no limit" with the largest page-aligned counter (`0x7fff_ffff_ffff_f000` with 4
/// KiB pages); anything from here up is read as none.
const V1_UNLIMITED: u64 = 1 << 62;

/// The limit of the process's memory cgroup, read from `/proc` and the cgroup filesystem;
/// `None` when the process is in no memory cgroup this can find (no memory controller
/// mounted, or it does not govern the process's cgroup).
pub fn memory_limit() -> Option<CgroupLimit> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    limit_from(&own, &mounts, |p| std::fs::read_to_string(p).ok())
}

/// [`memory_limit`] with the contents of `/proc/self/cgroup` and `/proc/self/mountinfo`, and
/// `read` for the cgroup files.
fn limit_from(
    own: &str,
    mountinfo: &str,
    read: impl Fn(&Path) -> Option<String>,
) -> Option<CgroupLimit> {
    let (version, path) = own_cgroup(own, mountinfo)?;
    let (root, mount_point) = mount_of(mountinfo, version)?;
    // The cgroup's path as seen from the mount (which may show a subtree, as in a container).
    let relative = Path::new(&path)
        .strip_prefix(&root)
        .unwrap_or(Path::new(&path))
        .to_owned();
    let own_dir = mount_point.join(relative.strip_prefix("/").unwrap_or(&relative));
    let own_file = own_dir.join(version.limit_file());
    let mut tightest: Option<CgroupLimit> = None;
    let mut found = false;
    for dir in own_dir.ancestors() {
        let file = dir.join(version.limit_file());
        if let Some(text) = read(&file) {
            found = true;
            if let Some(bytes) = parse_limit(&text, version) {
                if tightest
                    .as_ref()
                    .and_then(|t| t.bytes)
                    .is_none_or(|t| bytes < t)
                {
                    tightest = Some(CgroupLimit {
                        bytes: Some(bytes),
                        file,
                    });
                }
            }
        }
        if dir == mount_point {
            break;
        }
    }
    // v2 without the memory controller in this cgroup has no `memory.max` anywhere on the way.
    found.then(|| {
        tightest.unwrap_or(CgroupLimit {
            bytes: None,
            file: own_file,
        })
    })
}

/// The process's cgroup that a memory limit applies to: v1's `memory` controller where it is
/// mounted, else the unified (v2) one; its version and path.
fn own_cgroup(own: &str, mountinfo: &str) -> Option<(Version, String)> {
    let mut v2 = None;
    for line in own.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if controllers.split(',').any(|c| c == "memory")
            && mount_of(mountinfo, Version::V1).is_some()
        {
            return Some((Version::V1, path.to_owned()));
        }
        if controllers.is_empty() {
            v2 = Some((Version::V2, path.to_owned()));
        }
    }
    v2.filter(|_| mount_of(mountinfo, Version::V2).is_some())
}

/// Where the hierarchy of `version` is mounted: the root of the hierarchy the mount shows and
/// the mount point.
fn mount_of(mountinfo: &str, version: Version) -> Option<(PathBuf, PathBuf)> {
    mountinfo.lines().find_map(|line| {
        // ID PARENT MAJ:MIN ROOT MOUNT-POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER-OPTIONS
        let (head, tail) = line.split_once(" - ")?;
        let mut head = head.split(' ');
        let root = head.nth(3)?;
        let mount_point = head.next()?;
        let mut tail = tail.split(' ');
        let fstype = tail.next()?;
        let super_options = tail.nth(1).unwrap_or_default();
        let wanted = match version {
            Version::V1 => fstype == "cgroup" && super_options.split(',').any(|o| o == "memory"),
            Version::V2 => fstype == "cgroup2",
        };
        wanted.then(|| (unescape(root), unescape(mount_point)))
    })
}

/// A mountinfo path with its octal escapes (`\040` for a space) undone.
fn unescape(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| b == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok());
        match octal {
            Some(c) => {
                out.push(c);
                i += 4;
            }
            None => {
                out.push(b);
                i += 1;
            }
        }
    }
    PathBuf::from(String::from_utf8_lossy(&out).into_owned())
}

/// A limit file's value: `None` for no limit (`max`, v1's unlimited) or what does not parse.
fn parse_limit(text: &str, version: Version) -> Option<u64> {
    let text = text.trim();
    if text == "max" {
        return None;
    }
    let bytes: u64 = text.parse().ok()?;
    (version == Version::V2 || bytes < V1_UNLIMITED).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const V1_MOUNTS: &str = "\
25 30 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
33 25 0:28 / /sys/fs/cgroup/memory rw,relatime shared:13 - cgroup cgroup rw,memory
34 25 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 25 0:30 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const V2_MOUNTS: &str = "\
22 1 0:21 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate
";

    fn files(entries: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> {
        let map: HashMap<PathBuf, String> = entries
            .iter()
            .map(|(p, v)| (PathBuf::from(p), (*v).to_owned()))
            .collect();
        move |p| map.get(p).cloned()
    }

    /// The v1 limit files of the root, `/a` and `/a/b`, with these values.
    fn v1_limits(root: &str, a: &str, b: &str) -> impl Fn(&Path) -> Option<String> {
        let dir = "/sys/fs/cgroup/memory";
        files(&[
            (&format!("{dir}/memory.limit_in_bytes"), root),
            (&format!("{dir}/a/memory.limit_in_bytes"), a),
            (&format!("{dir}/a/b/memory.limit_in_bytes"), b),
        ])
    }

    /// v1's "no limit".
    const V1_MAX: &str = "9223372036854771712\n";

    #[test]
    fn v1_takes_the_tightest_limit_of_the_cgroup_and_its_parents() {
        let own = "9:name=systemd:/\n4:memory:/a/b\n0::/\n";
        assert_eq!(
            limit_from(own, V1_MOUNTS, v1_limits(V1_MAX, "33554432\n", V1_MAX)),
            Some(CgroupLimit {
                bytes: Some(32 << 20),
                file: "/sys/fs/cgroup/memory/a/memory.limit_in_bytes".into(),
            })
        );
        let fs = v1_limits(V1_MAX, "33554432\n", "16777216\n");
        assert_eq!(
            limit_from(own, V1_MOUNTS, fs).and_then(|l| l.bytes),
            Some(16 << 20)
        );
    }

    #[test]
    fn v1_unlimited_everywhere_is_no_limit_named_by_the_own_cgroup() {
        assert_eq!(
            limit_from(
                "4:memory:/a/b\n",
                V1_MOUNTS,
                v1_limits(V1_MAX, V1_MAX, V1_MAX)
            ),
            Some(CgroupLimit {
                bytes: None,
                file: "/sys/fs/cgroup/memory/a/b/memory.limit_in_bytes".into(),
            })
        );
    }

    #[test]
    fn v2_reads_memory_max_and_max_is_no_limit() {
        let own = "0::/system.slice/ipoib-cm@ib0.service\n";
        let fs = files(&[
            ("/sys/fs/cgroup/system.slice/memory.max", "max\n"),
            (
                "/sys/fs/cgroup/system.slice/ipoib-cm@ib0.service/memory.max",
                "16777216\n",
            ),
        ]);
        assert_eq!(
            limit_from(own, V2_MOUNTS, &fs),
            Some(CgroupLimit {
                bytes: Some(16 << 20),
                file: "/sys/fs/cgroup/system.slice/ipoib-cm@ib0.service/memory.max".into(),
            })
        );
        let fs = files(&[
            ("/sys/fs/cgroup/system.slice/memory.max", "max\n"),
            (
                "/sys/fs/cgroup/system.slice/ipoib-cm@ib0.service/memory.max",
                "max\n",
            ),
        ]);
        assert_eq!(limit_from(own, V2_MOUNTS, &fs).and_then(|l| l.bytes), None);
    }

    #[test]
    fn v2_without_the_memory_controller_is_no_memory_cgroup() {
        // The unified hierarchy beside v1 controllers: no v1 memory line, no memory.max.
        let own = "0::/\n";
        assert_eq!(limit_from(own, V2_MOUNTS, files(&[])), None);
        // v1 controllers mounted but not memory, and nothing else: none either.
        assert_eq!(limit_from("3:cpu:/\n", V1_MOUNTS, files(&[])), None);
    }

    #[test]
    fn v1_memory_wins_over_the_unified_line() {
        let own = "4:memory:/x\n0::/\n";
        let fs = files(&[
            ("/sys/fs/cgroup/memory/x/memory.limit_in_bytes", "1048576\n"),
            ("/sys/fs/cgroup/unified/memory.max", "2097152\n"),
        ]);
        assert_eq!(
            limit_from(own, V1_MOUNTS, &fs).and_then(|l| l.bytes),
            Some(1 << 20)
        );
    }

    #[test]
    fn a_mount_of_a_subtree_is_read_from_its_root() {
        // A container without a cgroup namespace: the mount shows /docker/c1 at the mount point.
        let mounts = "40 30 0:28 /docker/c1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let own = "0::/docker/c1/daemon\n";
        let fs = files(&[("/sys/fs/cgroup/daemon/memory.max", "67108864\n")]);
        assert_eq!(
            limit_from(own, mounts, &fs),
            Some(CgroupLimit {
                bytes: Some(64 << 20),
                file: "/sys/fs/cgroup/daemon/memory.max".into(),
            })
        );
    }

    #[test]
    fn limit_values_parse() {
        assert_eq!(parse_limit("max\n", Version::V2), None);
        assert_eq!(parse_limit("16777216\n", Version::V2), Some(16 << 20));
        assert_eq!(parse_limit("16777216", Version::V1), Some(16 << 20));
        assert_eq!(parse_limit("9223372036854771712", Version::V1), None);
        // 64 KiB pages.
        assert_eq!(parse_limit("9223372036854710272", Version::V1), None);
        assert_eq!(parse_limit("", Version::V1), None);
        assert_eq!(parse_limit("lots", Version::V2), None);
        assert_eq!(unescape("/a\\040b"), PathBuf::from("/a b"));
        assert_eq!(unescape("/a\\0"), PathBuf::from("/a\\0"));
    }
}
