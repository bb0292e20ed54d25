//! The port and partition options every `ipoib-cm sa …` command takes.

use std::time::Duration;

/// Which port and partition.
#[derive(Debug, Clone, clap::Args)]
pub struct SaPortArgs {
    /// The device (default: the first umad port's).
    #[arg(long, value_name = "CA")]
    pub ca: Option<String>,
    /// The port number.
    #[arg(long, value_name = "N")]
    pub port: Option<u8>,
    /// The partition key.
    #[arg(long, value_name = "PKEY", default_value = "0xffff", value_parser = parse_pkey)]
    pub pkey: u16,
    /// Print every MAD received as hex.
    #[arg(long)]
    pub dump: bool,
    /// Give up after this long.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

fn parse_pkey(s: &str) -> Result<u16, String> {
    let h = s.strip_prefix("0x").unwrap_or(s);
    u16::from_str_radix(h, 16).map_err(|e| format!("{s}: {e}"))
}
