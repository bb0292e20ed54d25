//! The fault-injection settings of the software provider, declared once
//! ([`with_fault_fields!`](crate::setting::with_fault_fields)): the tools' [`FaultFlags`] and
//! the `fault_*` fields of the daemon's settings are both made of that declaration.

use super::error::ConfigError;
use super::read::{int_in, parse, percentage};
use crate::soft::FaultConfig;

/// The `--help` heading of the flags only tests use (fault injection, provider quirks), kept
/// apart from the options a deployment sets.
pub const TEST_HELP_HEADING: &str =
    "Testing (fault injection and provider quirks; not for production)";

/// The section of the example config that holds the settings only tests use.
pub const TEST_SECTION: &str = "Testing only: fault injection and provider quirks";

/// Hands the declaration of the six `fault_*` settings to `$callback!` between `$before`
/// and `$after`: `$callback! { $before FIELDS $after }`, each field in the form of the
/// daemon's settings list (`doc, attributes, pub NAME: TYPE [how it is shown],`).
macro_rules! with_fault_fields {
    ($callback:ident! { $($before:tt)* } $({ $($after:tt)* })?) => {
        $callback! {
            $($before)*
            /// Percentage of sent packets the software provider drops, 0..=100 [default: 0.0].
            #[arg(long, value_name = "PCT", allow_negative_numbers = true, help_heading = $crate::setting::TEST_HELP_HEADING)]
            pub fault_loss: Option<$crate::setting::Given<f64>>
                [$crate::setting::Shown::example("0.0").section($crate::setting::TEST_SECTION)],
            /// Percentage of sent packets the software provider reorders, 0..=100 [default: 0.0].
            #[arg(long, value_name = "PCT", allow_negative_numbers = true, help_heading = $crate::setting::TEST_HELP_HEADING)]
            pub fault_reorder: Option<$crate::setting::Given<f64>>
                [$crate::setting::Shown::example("0.0")],
            /// Percentage of sent packets the software provider duplicates, 0..=100
            /// [default: 0.0].
            #[arg(long, value_name = "PCT", allow_negative_numbers = true, help_heading = $crate::setting::TEST_HELP_HEADING)]
            pub fault_dup: Option<$crate::setting::Given<f64>>
                [$crate::setting::Shown::example("0.0")],
            /// Percentage of sent packets the software provider corrupts, 0..=100
            /// [default: 0.0].
            #[arg(long, value_name = "PCT", allow_negative_numbers = true, help_heading = $crate::setting::TEST_HELP_HEADING)]
            pub fault_corrupt: Option<$crate::setting::Given<f64>>
                [$crate::setting::Shown::example("0.0")],
            /// Seed of the fault RNG [default: 1].
            #[arg(long, value_name = "N", allow_negative_numbers = true, help_heading = $crate::setting::TEST_HELP_HEADING)]
            pub fault_seed: Option<$crate::setting::Given<i64>>
                [$crate::setting::Shown::example("1")],
            /// The software device reports IBV_EVENT_DEVICE_FATAL this long after it starts,
            /// once, and fails every verb until it is opened again [default: never].
            #[arg(long, value_name = "DURATION", allow_negative_numbers = true, help_heading = $crate::setting::TEST_HELP_HEADING)]
            pub fault_device_fatal_after: Option<$crate::setting::Given<std::time::Duration>>
                [$crate::setting::Shown::example("\"10s\"")],
            $($($after)*)?
        }
    };
}
pub(crate) use with_fault_fields;

/// Makes a struct of fields in the form [`with_fault_fields!`] hands out, with the derives
/// a set of flags needs, and [`FaultFlags::to_config`]'s counterpart on it.
macro_rules! fault_flags_struct {
    ($(#[$meta:meta])* pub struct $name:ident;
     $($(#[$($fmeta:tt)*])* pub $field:ident: $ty:ty [$shown:expr],)*) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Default, PartialEq, clap::Args)]
        pub struct $name {
            $($(#[$($fmeta)*])* pub $field: $ty,)*
        }
    };
}

with_fault_fields!(fault_flags_struct! {
    /// The fault-injection flags of the software provider for the tools, named and read as
    /// the `fault_*` settings of `ipoib-cm up`; `#[command(flatten)]` it.
    pub struct FaultFlags;
});

/// Copies the `fault_*` fields of a struct that has them (as the daemon's settings do,
/// made by [`with_fault_fields!`]) into [`FaultFlags`].
macro_rules! fault_flags_of {
    (@from $from:ident; $($(#[$($fmeta:tt)*])* pub $field:ident: $ty:ty [$shown:expr],)*) => {
        $crate::setting::FaultFlags {
            $($field: $from.$field.clone(),)*
        }
    };
}
pub(crate) use fault_flags_of;

impl FaultFlags {
    /// The flags' fault injection: percentages 0..=100 (0 when not given) and a seed (1 when
    /// not given).
    ///
    /// # Errors
    /// A one-line [`ConfigError`] naming the flag or key.
    pub fn to_config(&self) -> Result<FaultConfig, ConfigError> {
        Ok(FaultConfig {
            loss_pct: percentage("fault_loss", self.fault_loss.as_ref())?,
            reorder_pct: percentage("fault_reorder", self.fault_reorder.as_ref())?,
            dup_pct: percentage("fault_dup", self.fault_dup.as_ref())?,
            corrupt_pct: percentage("fault_corrupt", self.fault_corrupt.as_ref())?,
            seed: int_in("fault_seed", self.fault_seed.as_ref(), 0, i64::MAX)?
                .map_or(1, |v| v as u64),
            device_fatal_after: parse(
                "fault_device_fatal_after",
                self.fault_device_fatal_after.as_ref(),
            )?,
        })
    }
}
