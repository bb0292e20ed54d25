//! `ipoib-cm sa port`: a port as its own SMA describes it, and the port events a watch of it
//! raises ([`crate::sa::PortWatch`]): what a simulated port (ibsim, through `umad2sim`)
//! learns instead of what an HCA's firmware would tell its driver.
//!
//! With `--join` it also holds the broadcast group through the SA client with membership
//! checks, and hands the client every port event, so a restarted SM's lost registrations
//! come back without anyone raising an event by hand.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::sa_args::{SaPortArgs, SaToolError};
use crate::sa::{
    GroupOptions, PortEvent, PortSnapshot, PortWatch, PortWatchConfig, SaClient, SaConfig, SaEvent,
};
use crate::sys::umad::{AgentSpec, Umad, UmadPort, UmadRecv};
use crate::wire::cm::MAD_LEN;
use crate::wire::sa::{SA_CLASS_VERSION, SA_MGMT_CLASS};
use crate::wire::smp::{SMI_CLASS_VERSION, SMI_DIRECTED_ROUTE};
use crate::wire::GSI_QKEY;

/// Most MADs read from one agent per turn.
const READ_BATCH: usize = 64;

/// Longest wait for a MAD in one turn.
const TURN: Duration = Duration::from_millis(10);

/// `ipoib-cm sa port`'s options.
#[derive(Debug, Clone, clap::Args)]
pub struct PortArgs {
    #[command(flatten)]
    pub port: SaPortArgs,
    /// Keep watching until SIGINT/SIGTERM, printing each port event and the port after it.
    #[arg(long)]
    pub watch: bool,
    /// Also hold the broadcast group (implies --watch): joined through the SA, checked
    /// every --check, joined again on each port event; left at SIGINT/SIGTERM.
    #[arg(long)]
    pub join: bool,
    /// Time between two reads of the port.
    #[arg(long, value_name = "DURATION", default_value = "250ms", value_parser = humantime::parse_duration)]
    pub period: Duration,
    /// Time between two membership checks of the held group.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = humantime::parse_duration)]
    pub check: Duration,
}

/// Runs `sa port`.
///
/// # Errors
///
/// [`SaToolError`] as it says.
pub(super) fn run(args: &PortArgs) -> Result<(), SaToolError> {
    let found =
        UmadPort::find(args.port.ca.as_deref(), args.port.port).map_err(SaToolError::NoPort)?;
    let open = |spec: &AgentSpec| {
        Umad::open_agent(found.umad, spec).map_err(|e| {
            let (step, source) = e.into_step();
            SaToolError::Agent {
                umad: found.umad,
                step,
                source,
            }
        })
    };
    let smi = open(&AgentSpec::smi(SMI_DIRECTED_ROUTE, SMI_CLASS_VERSION))?;
    let cfg = PortWatchConfig {
        period: args.period,
        ..PortWatchConfig::default()
    };
    let start = Instant::now();
    let mut watch = PortWatch::new(cfg, start);
    // The first read: the port as found.
    while watch.port().is_none() {
        if start.elapsed() > args.port.timeout {
            return Err(SaToolError::NoAnswer(args.port.timeout));
        }
        turn_watch(&mut watch, &smi, args.port.dump)?;
    }
    let snapshot = watch.port().cloned().unwrap_or_else(|| unreachable!());
    print_port(&found.ca, found.port, &snapshot);
    if !args.watch && !args.join {
        return Ok(());
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .map_err(SaToolError::io("signal handler"))?;
    }
    let mut sa = if args.join {
        let umad = open(&AgentSpec::client(SA_MGMT_CLASS, SA_CLASS_VERSION))?;
        let mut c = SaConfig::new(snapshot.gid(), args.port.pkey);
        c.membership_check = Some(args.check);
        let mut client = SaClient::new(c, snapshot.sm());
        let bcast = client.broadcast_mgid();
        client.join(Instant::now(), bcast, GroupOptions::default());
        Some((client, umad))
    } else {
        None
    };
    let mut leave_by: Option<Instant> = None;
    loop {
        turn_watch(&mut watch, &smi, args.port.dump)?;
        let now = Instant::now();
        while let Some(ev) = watch.pop_event() {
            println!("port event {}", ibv_name(ev));
            if let Some(p) = watch.port() {
                print_port(&found.ca, found.port, p);
            }
            if let Some((client, _)) = sa.as_mut() {
                client.port_event(now, ev);
            }
        }
        let Some((client, umad)) = sa.as_mut() else {
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            continue;
        };
        for ev in turn_sa(client, umad)? {
            match ev {
                SaEvent::Joined { mgid, params: p } => println!(
                    "joined mgid {mgid} mlid {:#x} qkey {:#x} mtu {}",
                    p.mlid,
                    p.qkey,
                    p.mtu.map_or(0, |m| m.bytes())
                ),
                SaEvent::JoinFailed { mgid, status } => {
                    println!("join failed mgid {mgid} status {status:?}");
                }
                SaEvent::MembershipLost { mgid } => {
                    println!("membership lost mgid {mgid}");
                    watch.reregister_inferred();
                }
                SaEvent::Left { mgid, deleted } => {
                    println!("left mgid {mgid} deleted {deleted}");
                    return Ok(());
                }
                SaEvent::PathResolved { .. } | SaEvent::PathFailed { .. } => {}
            }
        }
        if stop.load(Ordering::Relaxed) {
            match leave_by {
                None => {
                    leave_by = Some(now + Duration::from_secs(10));
                    let bcast = client.broadcast_mgid();
                    client.leave(now, bcast);
                }
                // A leave ends in `Left` within the client's retries; this bounds it anyway.
                Some(t) if now >= t => return Ok(()),
                Some(_) => {}
            }
        }
    }
}

