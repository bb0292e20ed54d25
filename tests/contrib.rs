//! What ships for operators, checked against the code so it cannot go stale: the example
//! configuration (`contrib/ipoib-cm.example.toml`) read by the daemon's own loader and naming
//! every key of `Settings`, the systemd unit (`contrib/systemd/ipoib-cm@.service`) checked by
//! `systemd-analyze verify` where it exists, the man pages and shell completions that
//! `ipoib-cm generate` writes, and `up --help` keeping the test-only flags apart.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;
use ipoib_cm::daemon::config::{
    example_config, resolve_str, settings_table, with_settings_table, Settings, EXAMPLE_CONFIG,
};

const BIN: &str = env!("CARGO_BIN_EXE_ipoib-cm");

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    up: Settings,
}

fn contrib(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("contrib")
        .join(path)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

const EXAMPLE: &str = "ipoib-cm.example.toml";

/// The key of a `key = value` line, set or shown commented out as `# key = value`.
fn example_key(line: &str) -> Option<(&str, bool)> {
    let (text, set) = match line.strip_prefix("# ") {
        Some(rest) => (rest, false),
        None => (line, true),
    };
    let (key, _) = text.split_once(" = ")?;
    let ident = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    ident.then_some((key, set))
}

#[test]
fn example_config_resolves_as_shipped() {
    let path = contrib(EXAMPLE);
    let text = read(&path);
    let c = resolve_str(&path, &text, &Settings::default()).unwrap();
    assert_eq!(c.bind.to_string(), "198.18.0.1");
    assert_eq!(c.peer.len(), 1);
    assert_eq!(c.addr.len(), 2);
}

#[test]
fn every_commented_example_value_is_valid() {
    let path = contrib(EXAMPLE);
    let text = read(&path);
    let mut shown = 0;
    for line in text.lines() {
        let Some((key, false)) = example_key(line) else {
            continue;
        };
        shown += 1;
        let uncommented = line.strip_prefix("# ").unwrap();
        // TOML refuses a key twice: the shown value replaces the set one.
        let base: String = text
            .lines()
            .filter(|l| example_key(l).is_none_or(|(k, set)| !set || k != key))
            .map(|l| format!("{l}\n"))
            .collect();
        let with = format!("{base}{uncommented}\n");
        if let Err(e) = resolve_str(&path, &with, &Settings::default()) {
            panic!("{EXAMPLE}: `{uncommented}`: {e}");
        }
    }
    assert!(shown > 30, "only {shown} commented keys");
}

#[test]
fn example_config_names_every_key_once() {
    let text = read(&contrib(EXAMPLE));
    let mut named = Vec::new();
    for line in text.lines() {
        if let Some((key, _)) = example_key(line) {
            named.push(key.to_owned());
        }
    }
    let set: BTreeSet<&str> = named.iter().map(String::as_str).collect();
    assert_eq!(set.len(), named.len(), "a key is named twice: {named:?}");
    let keys: BTreeSet<&str> = Settings::keys().iter().copied().collect();
    let missing: Vec<_> = keys.difference(&set).collect();
    let unknown: Vec<_> = set.difference(&keys).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "{EXAMPLE}: missing keys {missing:?}, not keys {unknown:?}"
    );
}

/// What regenerates the README table and the example config after a change of the settings.
const REGENERATE: &str = "cargo run -- generate settings .";

#[test]
fn readme_settings_table_is_the_generated_one() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = read(&root.join("README.md"));
    let generated = with_settings_table(&readme, &settings_table())
        .expect("README.md has the settings table markers");
    assert!(
        readme == generated,
        "README.md's settings table is not the one the settings declare; run `{REGENERATE}`"
    );
}

#[test]
fn example_config_is_the_generated_one() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(EXAMPLE_CONFIG);
    assert!(
        read(&path) == example_config(),
        "{EXAMPLE_CONFIG} is not the one the settings declare; run `{REGENERATE}`"
    );
}

