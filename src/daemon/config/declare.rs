//! The macro that makes the settings of `ipoib-cm up` from one declaration per setting.
//!
//! A setting is declared once, in [`Settings`](super::Settings)' list:
//!
//! ```text
//! /// Meaning, bounds and [default: X]: the --help text, README row and example comment.
//! #[arg(long, value_name = "N")]
//! pub multicast_ttl: Option<Given<i64>> [Shown::example("1")]
//!     => multicast_ttl: u8 = int(1..=255u8).or(DEFAULT_MULTICAST_TTL),
//! ```
//!
//! which makes the field of `Settings` (the flag and the key), its line of `Settings::over`
//! (flag over file), its entry of `Settings::docs` (README table, example config), its field
//! of `Config` (after `=>`) and the line of `validate` that resolves it by its [`Rule`]
//! (`super::rules::Rule`). A field without `=>` is read by another's rule (an alias). The
//! rules run in declaration order, so a rule may use the values resolved before it; the
//! `derived` entries (from several fields) run after all.

/// See the module doc.
macro_rules! settings {
    (@docs [$($d:literal)*] #[doc = $x:literal] $($rest:tt)*) => {
        settings!(@docs [$($d)* $x] $($rest)*)
    };
    (@docs [$($d:literal)*] #[$($other:tt)*] $($rest:tt)*) => {
        settings!(@docs [$($d)*] $($rest)*)
    };
    (@docs [$($d:literal)*]) => {
        &[$($d),*]
    };
    (
        validate($s:ident, $d:ident = $dinit:expr)
        derived {
            $($(#[doc = $ddoc:literal])* $dfield:ident: $dty:ty = $drule:expr,)*
        }
        $(#[$cmeta:meta])*
        pub struct Config {
            $($(#[doc = $xdoc:literal])* pub $xfield:ident: $xty:ty = $xinit:expr,)*
        }
        $(#[$meta:meta])*
        pub struct Settings;
        $(
            $(#[$($fattr:tt)*])*
            pub $field:ident: $ty:ty [$shown:expr]
            $(=> $(#[doc = $cdoc:literal])* $cfield:ident: $cty:ty = $rule:expr)?,
        )*
    ) => {
        $(#[$meta])*
        pub struct Settings {
            $($(#[$($fattr)*])* pub $field: $ty,)*
        }

        impl Settings {
            /// These settings (the command line) laid over `file`'s: each field given here
            /// wins, a repeatable one given at least once replaces the file's list.
            pub fn over(self, file: Self) -> Self {
                Self {
                    $($field: $crate::daemon::config::declare::Merge::merge(self.$field, file.$field),)*
                }
            }

            /// Every setting as its declaration documents it, in declaration order.
            pub fn docs() -> &'static [$crate::setting::SettingDoc] {
                const DOCS: &[$crate::setting::SettingDoc] = &[$($crate::setting::SettingDoc {
                    key: stringify!($field),
                    doc: settings!(@docs [] $(#[$($fattr)*])*),
                    shown: $shown,
                },)*];
                DOCS
            }
        }

        $(#[$cmeta])*
        pub struct Config {
            $($(
                #[doc = concat!("The setting [`", stringify!($field), "`](Settings::", stringify!($field), "), resolved.")]
                $(#[doc = $cdoc])*
                pub $cfield: $cty,
            )?)*
            $($(#[doc = $ddoc])* pub $dfield: $dty,)*
            $($(#[doc = $xdoc])* pub $xfield: $xty,)*
        }

        /// Validates merged settings into the [`Config`], with the defaults of the settings
        /// not given: each setting by its rule, in declaration order.
        fn validate($s: &Settings) -> Result<Config, $crate::setting::ConfigError> {
            use $crate::daemon::config::rules::Rule as _;
            let $d = $dinit;
            $($(
                let $cfield: $cty = ($rule).resolve(stringify!($field), &$s.$field)?;
            )?)*
            $(let $dfield: $dty = $drule?;)*
            Ok(Config {
                $($($cfield,)?)*
                $($dfield,)*
                $($xfield: $xinit,)*
            })
        }
    };
}
pub(super) use settings;

/// How a field of the command line is laid over the same field of the file.
pub(super) trait Merge {
    /// `flag` if it was given, else `file`.
    fn merge(flag: Self, file: Self) -> Self;
}

/// A single value: the flag's if given.
impl<T> Merge for Option<T> {
    fn merge(flag: Self, file: Self) -> Self {
        flag.or(file)
    }
}

/// A repeatable value: the flags given at least once replace the file's whole list.
impl<T> Merge for Vec<T> {
    fn merge(flag: Self, file: Self) -> Self {
        if flag.is_empty() {
            file
        } else {
            flag
        }
    }
}
