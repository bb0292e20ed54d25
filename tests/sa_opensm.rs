//! The SA client against a real SA: opensm on an ibsim simulated fabric, every process
//! reaching the simulator through ibsim's `umad2sim` preload (libc calls on
//! `/dev/infiniband/umad*` and `/sys/class/infiniband*` redirected to it).
//!
//! Everything runs in one network namespace of a two-node lab this test creates (ibsim's abstract Unix socket
//! lives there), in a scratch directory (umad2sim writes its fake sysfs into the working
//! directory). The namespace's drop kills whatever is left in it.
//!
//! Shows, on `net.2sw2path4hca` (two switches, four HCAs; opensm on Hca1, the client on
//! Hca2):
//! - `ipoib-cm sa path` gets PathRecords with the LIDs the SM gave the ports (as `ibstat`
//!   reports them), to itself and to Hca3;
//! - `ipoib-cm sa join --hold` joins the IPv4 broadcast group with the parameters
//!   `saquery -g` shows, and the port's membership is then in the SA (`saquery -m`);
//! - opensm restarted forgets the membership; the client's rejoin on `CLIENT_REREGISTER`
//!   (SIGUSR1 stands in for the port event ibsim cannot deliver) puts it back;
//! - the held join's leave on SIGTERM, and `ipoib-cm sa leave`, remove it.
//!
//! Needs `ibsim`, `opensm`, `saquery`, `ibstat` and `libumad2sim.so` (Debian `ibsim-utils`,
//! `opensm`, `infiniband-diags`): missing, the test skips with a reason, or fails with
//! `CI=true`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::thread;
use std::time::{Duration, Instant};

use common::netns::{output_within, wait_within, Lab, Lines};

const UMAD2SIM: &str = "/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so";
const NET: &str = "/usr/share/doc/ibsim-utils/net-examples/net.2sw2path4hca";
const BIN: &str = env!("CARGO_BIN_EXE_ipoib-cm");
const LIMIT: Duration = Duration::from_secs(30);

fn tools_present() -> Result<(), String> {
    for f in [UMAD2SIM, NET] {
        if !Path::new(f).exists() {
            return Err(format!("{f} missing (apt-get install ibsim-utils)"));
        }
    }
    for t in ["ibsim", "opensm", "saquery", "ibstat"] {
        let found = std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(t).exists()));
        if !found {
            return Err(format!(
                "{t} not installed (apt-get install ibsim-utils opensm infiniband-diags)"
            ));
        }
    }
    Ok(())
}

/// One simulated fabric in a namespace and a scratch directory.
struct Fabric {
    lab: Lab,
    dir: PathBuf,
    ibsim: Child,
    /// ibsim's console: one command a line (`Unlink "Hca2"`, ...).
    console: std::process::ChildStdin,
    opensm: Option<(Child, Lines)>,
}

impl Fabric {
    /// `cmd` on node `host` of the simulated fabric, through umad2sim, in the scratch dir.
    fn on(&self, host: &str, args: &[&str]) -> Command {
        let mut c = self.lab.exec(1, args);
        c.current_dir(&self.dir)
            .env("LD_PRELOAD", UMAD2SIM)
            .env("SIM_HOST", host);
        c
    }

    /// `args` on node `host`, running: the child, its output's lines, and its error output's
    /// (read so that it never blocks).
    fn spawn(&self, host: &str, args: &[&str]) -> (Child, Lines, Lines) {
        let mut c = self.on(host, args);
        c.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = c.spawn().expect("spawn");
        let out = Lines::new(child.stdout.take().expect("stdout"));
        let err = Lines::new(child.stderr.take().expect("stderr"));
        (child, out, err)
    }

    fn run(&self, host: &str, args: &[&str]) -> (bool, String) {
        let out = output_within(self.on(host, args), LIMIT);
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    }

    fn start_opensm(&mut self, log: &str) {
        self.start_opensm_with(log, &[]);
    }

