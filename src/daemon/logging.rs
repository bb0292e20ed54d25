//! The daemon's log: one line per event on stderr, with its level, as text or JSON
//! (`--log-format`), and without a timestamp of its own when stderr is the systemd journal
//! (which stamps every line itself).
//!
//! Warnings and errors are rate-limited where they are written ([`LineBudget`]): each place
//! in the code that writes one logs at most 20 lines per 10 s (the budget of the connection
//! events' log lines), and what it had beyond that is one line with the count
//! ([`report_suppressed`]), so nothing a peer, the network or the kernel does once per packet
//! can write a line per packet.

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{reload, EnvFilter, Registry};

use crate::driver::event_log::{EventLog, Verdict, EVENT_LOG_WINDOW};
use crate::ipoib::ParseChoiceError;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LogFormat {
    /// `TIMESTAMP LEVEL target: message key=value ...`.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and the fields.
    Json,
}

impl LogFormat {
    /// `text` or `json`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Json => "json",
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LogFormat {
    type Err = ParseChoiceError;
    fn from_str(s: &str) -> Result<Self, ParseChoiceError> {
        match s {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            _ => Err(ParseChoiceError::new("\"text\" or \"json\"", s)),
        }
    }
}

/// Whether `journal_stream`, the value of `JOURNAL_STREAM` (`DEV:INODE`, decimal, as systemd
/// sets it for a service whose stderr is the journal), names the file `(dev, ino)`.
pub fn journal_stream_names(journal_stream: &str, dev: u64, ino: u64) -> bool {
    let Some((d, i)) = journal_stream.trim().split_once(':') else {
        return false;
    };
    matches!((d.parse::<u64>(), i.parse::<u64>()), (Ok(d), Ok(i)) if d == dev && i == ino)
}

/// Whether this process's stderr is the systemd journal: `JOURNAL_STREAM` is set and names
/// the file descriptor 2 is (a child whose stderr was redirected keeps the variable but not
/// the stream).
pub fn stderr_is_journal() -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let Ok(var) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() else {
        return false;
    };
    match std::fs::File::from(fd).metadata() {
        Ok(m) => journal_stream_names(&var, m.dev(), m.ino()),
        Err(_) => false,
    }
}

/// Installs the process's logger: `filter` (an `EnvFilter` directive; `RUST_LOG` overrides
/// it), in `format`, timestamps unless stderr is the journal, warnings and errors rate-limited
/// ([`LineBudget`]). Call it once.
pub fn init(filter: &str, format: LogFormat) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(filter));
    // The filter can change while the daemon runs (a reload's `log`).
    let (filter, handle) = reload::Layer::new(filter);
    let _ = LIVE_FILTER.set(handle);
    let journal = stderr_is_journal();
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let budget = LineBudget::default();
    let _ = LINE_BUDGET.set(budget.state.clone());
    let registry = tracing_subscriber::registry().with(filter).with(budget);
    let _ = match (format, journal) {
        (LogFormat::Json, _) => registry
            .with(lines.event_format(JsonLines {
                timestamps: !journal,
            }))
            .try_init(),
        (LogFormat::Text, true) => registry
            .with(lines.with_ansi(false).without_time())
            .try_init(),
        (LogFormat::Text, false) => registry
            .with(lines.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())))
            .try_init(),
    };
}

/// The target of the lines that count what [`LineBudget`] did not log.
pub const SUPPRESSED_TARGET: &str = "ipoib_cm::log";

/// Where one place in the code writes its warnings and errors.
type Place = &'static Metadata<'static>;

/// What [`LineBudget`] keeps: the windows, and the counts of ended ones not yet reported.
#[derive(Debug, Default)]
struct Budget {
    windows: EventLog<Place>,
    /// The first line not logged of each place in its current window (its message).
    first_suppressed: Vec<(Place, String)>,
    /// Windows that ended with lines not logged: the place, its first such line, the count.
    ended: Vec<(Place, String, u64)>,
}

/// A layer that lets each place in the code log at most 20 warnings and errors per 10 s (the
/// connection events' budget); lines of lower levels, and its own counts
/// ([`SUPPRESSED_TARGET`]), pass. It keeps one window per place (a fixed set); the counts are
/// written by [`report_suppressed`], never from inside the logger.
#[derive(Debug, Default, Clone)]
pub struct LineBudget {
    state: Arc<Mutex<Budget>>,
}

