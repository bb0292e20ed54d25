//! The fault-injection flags of the tools ([`FaultFlags`]), read as the daemon reads its
//! `fault_*` settings.

use super::error::ConfigError;
use super::given::Given;
use super::value::{int_in, percentage};
use crate::soft::FaultConfig;

/// The `--help` heading of the flags only tests use (fault injection, provider quirks), kept
/// apart from the options a deployment sets.
pub const TEST_HELP_HEADING: &str =
    "Testing (fault injection and provider quirks; not for production)";

/// The fault-injection flags of the software provider for the tools, named and read as the
/// `fault_*` settings of `ipoib-cm up`; `#[command(flatten)]` it.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct FaultFlags {
    /// Percentage of sent packets the software provider drops.
    #[arg(long, value_name = "PCT", allow_negative_numbers = true, help_heading = TEST_HELP_HEADING)]
    pub fault_loss: Option<Given<f64>>,
    /// Percentage of sent packets the software provider reorders.
    #[arg(long, value_name = "PCT", allow_negative_numbers = true, help_heading = TEST_HELP_HEADING)]
    pub fault_reorder: Option<Given<f64>>,
    /// Percentage of sent packets the software provider duplicates.
    #[arg(long, value_name = "PCT", allow_negative_numbers = true, help_heading = TEST_HELP_HEADING)]
    pub fault_dup: Option<Given<f64>>,
    /// Percentage of sent packets the software provider corrupts.
    #[arg(long, value_name = "PCT", allow_negative_numbers = true, help_heading = TEST_HELP_HEADING)]
    pub fault_corrupt: Option<Given<f64>>,
    /// Seed of the fault RNG [default: 1].
    #[arg(long, value_name = "N", allow_negative_numbers = true, help_heading = TEST_HELP_HEADING)]
    pub fault_seed: Option<Given<i64>>,
}

impl FaultFlags {
    /// The flags' fault injection.
    ///
    /// # Errors
    /// A one-line [`ConfigError`] naming the flag.
    pub fn to_config(&self) -> Result<FaultConfig, ConfigError> {
        fault_config(
            self.fault_loss.as_ref(),
            self.fault_reorder.as_ref(),
            self.fault_dup.as_ref(),
            self.fault_corrupt.as_ref(),
            self.fault_seed.as_ref(),
        )
    }
}

/// The fault injection of the `fault_*` settings: percentages 0..=100 (0 when not given) and
/// a seed (1 when not given).
///
/// # Errors
/// A one-line [`ConfigError`] naming the flag or key.
pub(crate) fn fault_config(
    loss: Option<&Given<f64>>,
    reorder: Option<&Given<f64>>,
    dup: Option<&Given<f64>>,
    corrupt: Option<&Given<f64>>,
    seed: Option<&Given<i64>>,
) -> Result<FaultConfig, ConfigError> {
    Ok(FaultConfig {
        loss_pct: percentage("fault_loss", loss)?,
        reorder_pct: percentage("fault_reorder", reorder)?,
        dup_pct: percentage("fault_dup", dup)?,
        corrupt_pct: percentage("fault_corrupt", corrupt)?,
        seed: int_in("fault_seed", seed, 0, i64::MAX)?.map_or(1, |v| v as u64),
    })
}