    /// opensm on Hca1 with `args` besides its log, no periodic sweeps and the scratch dir's
    /// cache (`guid2lid`), once it is master.
    fn start_opensm_with(&mut self, log: &str, args: &[&str]) {
        let (child, mut lines) = self.spawn_sm("Hca1", log, &[&["-s", "0"], args].concat());
        assert!(
            lines.wait_for("Entering MASTER state", LIMIT),
            "opensm never became master: {:?}",
            lines.seen()
        );
        self.opensm = Some((child, lines));
    }

    /// opensm on `host` with `args`, logging to `log` in the scratch dir (its cache there too).
    fn spawn_sm(&self, host: &str, log: &str, args: &[&str]) -> (Child, Lines) {
        let log = self.dir.join(log);
        let log = log.to_str().expect("utf-8 path");
        let mut c = self.on(host, &[&["opensm", "-f", log], args].concat());
        let dir = self.dir.to_str().expect("utf-8 path").to_owned();
        c.env("OSM_TMP_DIR", &dir)
            .env("OSM_CACHE_DIR", &dir)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null());
        let mut child = c.spawn().expect("spawn opensm");
        let lines = Lines::new(child.stdout.take().expect("stdout"));
        (child, lines)
    }

    /// One command to ibsim's console.
    fn sim(&mut self, line: &str) {
        use std::io::Write;
        writeln!(self.console, "{line}").expect("ibsim console");
        self.console.flush().expect("ibsim console");
    }

    fn stop_opensm(&mut self) {
        if let Some((mut child, _)) = self.opensm.take() {
            let _ = Command::new("kill").arg(child.id().to_string()).status();
            wait_within(&mut child, LIMIT);
        }
    }

    /// `ibstat` of `host`'s port once the SM has made it active with a LID: (lid, port GUID).
    fn port_of(&self, host: &str) -> (u16, u64) {
        let deadline = Instant::now() + LIMIT;
        loop {
            let (_, text) = self.run(host, &["ibstat"]);
            let field = |name: &str| {
                text.lines()
                    .find_map(|l| l.trim().strip_prefix(name).map(|v| v.trim().to_owned()))
            };
            let lid = field("Base lid:").and_then(|v| v.parse::<u16>().ok());
            let guid = field("Port GUID:")
                .and_then(|v| u64::from_str_radix(v.trim_start_matches("0x"), 16).ok());
            if let (Some("Active"), Some(lid), Some(guid)) = (field("State:").as_deref(), lid, guid)
            {
                if lid != 0 {
                    return (lid, guid);
                }
            }
            assert!(Instant::now() < deadline, "{host} never active: {text}");
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// `saquery -t 2000 ARGS` from Hca3, asked again (bounded) when it gets no answer in
    /// time on a loaded machine.
    fn saquery(&self, args: &[&str]) -> String {
        let mut last = String::new();
        for _ in 0..5 {
            let mut all = vec!["saquery", "-t", "2000"];
            all.extend_from_slice(args);
            let (ok, text) = self.run("Hca3", &all);
            if ok {
                return text;
            }
            last = text;
            thread::sleep(Duration::from_millis(300));
        }
        panic!("saquery {args:?} never answered: {last}");
    }

    /// Whether the SA lists `gid` as a member of the broadcast group (asked with opensm's
    /// default SM_Key, so member GIDs are not hidden).
    fn member(&self, gid: &str) -> bool {
        self.saquery(&["--smkey", "1", "-m"])
            .lines()
            .any(|l| l.trim().starts_with("PortGid") && l.trim().ends_with(&format!(".{gid}")))
    }

    /// Waits (bounded) until membership of `gid` is `want`.
    fn expect_member(&self, gid: &str, want: bool, what: &str) {
        let deadline = Instant::now() + LIMIT;
        while self.member(gid) != want {
            assert!(
                Instant::now() < deadline,
                "{what}: member {gid} never {want}"
            );
            thread::sleep(Duration::from_millis(300));
        }
    }

    /// Restarts opensm and waits until port `gid` is no member any more.
    fn restart_opensm(&mut self, gid: &str) {
        self.stop_opensm();
        self.start_opensm("osm2.log");
        self.expect_member(gid, false, "after the SM restart");
    }

    /// Raises CLIENT_REREGISTER in the client process `pid` (SIGUSR1) and waits until `out`
    /// shows the port event.
    fn reregister(pid: u32, out: &mut Lines) {
        signal(pid, "-USR1");
        assert!(
            out.wait_for("port event CLIENT_REREGISTER", LIMIT),
            "{:?}",
            out.seen()
        );
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        self.stop_opensm();
        let _ = Command::new("kill")
            .arg(self.ibsim.id().to_string())
            .status();
        wait_within(&mut self.ibsim, LIMIT);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Sends signal `sig` (`-USR1`, `-TERM`) to our child `pid`.
fn signal(pid: u32, sig: &str) {
    assert!(Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill")
        .success());
}

fn gid_of(guid: u64) -> String {
    let g = std::net::Ipv6Addr::from((0xfe80u128 << 112) | u128::from(guid));
    g.to_string()
}

fn field<'a>(line: &'a str, name: &str) -> &'a str {
    let mut it = line.split_whitespace();
    while let Some(w) = it.next() {
        if w == name {
            return it.next().unwrap_or("");
        }
    }
    panic!("no {name} in {line:?}")
}

/// ibsim with `net.2sw2path4hca` and opensm on Hca1 in a fresh two-node lab named `name`;
/// `None` (skipped, with the reason printed) where the tools or namespaces are missing.
fn fabric(name: &str) -> Option<Fabric> {
    if let Err(why) = tools_present() {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "CI: {why}");
        println!("skipped: {why}");
        return None;
    }
    let lab = match Lab::new(name, 2, 1500) {
        Ok(lab) => lab,
        Err(skip) => {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "CI: {skip}");
            skip.print();
            return None;
        }
    };
    let dir = std::env::temp_dir().join(format!("sa-opensm-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    std::fs::copy(NET, dir.join("net")).expect("copy topology");
    let mut c = lab.exec(1, &["ibsim", "-s", "net"]);
    c.current_dir(&dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut ibsim = c.spawn().expect("spawn ibsim");
    let console = ibsim.stdin.take().expect("ibsim stdin");
    let mut f = Fabric {
        lab,
        dir,
        ibsim,
        console,
        opensm: None,
    };
    // ibsim listens once it has read the topology; opensm retries nothing, so wait for it.
    let deadline = Instant::now() + LIMIT;
    while !f.run("Hca2", &["ibstat"]).0 {
        assert!(Instant::now() < deadline, "ibsim never answered");
        thread::sleep(Duration::from_millis(200));
    }
    f.start_opensm("osm.log");
    Some(f)
}

#[test]
fn sa_client_against_opensm_on_ibsim() {
    let Some(mut f) = fabric("saosm") else {
        return;
    };
    let (lid2, guid2) = f.port_of("Hca2");
    let (lid3, guid3) = f.port_of("Hca3");
    let (gid2, gid3) = (gid_of(guid2), gid_of(guid3));
    println!("Hca2 lid {lid2} gid {gid2}; Hca3 lid {lid3} gid {gid3}");

    // PathRecords carry the LIDs the SM gave the ports.
    let (ok, out) = f.run("Hca2", &[BIN, "sa", "path"]);
    assert!(ok, "sa path: {out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("path "))
        .expect("path line");
    println!("{line}");
    assert_eq!(field(line, "dlid"), format!("{lid2:#x}"));
    assert_eq!(field(line, "slid"), format!("{lid2:#x}"));
    assert_eq!(field(line, "sgid"), gid2);
    let (ok, out) = f.run("Hca2", &[BIN, "sa", "path", "--dgid", &gid3]);
    assert!(ok, "sa path --dgid: {out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("path "))
        .expect("path line");
    println!("{line}");
    assert_eq!(field(line, "dgid"), gid3);
    assert_eq!(field(line, "dlid"), format!("{lid3:#x}"));
    assert_eq!(field(line, "slid"), format!("{lid2:#x}"));
    assert_eq!(field(line, "pkey"), "0xffff");

    // The broadcast group as the SA describes it.
    let groups = f.saquery(&["-g"]);
    let g = |name: &str| {
        groups
            .lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix(name)
                    .map(|v| v.trim_start_matches('.').to_owned())
            })
            .unwrap_or_else(|| panic!("no {name} in {groups}"))
    };
    assert_eq!(g("MGID"), "ff12:401b:ffff::ffff:ffff");
    let mlid = g("Mlid").to_lowercase();
    assert!(!f.member(&gid2), "member before the join");

    // Join and hold.
    let (mut hold, mut out, _err) = f.spawn("Hca2", &[BIN, "sa", "join", "--hold"]);
    assert!(out.wait_for("joined ", LIMIT), "no join: {:?}", out.seen());
    let joined = out.seen().last().expect("line").clone();
    println!("{joined}");
    assert_eq!(field(&joined, "mgid"), "ff12:401b:ffff::ffff:ffff");
    assert_eq!(field(&joined, "mlid"), mlid);
    assert_eq!(field(&joined, "qkey"), "0xb1b");
    f.expect_member(&gid2, true, "after the join");

    // opensm restarts: the membership is gone until the client reregisters.
    f.restart_opensm(&gid2);
    Fabric::reregister(hold.id(), &mut out);
    assert!(
        out.wait_for("joined ", LIMIT),
        "no rejoin: {:?}",
        out.seen()
    );
    println!("rejoined: {}", out.seen().last().expect("line"));
    f.expect_member(&gid2, true, "after the rejoin");

    // SIGTERM leaves.
    signal(hold.id(), "-TERM");
    assert!(out.wait_for("left ", LIMIT), "no leave: {:?}", out.seen());
    assert!(out.seen().last().expect("line").ends_with("deleted true"));
    assert!(wait_within(&mut hold, LIMIT).success());
    f.expect_member(&gid2, false, "after the held join's leave");

    // A join left in place, then `sa leave`.
    let (ok, text) = f.run("Hca2", &[BIN, "sa", "join"]);
    assert!(ok, "sa join: {text}");
    f.expect_member(&gid2, true, "after sa join");
    let (ok, text) = f.run("Hca2", &[BIN, "sa", "leave"]);
    assert!(ok && text.contains("deleted true"), "sa leave: {text}");
    f.expect_member(&gid2, false, "after sa leave");
}

/// The broadcast group's MLID as `saquery -g` shows it (lower-case hex).
/// The first line that starts with `prefix`, among those seen or arriving within [`LIMIT`]
/// (the lines come in the order the SA answers); `what` names its absence.
fn line_with(out: &mut Lines, prefix: &str, what: &str) -> String {
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(l) = out.seen().iter().find(|l| l.starts_with(prefix)) {
            return l.clone();
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(out.wait_for(prefix, left), "{what}: {:?}", out.seen());
    }
}

fn broadcast_mlid(f: &Fabric) -> String {
    let groups = f.saquery(&["-g"]);
    let mut mgid_seen = false;
    for l in groups.lines().map(str::trim) {
        if let Some(v) = l.strip_prefix("MGID") {
            mgid_seen = v.trim_start_matches('.') == "ff12:401b:ffff::ffff:ffff";
        }
        if let (true, Some(v)) = (mgid_seen, l.strip_prefix("Mlid")) {
            return v.trim_start_matches('.').to_lowercase();
        }
    }
    panic!("no broadcast group in {groups}");
}

/// The daemon's SA driver (`driver::SaDriver`, the code `Node` runs on an InfiniBand port)
/// between opensm and an endpoint (on an in-memory software device: ibsim has no uverbs),
/// through `ipoib-cm sa node`.
#[test]
fn the_daemons_sa_driver_against_opensm_on_ibsim() {
    let Some(mut f) = fabric("sadrv") else {
        return;
    };
    let (lid2, guid2) = f.port_of("Hca2");
    let (lid3, guid3) = f.port_of("Hca3");
    let (gid2, gid3) = (gid_of(guid2), gid_of(guid3));
    let mlid = broadcast_mlid(&f);
    assert!(!f.member(&gid2), "member before the join");

    let (mut node, mut out, _err) = f.spawn(
        "Hca2",
        &[BIN, "sa", "node", "--dgid", &gid3, "--send", "ff0e::1:2"],
    );
    // The broadcast group first: attached with the SA's MLID, Q_Key and MTU applied.
    let joined = line_with(
        &mut out,
        "joined mgid ff12:401b:ffff::ffff:ffff",
        "no broadcast join",
    );
    println!("{joined}");
    assert_eq!(field(&joined, "mlid"), mlid);
    assert_eq!(field(&joined, "attached_mlid"), mlid);
    assert_eq!(field(&joined, "qkey"), "0xb1b");
    let bcast = line_with(&mut out, "broadcast ", "no broadcast line");
    println!("{bcast}");
    assert_eq!(field(&bcast, "qkey"), "0xb1b");
    // opensm's group MTU is 2048 (Mtu 0x84): the 4096-byte port's UD MTU is clamped to it.
    assert_eq!(field(&bcast, "ud_mtu"), "2044");
    f.expect_member(&gid2, true, "after the node's join");

    // The IPv6 all-nodes and solicited-node groups, created with the broadcast group's
    // parameters and attached with their own MLIDs.
    for mgid in ["ff12:601b:ffff::1", "ff12:601b:ffff::1:ff00:2"] {
        let l = line_with(
            &mut out,
            &format!("joined mgid {mgid} "),
            "no IPv6 group join",
        );
        println!("{l}");
        assert_eq!(field(&l, "send_only"), "false");
        assert_ne!(field(&l, "attached_mlid"), "none");
    }

    // The endpoint's path query: the LIDs of the topology.
    let path = line_with(&mut out, "path dgid", "no path");
    println!("{path}");
    assert_eq!(field(&path, "dgid"), gid3);
    assert_eq!(field(&path, "dlid"), format!("{lid3:#x}"));
    assert_eq!(field(&path, "slid"), format!("{lid2:#x}"));

    // A group only sent to: the first packet is held back, a send-only join goes out.
    let held = line_with(
        &mut out,
        "held group ff0e::1:2",
        "first send went out unjoined",
    );
    println!("{held}");
    let so = line_with(
        &mut out,
        "joined mgid ff12:601b:ffff::1:2",
        "no send-only join",
    );
    println!("{so}");
    assert_eq!(field(&so, "send_only"), "true");
    assert_eq!(field(&so, "attached_mlid"), "none");
    let groups = f.saquery(&["-g"]);
    assert!(groups.contains("ff12:601b:ffff::1:2"), "{groups}");

    // opensm restarts: memberships gone until the port's CLIENT_REREGISTER reaches the
    // endpoint, whose SA driver rejoins.
    f.restart_opensm(&gid2);
    let seen = out.seen().len();
    Fabric::reregister(node.id(), &mut out);
    let deadline = Instant::now() + LIMIT;
    while !out.seen()[seen..]
        .iter()
        .any(|l| l.starts_with("broadcast "))
    {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            out.wait_for("broadcast ", left),
            "no rejoin: {:?}",
            out.seen()
        );
    }
    println!("rejoined: {:?}", &out.seen()[seen..]);
    f.expect_member(&gid2, true, "after the rejoin");

    // Stop: every group left, with a DELETE (no kernel ipoib on this port).
    signal(node.id(), "-TERM");
    assert!(out.wait_for("stopped", LIMIT), "no stop: {:?}", out.seen());
    let left: Vec<&String> = out
        .seen()
        .iter()
        .filter(|l| l.starts_with("left "))
        .collect();
    println!("{left:?}");
    assert!(left
        .iter()
        .any(|l| l.starts_with("left mgid ff12:401b:ffff::ffff:ffff deleted true")));
    assert!(wait_within(&mut node, LIMIT).success());
    f.expect_member(&gid2, false, "after the node's leaves");
}

/// First contact through the daemon's SA driver and opensm (`ipoib-cm sa node --connect`): a
/// packet to a static neighbour waits for its PathRecord, and the REQ of its connection is
/// made only once the path is known, with the LIDs opensm gave; a packet to a GID the SA has
/// no path to is dropped when the query fails, and counted.
#[test]
fn first_contact_waits_for_the_path_from_opensm() {
    let Some(f) = fabric("sapath") else {
        return;
    };
    let (lid2, _) = f.port_of("Hca2");
    let (lid4, guid4) = f.port_of("Hca4");
    let gid4 = gid_of(guid4);
    let nobody = gid_of(0x0002_c903_dead_beef);
    let (mut node, mut out, _err) = f.spawn(
        "Hca2",
        &[BIN, "sa", "node", "--connect", &gid4, "--connect", &nobody],
    );
    for want in ["waiting connect", "req dgid", "dropped path_failed_drops"] {
        line_with(&mut out, want, "missing");
    }
    let seen = out.seen().to_vec();
    println!("{seen:#?}");
    let line = |prefix: &str| {
        seen.iter()
            .find(|l| l.starts_with(prefix))
            .cloned()
            .unwrap_or_default()
    };
    // Both packets were held (no TX connection, so no REQ) before any path was known.
    let waiting = seen
        .iter()
        .filter(|l| l.starts_with("waiting connect"))
        .cloned()
        .collect::<Vec<_>>();
    assert_eq!(waiting.len(), 2, "{seen:?}");
    assert_eq!(field(&waiting[1], "path_waiting"), "2");
    assert_eq!(field(&waiting[1], "tx_connections"), "0");
    let at = |prefix: &str| seen.iter().position(|l| l.starts_with(prefix));
    assert!(at("waiting connect") < at("req dgid"), "{seen:?}");
    // The REQ: to Hca4, subnet-local with the LIDs opensm assigned.
    let req = line("req dgid");
    assert_eq!(field(&req, "dgid"), gid4);
    assert_eq!(field(&req, "dlid"), format!("{lid4:#x}"));
    assert_eq!(field(&req, "slid"), format!("{lid2:#x}"));
    assert_eq!(field(&req, "subnet_local"), "true");
    assert_eq!(seen.iter().filter(|l| l.starts_with("req ")).count(), 1);
    // The GID nobody has: opensm has no path, the held packet is dropped and counted.
    assert!(line("path failed dgid").contains(&nobody), "{seen:?}");
    assert_eq!(field(&line("dropped"), "path_failed_drops"), "1");
    signal(node.id(), "-TERM");
    assert!(out.wait_for("stopped", LIMIT), "no stop: {:?}", out.seen());
    assert!(wait_within(&mut node, LIMIT).success());
}

/// The port events a simulated port raises from what it reads of its own SMA
/// (`ipoib-cm sa port --join`: `sa::PortWatch` and the SA client with membership checks),
/// for each thing an SM does to a running fabric: a link down and up, opensm restarted
/// (forgetting the groups), LIDs reassigned, a partition added, the master SM killed with a
/// standby in place. Nobody raises an event by hand.
#[test]
fn a_simulated_port_raises_what_the_sm_does_as_port_events() {
    let Some(mut f) = fabric("smport") else {
        return;
    };
    let (lid2, guid2) = f.port_of("Hca2");
    let gid2 = gid_of(guid2);

    // Once: the port as its SMA describes it is what ibstat reads.
    let (ok, text) = f.run("Hca2", &[BIN, "sa", "port"]);
    assert!(ok, "sa port: {text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("port "))
        .expect("port line");
    println!("{line}");
    assert_eq!(field(line, "state"), "Active");
    assert_eq!(field(line, "lid"), format!("{lid2:#x}"));
    assert_eq!(field(line, "sm_lid"), "0x1");
    assert_eq!(field(line, "gid"), gid2);
    assert_eq!(field(line, "pkeys"), "0xffff");

    let (mut held, mut out, _err) = f.spawn("Hca2", &[BIN, "sa", "port", "--join"]);
    let expect = |out: &mut Lines, what: &str| {
        let t = Instant::now();
        assert!(out.wait_for(what, LIMIT), "no {what:?}: {:?}", out.seen());
        println!("{what:?} after {:?}", t.elapsed());
    };
    expect(&mut out, "joined mgid ff12:401b:ffff::ffff:ffff");
    f.expect_member(&gid2, true, "after the join");

    // The link down and up: PORT_ERR, then PORT_ACTIVE once the SM made it active again.
    f.sim("Unlink \"Hca2\"");
    expect(&mut out, "port event PORT_ERR");
    f.sim("ReLink \"Hca2\"");
    expect(&mut out, "port event PORT_ACTIVE");
    expect(&mut out, "joined mgid");

    // opensm restarted forgets the membership; the port finds it lost and re-registers.
    f.stop_opensm();
    f.start_opensm("osm2.log");
    expect(&mut out, "membership lost");
    expect(&mut out, "port event CLIENT_REREGISTER");
    expect(&mut out, "joined mgid");
    f.expect_member(&gid2, true, "after the re-registration");

    // LIDs reassigned (the SM's guid2lid moves Hca2 to 0x20): LID_CHANGE with the new LID.
    f.stop_opensm();
    let g2l = f.dir.join("guid2lid");
    let table = std::fs::read_to_string(&g2l).expect("guid2lid");
    let moved: String = table
        .lines()
        .map(|l| {
            if l.split_whitespace()
                .next()
                .and_then(|g| u64::from_str_radix(g.trim_start_matches("0x"), 16).ok())
                == Some(guid2)
            {
                format!("{guid2:#018x} 0x0020 0x0020\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    assert_ne!(moved, table, "Hca2 not in guid2lid: {table}");
    std::fs::write(&g2l, moved).expect("guid2lid");
    f.start_opensm("osm3.log");
    expect(&mut out, "port event LID_CHANGE");
    assert!(
        out.wait_for("state Active lid 0x20 ", LIMIT),
        "the port after LID_CHANGE: {:?}",
        out.seen()
    );
    assert_eq!(f.port_of("Hca2").0, 0x20);
    f.expect_member(&gid2, true, "after the LID change");

    // A second partition: PKEY_CHANGE, the port's table holds it.
    let parts = f.dir.join("partitions.conf");
    std::fs::write(
        &parts,
        "Default=0x7fff, ipoib : ALL=full;\npart2=0x8002, ipoib : ALL=full;\n",
    )
    .expect("partitions.conf");
    f.stop_opensm();
    f.start_opensm_with("osm4.log", &["-P", parts.to_str().expect("utf-8")]);
    expect(&mut out, "port event PKEY_CHANGE");
    assert!(
        out.wait_for("pkeys 0xffff,0x8002", LIMIT),
        "{:?}",
        out.seen()
    );
    f.expect_member(&gid2, true, "after the partition change");

    // Failover: a standby on Hca3 polling fast; the master killed: SM_CHANGE to Hca3's LID.
    let fast = f.dir.join("fast.conf");
    std::fs::write(
        &fast,
        "sminfo_polling_timeout 500\npolling_retry_number 2\n",
    )
    .expect("opensm config");
    let fast = fast.to_str().expect("utf-8").to_owned();
    f.stop_opensm();
    f.start_opensm_with("osm5.log", &["-p", "10", "-F", &fast]);
    let (mut standby, mut sb) = f.spawn_sm(
        "Hca3",
        "osm-standby.log",
        &["-s", "0", "-p", "5", "-F", &fast],
    );
    assert!(
        sb.wait_for("Entering STANDBY state", LIMIT),
        "standby: {:?}",
        sb.seen()
    );
    let (lid3, _) = f.port_of("Hca3");
    f.stop_opensm();
    assert!(
        sb.wait_for("Entering MASTER state", LIMIT),
        "takeover: {:?}",
        sb.seen()
    );
    expect(&mut out, "port event SM_CHANGE");
    assert!(
        out.wait_for(&format!("sm_lid {lid3:#x}"), LIMIT),
        "{:?}",
        out.seen()
    );
    expect(&mut out, "joined mgid");

    signal(held.id(), "-TERM");
    expect(&mut out, "left mgid");
    assert!(wait_within(&mut held, LIMIT).success());
    signal(standby.id(), "-TERM");
    wait_within(&mut standby, LIMIT);
}