impl<S: Subscriber> Layer<S> for LineBudget {
    fn event_enabled(&self, event: &Event<'_>, _ctx: Context<'_, S>) -> bool {
        let place = event.metadata();
        if *place.level() > Level::WARN || place.target() == SUPPRESSED_TARGET {
            return true;
        }
        let Ok(mut b) = self.state.lock() else {
            return true;
        };
        let Budget {
            windows,
            first_suppressed,
            ended,
        } = &mut *b;
        let verdict = windows.admit(Instant::now(), place, |p, n| {
            let first = take_first(first_suppressed, p);
            ended.push((p, first, n));
        });
        if verdict == Verdict::Suppress && !first_suppressed.iter().any(|(p, _)| *p == place) {
            let mut message = Message(String::new());
            event.record(&mut message);
            first_suppressed.push((place, message.0));
        }
        verdict == Verdict::Log
    }
}

/// Takes the message kept for `place` out of `first` (empty if none).
fn take_first(first: &mut Vec<(Place, String)>, place: Place) -> String {
    match first.iter().position(|(p, _)| *p == place) {
        Some(i) => first.swap_remove(i).1,
        None => String::new(),
    }
}

/// An event's `message` field.
struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

/// The state of the [`LineBudget`] that [`init`] installed.
static LINE_BUDGET: OnceLock<Arc<Mutex<Budget>>> = OnceLock::new();

/// Writes one warning per place whose window ended (by `now`) with lines not logged: how many,
/// and the first of them. Call it every few seconds and before exiting.
pub fn report_suppressed(now: Instant) {
    if let Some(state) = LINE_BUDGET.get() {
        report(state, now);
    }
}

/// As [`report_suppressed`], every window ending at `now` (before exiting).
pub fn flush_suppressed(now: Instant) {
    report_suppressed(now + EVENT_LOG_WINDOW);
}

fn report(state: &Mutex<Budget>, now: Instant) {
    let ended = {
        let Ok(mut b) = state.lock() else {
            return;
        };
        let Budget {
            windows,
            first_suppressed,
            ended,
        } = &mut *b;
        windows.roll(now, |p, n| {
            let first = take_first(first_suppressed, p);
            ended.push((p, first, n));
        });
        std::mem::take(ended)
    };
    for (place, first, count) in ended {
        tracing::warn!(
            target: SUPPRESSED_TARGET,
            "{count} more lines like \"{first}\" not logged in the last {}s ({}:{})",
            EVENT_LOG_WINDOW.as_secs(),
            place.module_path().unwrap_or("?"),
            place.line().unwrap_or(0)
        );
    }
}

/// The filter of the logger [`init`] installed, which [`set_filter`] changes.
static LIVE_FILTER: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// Why the log filter did not change.
#[derive(Debug, thiserror::Error)]
pub enum LogFilterError {
    /// No logger of [`init`]'s in this process.
    #[error("the log filter cannot change live")]
    NotLive,
    /// The filter text does not parse.
    #[error("{0}")]
    Parse(#[from] tracing_subscriber::filter::ParseError),
    /// The logger is gone.
    #[error("{0}")]
    Reload(#[from] reload::Error),
}

/// Whether the log filter can change while the process runs ([`init`] installed the logger).
pub fn filter_is_live() -> bool {
    LIVE_FILTER.get().is_some()
}

/// Sets the log filter (the text of `--log`, `RUST_LOG` syntax).
///
/// # Errors
/// No live filter, or a filter that does not parse.
pub fn set_filter(text: &str) -> Result<(), LogFilterError> {
    let handle = LIVE_FILTER.get().ok_or(LogFilterError::NotLive)?;
    handle.reload(EnvFilter::try_new(text)?)?;
    Ok(())
}

/// The JSON line format: an object with `timestamp` (RFC 3339, UTC, unless left to the
/// journal), `level`, `target`, and the event's fields (`message` among them).
#[derive(Debug, Clone, Copy)]
struct JsonLines {
    timestamps: bool,
}

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut obj = serde_json::Map::new();
        if self.timestamps {
            obj.insert(
                "timestamp".into(),
                humantime::format_rfc3339_micros(std::time::SystemTime::now())
                    .to_string()
                    .into(),
            );
        }
        obj.insert(
            "level".into(),
            meta.level().as_str().to_ascii_lowercase().into(),
        );
        obj.insert("target".into(), meta.target().into());
        event.record(&mut JsonFields(&mut obj));
        writeln!(writer, "{}", serde_json::Value::Object(obj))
    }
}

