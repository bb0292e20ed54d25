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
    GroupOptions, PortEvent, PortSnapshot, PortWatchConfig, SaClient, SaConfig, SaEvent,
};
use crate::soft::sim_port::SimPort;
use crate::sys::umad::{AgentSpec, Umad, UmadPort, UmadRecv};
use crate::wire::cm::MAD_LEN;
use crate::wire::sa::{SA_CLASS_VERSION, SA_MGMT_CLASS};
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
    let (ca, port) = (args.port.ca.as_deref(), args.port.port);
    let cfg = PortWatchConfig {
        period: args.period,
        ..PortWatchConfig::default()
    };
    // The port as found (the first read).
    let (mut sp, _) = SimPort::open_with(ca, port, cfg, args.port.timeout)?;
    let (dev, num) = sp.device();
    let snapshot = sp
        .port()
        .cloned()
        .ok_or(SaToolError::NoAnswer(args.port.timeout))?;
    print_port(&dev, num, &snapshot);
    if !args.watch && !args.join {
        return Ok(());
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .map_err(SaToolError::io("signal handler"))?;
    }
    let mut sa = if args.join {
        let found = UmadPort::find(Some(&dev), Some(num)).map_err(SaToolError::NoPort)?;
        let umad = Umad::open_agent(
            found.umad,
            &AgentSpec::client(SA_MGMT_CLASS, SA_CLASS_VERSION),
        )
        .map_err(|e| {
            let (step, source) = e.into_step();
            SaToolError::Agent {
                umad: found.umad,
                step,
                source,
            }
        })?;
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
        sp.wait(Instant::now(), TURN)
            .map_err(SaToolError::io("umad poll"))?;
        let now = Instant::now();
        sp.turn(now);
        while let Some(ev) = sp.watch_mut().pop_event() {
            println!("port event {}", ibv_name(ev));
            if let Some(p) = sp.port() {
                print_port(&dev, num, p);
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
                    sp.watch_mut().reregister_inferred();
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
