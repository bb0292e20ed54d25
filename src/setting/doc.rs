//! How settings are documented from their one declaration: each field's doc comment (its
//! meaning, with its bounds and `[default: ...]`) and [`Shown`] (its example), made into the
//! README's settings table ([`settings_table`]) and the example config file
//! ([`example_config`]).

use std::fmt::Write as _;

/// How a setting is shown beside its doc: its example value, whether the example config sets
/// it, the section it starts, the key it is a file-only alias of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shown {
    /// The value of the `key = value` line in the example config, as TOML.
    pub example: &'static str,
    /// The example config sets it (else the line is commented out).
    pub set: bool,
    /// The heading of the example config's section this setting starts.
    pub section: Option<&'static str>,
    /// The key this one is an older, file-only spelling of (shown in that key's row).
    pub alias_of: Option<&'static str>,
    /// A flag only, no key of the file (`--config`).
    pub flag_only: bool,
}

impl Shown {
    /// Shown commented out with `example` (the default, where there is one).
    pub const fn example(example: &'static str) -> Self {
        Self {
            example,
            set: false,
            section: None,
            alias_of: None,
            flag_only: false,
        }
    }

    /// A flag that is no key of the file (`--config`).
    pub const fn flag_only() -> Self {
        Self {
            flag_only: true,
            ..Self::example("")
        }
    }

    /// Set in the example config.
    pub const fn set(self) -> Self {
        Self { set: true, ..self }
    }

    /// Starts the section `heading`.
    pub const fn section(self, heading: &'static str) -> Self {
        Self {
            section: Some(heading),
            ..self
        }
    }

    /// A file-only alias of `key`.
    pub const fn alias_of(self, key: &'static str) -> Self {
        Self {
            alias_of: Some(key),
            ..self
        }
    }
}

/// One setting as its declaration documents it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SettingDoc {
    /// The config key (the field's name).
    pub key: &'static str,
    /// The lines of the field's doc comment.
    pub doc: &'static [&'static str],
    /// How it is shown.
    pub shown: Shown,
}

impl SettingDoc {
    /// The doc as paragraphs of one line each.
    pub fn paragraphs(&self) -> Vec<String> {
        let mut paras = vec![String::new()];
        for line in self.doc {
            let line = line.strip_prefix(' ').unwrap_or(line).trim_end();
            if line.is_empty() {
                paras.push(String::new());
                continue;
            }
            if let Some(last) = paras.last_mut() {
                if !last.is_empty() {
                    last.push(' ');
                }
                last.push_str(line);
            }
        }
        paras.retain(|p| !p.is_empty());
        paras
    }

    /// The meaning: the doc without its `[default: ...]`, one line.
    pub fn meaning(&self) -> String {
        let text = self.paragraphs().join(" ");
        match default_span(&text) {
            Some((start, end)) => {
                let mut s = text[..start].trim_end().to_owned();
                s.push_str(&text[end..]);
                s.trim().to_owned()
            }
            None => text,
        }
    }

    /// What the doc's `[default: ...]` says, if it says.
    pub fn default_text(&self) -> Option<String> {
        let text = self.paragraphs().join(" ");
        default_span(&text).map(|(start, end)| text[start + "[default: ".len()..end - 1].to_owned())
    }
}

/// The byte span of the `[default: ...]` in `text` (brackets balanced).
fn default_span(text: &str) -> Option<(usize, usize)> {
    let start = text.find("[default: ")?;
    let mut depth = 0usize;
    for (i, c) in text[start..].char_indices() {
        match c {
            '[' => depth += 1,
            ']' => {
                depth -= 1;
                if depth == 0 {
                    return Some((start, start + i + 1));
                }
            }
            _ => {}
        }
    }
    None
}

/// How a flag is written in the table: `--long VALUE`, or `--long` for a switch.
fn flag_form(arg: &clap::Arg) -> String {
    let long = arg.get_long().unwrap_or_default();
    if arg.get_num_args().is_some_and(|n| n.max_values() == 0) {
        return format!("--{long}");
    }
    match arg.get_value_names() {
        Some(names) if !names.is_empty() => {
            let names: Vec<&str> = names.iter().map(|n| n.as_str()).collect();
            format!("--{long} {}", names.join(" "))
        }
        _ => format!("--{long}"),
    }
}

/// Escapes the column separator of a Markdown table.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// The Markdown table of `settings` (flag, key, default, meaning), one row per setting that
/// is not an alias; `command` holds their flags (the subcommand the settings are flattened
/// into). Ends with a newline.
pub fn settings_table(settings: &[SettingDoc], command: &clap::Command) -> String {
    let mut out = String::from("| flag | key | default | meaning |\n|---|---|---|---|\n");
    for s in settings.iter().filter(|s| s.shown.alias_of.is_none()) {
        let flag = command
            .get_arguments()
            .find(|a| a.get_id().as_str() == s.key && a.get_long().is_some())
            .map(|a| format!("`{}`", flag_form(a)))
            .unwrap_or_default();
        let mut key = if s.shown.flag_only {
            String::new()
        } else {
            format!("`{}`", s.key)
        };
        let aliases: Vec<String> = settings
            .iter()
            .filter(|a| a.shown.alias_of == Some(s.key))
            .map(|a| format!("`{}`", a.key))
            .collect();
        if !aliases.is_empty() {
            let _ = write!(key, " (or {})", aliases.join(", "));
        }
        let default = s.default_text().unwrap_or_default();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            cell(&flag),
            cell(&key),
            cell(&default),
            cell(&s.meaning())
        );
    }
    out
}