/// Records an event's fields into a JSON object.
struct JsonFields<'a>(&'a mut serde_json::Map<String, serde_json::Value>);

impl Visit for JsonFields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn journal_stream_must_name_the_file() {
        assert!(journal_stream_names("8:12345", 8, 12345));
        assert!(journal_stream_names(" 8:12345\n", 8, 12345));
        assert!(!journal_stream_names("8:12345", 8, 12346));
        assert!(!journal_stream_names("9:12345", 8, 12345));
        assert!(!journal_stream_names("", 8, 12345));
        assert!(!journal_stream_names("8", 8, 12345));
        assert!(!journal_stream_names("8:x", 8, 12345));
        assert!(!journal_stream_names("-8:12345", 8, 12345));
    }

    #[test]
    fn stderr_of_a_test_is_not_the_journal_whatever_the_variable() {
        // The test harness's stderr is a pipe or a terminal, never a file named "1:1".
        std::env::set_var("JOURNAL_STREAM", "1:1");
        assert!(!stderr_is_journal());
        std::env::remove_var("JOURNAL_STREAM");
        assert!(!stderr_is_journal());
    }

    #[test]
    fn log_format_names() {
        assert_eq!("json".parse::<LogFormat>(), Ok(LogFormat::Json));
        assert_eq!("text".parse::<LogFormat>(), Ok(LogFormat::Text));
        assert!("yaml".parse::<LogFormat>().is_err());
        assert_eq!(LogFormat::Json.to_string(), "json");
    }

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            if let Ok(mut v) = self.0.lock() {
                v.extend_from_slice(b);
            }
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_json_line_is_one_object_with_level_message_and_fields() {
        let buf = Buf::default();
        let out = buf.clone();
        let sub = tracing_subscriber::fmt()
            .with_writer(move || out.clone())
            .event_format(JsonLines { timestamps: false })
            .finish();
        tracing::subscriber::with_default(sub, || {
            tracing::warn!(kind = "rx_bad_icrc", count = 3u64, "bad input dropped");
        });
        let text = String::from_utf8(buf.0.lock().map(|v| v.clone()).unwrap_or_default())
            .unwrap_or_default();
        assert_eq!(text.lines().count(), 1, "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(v["level"], "warn", "{text}");
        assert_eq!(v["message"], "bad input dropped", "{text}");
        assert_eq!(v["kind"], "rx_bad_icrc", "{text}");
        assert_eq!(v["count"], 3, "{text}");
        assert!(v.get("timestamp").is_none(), "{text}");
    }

    /// A place that writes a warning per packet logs its budget, then one line with the
    /// count and the first line not logged; another place keeps its own budget, and lines
    /// below warnings pass.
    #[test]
    fn warnings_are_limited_per_place_and_counted() {
        use tracing_subscriber::layer::SubscriberExt;
        let buf = Buf::default();
        let out = buf.clone();
        let budget = LineBudget::default();
        let state = budget.state.clone();
        let sub = tracing_subscriber::registry().with(budget).with(
            tracing_subscriber::fmt::layer()
                .with_writer(move || out.clone())
                .without_time()
                .with_ansi(false),
        );
        tracing::subscriber::with_default(sub, || {
            for i in 0..1000 {
                tracing::warn!("soft provider send failed: packet {i}");
            }
            for _ in 0..5 {
                tracing::warn!("another place");
            }
            for _ in 0..50 {
                tracing::info!("an info line");
            }
            report(&state, Instant::now() + EVENT_LOG_WINDOW);
        });
        let text = String::from_utf8(buf.0.lock().map(|v| v.clone()).unwrap_or_default())
            .unwrap_or_default();
        let count = |needle: &str| text.lines().filter(|l| l.contains(needle)).count();
        assert_eq!(count("soft provider send failed"), 21, "{text}");
        assert_eq!(count("another place"), 5);
        assert_eq!(count("an info line"), 50);
        let summary = text
            .lines()
            .find(|l| l.contains("more lines like"))
            .unwrap_or_default();
        assert!(
            summary.contains("980 more lines like \"soft provider send failed: packet 20\""),
            "{summary}"
        );
        assert!(summary.contains("not logged in the last 10s"), "{summary}");
    }
}
