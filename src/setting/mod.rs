//! Reading settings, shared by the daemon's configuration and the tools' flags: a value as
//! the user gave it ([`Given`]: a flag's text or a file key's TOML value) and the one parse of
//! each value type ([`Setting`]), bounds checks whose errors name the flag or key
//! ([`ConfigError`], [`pick_int`], [`pick_duration`]), durations ([`parse_duration`]), the
//! fault-injection flags declared once ([`FaultFlags`]) and how a declared setting is
//! documented ([`SettingDoc`], [`settings_table`], [`example_config`]).
//!
//! On `verbs` (path MTUs), `wire` (hardware addresses) and `soft` (fault injection).

mod doc;
mod duration;
mod error;
mod faults;
mod given;
mod read;

pub use self::doc::{example_config, settings_table, SettingDoc, Shown};
pub use self::duration::{format_duration, parse_duration, DurationError, FileDuration};
pub use self::error::ConfigError;
pub(crate) use self::error::{os_message, Origin};
pub(crate) use self::faults::{fault_flags_of, with_fault_fields};
pub use self::faults::{FaultFlags, TEST_HELP_HEADING, TEST_SECTION};
pub(crate) use self::given::text_setting;
pub use self::given::{parse_path_mtu, Given, InvalidPathMtu, InvalidValue, Setting};
pub(crate) use self::read::{
    check_alias, duration_at_least, int_in, origin_of, parse, parse_list, switch,
};
pub use self::read::{pick_duration, pick_int};