/// Every shown example that is the value its doc's `[default: ...]` names resolves as the
/// setting left out does: the doc's default is the real one.
#[test]
fn documented_defaults_are_the_defaults() {
    let path = contrib(EXAMPLE);
    let base = "bind = \"198.18.0.1\"\n";
    let default = resolve_str(&path, base, &Settings::default()).unwrap();
    let mut checked = Vec::new();
    let mut other_example = Vec::new();
    for s in Settings::docs() {
        let Some(text) = s.default_text() else {
            continue;
        };
        // The default itself, or the default first and when it is another after a comma.
        let example = s.shown.example.trim_matches('"');
        if text != example && !text.starts_with(&format!("{example},")) {
            if !text.contains(' ') {
                other_example.push(s.key);
            }
            continue;
        }
        let with = format!("{base}{} = {}\n", s.key, s.shown.example);
        let c = resolve_str(&path, &with, &Settings::default())
            .unwrap_or_else(|e| panic!("{}: {e}", s.key));
        assert_eq!(
            c, default,
            "{} = {}: [default: {text}]",
            s.key, s.shown.example
        );
        checked.push(s.key);
    }
    assert!(checked.len() >= 20, "only {checked:?}");
    // A one-word default that its example does not show is one of these, whose default is no
    // value a file would hold.
    assert_eq!(
        other_example,
        [
            "control_socket",
            "metrics_listen",
            "fault_device_fatal_after"
        ]
    );
}

const UNIT: &str = "systemd/ipoib-cm@.service";

/// The unit's `KEY=value` lines, in order.
fn unit_entries(text: &str) -> Vec<(&str, &str)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .collect()
}

#[test]
fn unit_runs_up_for_its_instance_with_its_config_file() {
    let text = read(&contrib(UNIT));
    let entries = unit_entries(&text);
    let get = |k: &str| -> Vec<&str> {
        entries
            .iter()
            .filter(|(key, _)| *key == k)
            .map(|(_, v)| *v)
            .collect()
    };
    assert_eq!(get("Type"), ["notify"]);
    assert_eq!(get("ExecReload"), ["/bin/kill -HUP $MAINPID"]);
    assert_eq!(get("CapabilityBoundingSet"), ["CAP_NET_ADMIN CAP_NET_RAW"]);
    assert_eq!(get("LimitMEMLOCK"), ["infinity"]);
    assert_eq!(get("ProtectSystem"), ["strict"]);
    assert_eq!(get("NoNewPrivileges"), ["yes"]);
    assert!(get("DeviceAllow").contains(&"/dev/net/tun rw"), "{text}");
    // Exit status 2 (a configuration mistake) is not retried.
    assert_eq!(get("RestartPreventExitStatus"), ["2"]);
    let exec = get("ExecStart");
    assert_eq!(exec.len(), 1);
    let args: Vec<String> = exec[0]
        .split_whitespace()
        .map(|a| a.replace("%i", "ib7"))
        .collect();
    assert_eq!(args[..2], ["/usr/bin/ipoib-cm", "up"]);
    let up = Cli::try_parse_from(&args[1..]).unwrap().up;
    assert_eq!(
        up.config.as_deref(),
        Some(Path::new("/etc/ipoib-cm/ib7.toml"))
    );
    // The file's ifname would lose to the flag: the instance name is the interface.
    let c = resolve_str(
        Path::new("/etc/ipoib-cm/ib7.toml"),
        &read(&contrib(EXAMPLE)),
        &up,
    )
    .unwrap();
    assert_eq!(c.ifname, "ib7");
}

#[test]
fn unit_passes_systemd_analyze_verify() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        println!("skipped: no systemd-analyze");
        return;
    }
    let dir = std::env::temp_dir().join(format!("ipoib-cm-contrib-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // verify checks that ExecStart's binary exists: point it at the one just built.
    let unit = read(&contrib(UNIT)).replace("/usr/bin/ipoib-cm", BIN);
    let path = dir.join("ipoib-cm@ib0.service");
    std::fs::write(&path, unit).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !stderr.contains("ipoib-cm@"),
        "systemd-analyze verify: {}\n{stderr}",
        out.status
    );
}

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("ipoib-cm-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn generate(what: &str, dir: &Path) {
    let out = Command::new(BIN)
        .args(["generate", what])
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "generate {what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn generate_writes_a_man_page_per_command() {
    let dir = TempDir::new("man");
    generate("man", &dir.0);
    let top = read(&dir.0.join("ipoib-cm.1"));
    assert!(top.contains(".TH ipoib-cm 1"), "{top}");
    let up = read(&dir.0.join("ipoib-cm-up.1"));
    assert!(up.contains(".TH ipoib-cm-up 1"), "{up}");
    for flag in ["rx\\-timeout", "control\\-socket", "fault\\-loss"] {
        assert!(up.contains(flag), "ipoib-cm-up.1 lacks {flag}");
    }
    for page in [
        "ipoib-cm-status.1",
        "ipoib-cm-rc-pingpong.1",
        "ipoib-cm-perf.1",
    ] {
        assert!(dir.0.join(page).exists(), "no {page}");
    }
    // Hidden commands get no page.
    assert!(!dir.0.join("ipoib-cm-generate.1").exists());
    assert!(!dir.0.join("ipoib-cm-conformance.1").exists());
}

