//! The README's settings table and the example config, made from the declaration of
//! [`Settings`] (`ipoib-cm generate settings DIR` writes both into a source tree).

use std::path::Path;

use super::settings::Settings;
use crate::setting::SettingDoc;

/// The line before the README's settings table.
pub const README_BEGIN: &str =
    "<!-- settings table: made by `ipoib-cm generate settings .` from src/daemon/config/settings.rs -->";
/// The line after the README's settings table.
pub const README_END: &str = "<!-- end of settings table -->";

/// The example config, relative to the source tree.
pub const EXAMPLE_CONFIG: &str = "contrib/ipoib-cm.example.toml";

/// The first lines of the example config.
const EXAMPLE_HEADER: &[&str] = &[
    "ipoib-cm example configuration: `ipoib-cm up --config FILE`, or /etc/ipoib-cm/IFNAME.toml",
    "for the systemd unit ipoib-cm@IFNAME.service. Made by `ipoib-cm generate settings .` from",
    "src/daemon/config/settings.rs.",
    "",
    "Every key is the flag of the same name with `_` for `-` (`rx_timeout` is `--rx-timeout`);",
    "a flag given on the command line wins over the key, and a repeatable flag given at least once",
    "replaces the key's whole list. Lines starting with `# key =` show a key with an example value",
    "(the default where there is one); remove the `# ` to set it. DURATION is text such as",
    "\"500ms\", \"1.5s\", \"1m30s\", or an integer number of seconds.",
];

fn docs() -> &'static [SettingDoc] {
    Settings::docs()
}

/// The README's settings table (Markdown, one row per flag and key).
pub fn settings_table() -> String {
    let up = <Settings as clap::Args>::augment_args(clap::Command::new("up"));
    crate::setting::settings_table(docs(), &up)
}

/// The example config file, every key shown once.
pub fn example_config() -> String {
    crate::setting::example_config(EXAMPLE_HEADER, docs())
}

/// `readme` with the text between [`README_BEGIN`] and [`README_END`] replaced by `table`;
/// `None` without both markers.
pub fn with_settings_table(readme: &str, table: &str) -> Option<String> {
    let begin = readme.find(README_BEGIN)? + README_BEGIN.len();
    let end = begin + readme[begin..].find(README_END)?;
    Some(format!("{}\n{table}{}", &readme[..begin], &readme[end..]))
}

/// Writes the settings table into `root`/README.md and the example config into
/// `root`/[`EXAMPLE_CONFIG`].
///
/// # Errors
/// A file could not be read or written, or the README lacks the markers
/// ([`std::io::ErrorKind::InvalidData`]).
pub fn write_settings(root: &Path) -> std::io::Result<()> {
    let readme_path = root.join("README.md");
    let readme = std::fs::read_to_string(&readme_path)?;
    let readme = with_settings_table(&readme, &settings_table()).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("README.md has no lines {README_BEGIN:?} and {README_END:?}"),
        )
    })?;
    std::fs::write(readme_path, readme)?;
    std::fs::write(root.join(EXAMPLE_CONFIG), example_config())
}