/// One turn of the watch: its SMPs out, at most [`TURN`] for an answer, its timers.
fn turn_watch(watch: &mut PortWatch, smi: &Umad, dump: bool) -> Result<(), SaToolError> {
    while let Some(smp) = watch.pop_transmit() {
        smi.send_smp_local(&smp)
            .map_err(SaToolError::io("umad send"))?;
    }
    let wait = watch
        .next_deadline()
        .saturating_duration_since(Instant::now())
        .min(TURN);
    if smi
        .wait_readable(wait)
        .map_err(SaToolError::io("umad poll"))?
    {
        let mut m = [0u8; MAD_LEN];
        for _ in 0..READ_BATCH {
            match smi.recv(&mut m).map_err(SaToolError::io("umad recv"))? {
                Some(UmadRecv::Mad(_)) => {
                    if dump {
                        println!(
                            "smp {}",
                            m.iter().map(|b| format!("{b:02x}")).collect::<String>()
                        );
                    }
                    watch.handle_mad(Instant::now(), &m);
                }
                Some(UmadRecv::SendFailed(status)) => {
                    tracing::debug!(status, "umad: SMP send reported failed");
                }
                None => break,
            }
        }
    }
    watch.poll_timeout(Instant::now());
    Ok(())
}

/// One turn of the SA client: its MADs out, what arrived in, its timers; its events.
fn turn_sa(client: &mut SaClient, umad: &Umad) -> Result<Vec<SaEvent>, SaToolError> {
    while let Some(o) = client.pop_transmit() {
        umad.send_request(&o.mad, o.to.lid, o.to.sl, GSI_QKEY)
            .map_err(SaToolError::io("umad send"))?;
    }
    let mut m = [0u8; MAD_LEN];
    for _ in 0..READ_BATCH {
        match umad.recv(&mut m).map_err(SaToolError::io("umad recv"))? {
            Some(UmadRecv::Mad(_)) => client.handle_mad(Instant::now(), &m),
            Some(UmadRecv::SendFailed(_)) => {}
            None => break,
        }
    }
    let now = Instant::now();
    if client.next_deadline().is_some_and(|d| d <= now) {
        client.poll_timeout(now);
    }
    Ok(std::iter::from_fn(|| client.pop_event()).collect())
}

fn print_port(ca: &str, port: u8, p: &PortSnapshot) {
    let pkeys: Vec<String> = p.pkey_table.iter().map(|k| format!("{k:#06x}")).collect();
    println!(
        "port {ca} {port} state {:?} lid {:#x} lmc {} sm_lid {:#x} sm_sl {} mtu {} gid {} pkeys {}",
        p.info.state,
        p.info.lid,
        p.info.lmc,
        p.info.sm_lid,
        p.info.sm_sl,
        p.mtu().map_or(0, |m| m.bytes()),
        p.gid(),
        pkeys.join(","),
    );
}

/// The `ibv_event_type` name of a port event.
fn ibv_name(ev: PortEvent) -> &'static str {
    match ev {
        PortEvent::LidChange => "LID_CHANGE",
        PortEvent::SmChange(_) => "SM_CHANGE",
        PortEvent::ClientReregister => "CLIENT_REREGISTER",
        PortEvent::PkeyChange => "PKEY_CHANGE",
        PortEvent::PortDown => "PORT_ERR",
        PortEvent::PortUp(_) => "PORT_ACTIVE",
    }
}