#[test]
fn generate_writes_shell_completions() {
    let dir = TempDir::new("completions");
    generate("completions", &dir.0);
    for (file, needle) in [
        ("ipoib-cm.bash", "--rx-timeout"),
        ("_ipoib-cm", "--rx-timeout"),
        ("ipoib-cm.fish", "rx-timeout"),
    ] {
        let text = read(&dir.0.join(file));
        assert!(text.contains(needle), "{file} lacks {needle}");
        assert!(text.contains("rc-pingpong"), "{file} lacks rc-pingpong");
    }
}

#[test]
fn up_help_keeps_test_only_flags_under_their_own_heading() {
    let out = Command::new(BIN).args(["up", "--help"]).output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    let heading = help
        .lines()
        .position(|l| l.starts_with("Testing"))
        .unwrap_or_else(|| panic!("no Testing heading:\n{help}"));
    let lines: Vec<&str> = help.lines().collect();
    let test_only = ["--fault-loss", "--fault-dup", "--fault-seed", "--quirk"];
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim_start();
        if !t.starts_with('-') {
            continue;
        }
        let Some(flag) = t.split_whitespace().find(|w| w.starts_with("--")) else {
            continue;
        };
        let flag = flag.trim_end_matches(',');
        let is_test_only = flag.starts_with("--fault-") || flag == "--quirk";
        assert_eq!(
            i > heading,
            is_test_only,
            "{flag} on the wrong side of the Testing heading:\n{help}"
        );
    }
    for f in test_only {
        assert!(help.contains(f), "{f} missing:\n{help}");
    }
}

/// The `[package.metadata.deb]` assets of Cargo.toml: (source, destination).
fn deb_assets() -> Vec<(String, String)> {
    let manifest: toml::Table = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .parse()
        .unwrap();
    let assets = manifest["package"]["metadata"]["deb"]["assets"]
        .as_array()
        .expect("[package.metadata.deb] assets");
    assets
        .iter()
        .map(|a| {
            let a = a.as_array().unwrap();
            (
                a[0].as_str().unwrap().to_owned(),
                a[1].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn deb_package_ships_what_exists_or_is_generated() {
    const GENERATED: &str = "target/release/assets/";
    let script = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/deb.sh"));
    let dir = TempDir::new("deb");
    let assets = deb_assets();
    for what in ["man", "completions"] {
        assert!(
            script.contains(&format!("ipoib-cm generate {what} {GENERATED}{what}")),
            "scripts/deb.sh does not generate {what} into {GENERATED}{what}"
        );
        generate(what, &dir.0.join(what));
    }
    for (source, dest) in &assets {
        if source == "target/release/ipoib-cm" {
            assert_eq!(dest, "usr/bin/");
            continue;
        }
        let (path, pattern) = match source.strip_prefix(GENERATED) {
            Some(rest) => (dir.0.join(rest), rest.to_owned()),
            None => (
                Path::new(env!("CARGO_MANIFEST_DIR")).join(source),
                source.clone(),
            ),
        };
        let found = match path.file_name().and_then(|n| n.to_str()) {
            Some(name) if name.starts_with('*') => std::fs::read_dir(path.parent().unwrap())
                .unwrap()
                .filter_map(Result::ok)
                .any(|e| e.file_name().to_string_lossy().ends_with(&name[1..])),
            _ => path.exists(),
        };
        assert!(found, "deb asset {pattern} neither exists nor is generated");
    }
    for needed in [
        "contrib/systemd/ipoib-cm@.service",
        "contrib/ipoib-cm.example.toml",
    ] {
        assert!(
            assets.iter().any(|(s, _)| s == needed),
            "the package lacks {needed}"
        );
    }
}