/// Wraps `text` into `# ` comment lines of at most `width` characters.
fn comment(text: &str, width: usize, out: &mut String) {
    let mut line = String::from("#");
    for word in text.split_whitespace() {
        if line.len() > 1 && line.chars().count() + 1 + word.chars().count() > width {
            out.push_str(&line);
            out.push('\n');
            line = String::from("#");
        }
        line.push(' ');
        line.push_str(word);
    }
    if line.len() > 1 {
        out.push_str(&line);
        out.push('\n');
    }
}

/// Width of the example config's lines.
const WIDTH: usize = 100;

/// The example config file: `header` (comment lines, without `# `), then per section a
/// heading and per setting its doc as a comment and its `key = example` line (commented out
/// unless [`Shown::set`]); an alias follows its key.
pub fn example_config(header: &[&str], settings: &[SettingDoc]) -> String {
    let mut out = String::new();
    for line in header {
        if line.is_empty() {
            out.push_str("#\n");
        } else {
            let _ = writeln!(out, "# {line}");
        }
    }
    for s in settings.iter().filter(|s| !s.shown.flag_only) {
        if let Some(heading) = s.shown.section {
            let mut rule = format!("\n# --- {heading} ");
            while rule.chars().count() < WIDTH + 1 {
                rule.push('-');
            }
            let _ = writeln!(out, "{rule}");
        }
        if s.shown.alias_of.is_none() {
            out.push('\n');
        }
        for para in s.paragraphs() {
            comment(&para, WIDTH, &mut out);
        }
        let prefix = if s.shown.set { "" } else { "# " };
        let _ = writeln!(out, "{prefix}{} = {}", s.key, s.shown.example);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: SettingDoc = SettingDoc {
        key: "rx_timeout",
        doc: &[
            " Reap RX connections idle this long, at least 1s",
            " [default: 60s].",
            "",
            " A second paragraph | with a bar.",
        ],
        shown: Shown::example("\"60s\"").section("Connections"),
    };
    const SWITCH: SettingDoc = SettingDoc {
        key: "no_srq",
        doc: &[" Per-QP receive rings."],
        shown: Shown::example("false"),
    };
    const ALIAS: SettingDoc = SettingDoc {
        key: "srq",
        doc: &[" The opposite sense."],
        shown: Shown::example("true").alias_of("no_srq"),
    };
    const SET: SettingDoc = SettingDoc {
        key: "bind",
        doc: &[" Underlay address [default: [none]]."],
        shown: Shown::example("\"198.18.0.1\"").set(),
    };

    #[test]
    fn the_doc_splits_into_meaning_and_default() {
        assert_eq!(
            TIMEOUT.paragraphs(),
            [
                "Reap RX connections idle this long, at least 1s [default: 60s].",
                "A second paragraph | with a bar."
            ]
        );
        assert_eq!(TIMEOUT.default_text().as_deref(), Some("60s"));
        assert_eq!(
            TIMEOUT.meaning(),
            "Reap RX connections idle this long, at least 1s. A second paragraph | with a bar."
        );
        assert_eq!(SET.default_text().as_deref(), Some("[none]"));
        assert_eq!(SWITCH.default_text(), None);
    }

    #[test]
    fn the_table_has_a_row_per_key_with_its_aliases() {
        let cmd = clap::Command::new("up")
            .arg(
                clap::Arg::new("rx_timeout")
                    .long("rx-timeout")
                    .value_name("DURATION"),
            )
            .arg(clap::Arg::new("no_srq").long("no-srq").num_args(0));
        let table = settings_table(&[TIMEOUT, SWITCH, ALIAS], &cmd);
        assert_eq!(
            table.lines().collect::<Vec<_>>(),
            [
                "| flag | key | default | meaning |",
                "|---|---|---|---|",
                "| `--rx-timeout DURATION` | `rx_timeout` | 60s | Reap RX connections idle this long, at least 1s. A second paragraph \\| with a bar. |",
                "| `--no-srq` | `no_srq` (or `srq`) |  | Per-QP receive rings. |",
            ]
        );
    }

    #[test]
    fn the_example_comments_each_key_and_sets_only_the_set_ones() {
        let text = example_config(&["Header.", ""], &[TIMEOUT, SWITCH, ALIAS, SET]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[..3], ["# Header.", "#", ""]);
        assert!(lines[3].starts_with("# --- Connections ---"), "{text}");
        assert_eq!(lines[3].chars().count(), WIDTH);
        assert!(lines.contains(&"# rx_timeout = \"60s\""), "{text}");
        assert!(lines.contains(&"bind = \"198.18.0.1\""), "{text}");
        // An alias follows its key without a blank line.
        let srq = lines.iter().position(|l| *l == "# srq = true").unwrap();
        assert_eq!(lines[srq - 2], "# no_srq = false");
        assert!(lines.iter().all(|l| l.chars().count() <= WIDTH), "{text}");
    }
}
