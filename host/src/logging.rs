//! Logs on stderr: text (colours only on a terminal) or JSON lines.
//!
//! A line is written to stderr as soon as it is made, except on an async
//! worker thread that is busy: there lines gather in a buffer of the
//! thread's own and are written together when the worker runs out of work
//! (it is about to park), the buffer reaches [`FLUSH_AT`] bytes or its
//! oldest line is [`FLUSH_AFTER`] old (checked at the next line). Warnings
//! and errors always go straight out. Under load that is one `write(2)`
//! for many requests' lines instead of one per line; when idle, a line is
//! out before the worker sleeps. What a `kill -9` can lose is at most the
//! info lines a busy worker gathered since it last wrote (under
//! [`FLUSH_AT`] bytes per worker); before the process exits, [`flush_all`]
//! writes what every thread gathered, a worker still busy with a request
//! the drain gave up on included.
//!
//! The one line per request ([`access`]) is made here rather than by the
//! subscriber's formatter (about a third of a host route's own CPU went to
//! formatting it): the same text or JSON line, byte for byte, with the
//! timestamp's date and time of day formatted once per second per thread
//! ([`Timestamp`], also the subscriber's timer).

use crate::config::{Config, LogFormat};
use std::cell::RefCell;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime};

/// A busy worker writes its gathered lines once they reach this size...
const FLUSH_AT: usize = 32 << 10;
/// ...or once the oldest of them is this old (checked at its next line).
const FLUSH_AFTER: Duration = Duration::from_millis(50);

/// What a thread gathers.
struct Gathered {
    /// Lines gather (an async worker between unpark and park).
    on: bool,
    buf: Vec<u8>,
    /// When the oldest line in `buf` was made.
    since: Option<Instant>,
}

thread_local! {
    /// This thread's; registered in [`ALL_GATHERED`] (its lock is only
    /// ever contended by [`flush_all`]).
    static GATHERED: Arc<Mutex<Gathered>> = {
        let g = Arc::new(Mutex::new(Gathered { on: false, buf: Vec::new(), since: None }));
        let mut all = ALL_GATHERED.lock().unwrap_or_else(|e| e.into_inner());
        // (Threads come and go: blocking threads idle out. Their entries
        // go when a new thread registers, so the list stays as long as
        // the threads alive.)
        all.retain(|g| g.strong_count() > 0);
        all.push(Arc::downgrade(&g));
        g
    };
}

/// Every thread's [`GATHERED`], for [`flush_all`].
static ALL_GATHERED: Mutex<Vec<Weak<Mutex<Gathered>>>> = Mutex::new(Vec::new());

/// This thread's [`Gathered`], locked.
fn with_gathered<T>(f: impl FnOnce(&mut Gathered) -> T) -> Option<T> {
    GATHERED
        .try_with(|g| f(&mut g.lock().unwrap_or_else(|e| e.into_inner())))
        .ok()
}

/// Write what every thread gathered (before the process exits: a worker
/// still busy with a request the drain gave up on never parks to write
/// its own).
pub fn flush_all() {
    let mut all = ALL_GATHERED.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|g| match g.upgrade() {
        Some(g) => {
            write_gathered(&mut g.lock().unwrap_or_else(|e| e.into_inner()));
            true
        }
        None => false,
    });
}

/// How [`access`] writes its line (set by [`init`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AccessFormat {
    Text,
    Json,
    /// Through the subscriber (colours on a terminal; before [`init`]).
    Subscriber,
}

static ACCESS_FORMAT: OnceLock<AccessFormat> = OnceLock::new();

/// Set up the global subscriber from the configuration (or `RUST_LOG`).
pub fn init(config: &Config) {
    use tracing_subscriber::EnvFilter;
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| config.log.clone());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(filter))
        .with_timer(Timestamp)
        .with_writer(Writers);
    let ansi = std::io::stderr().is_terminal();
    let (format, set) = if config.log_format == LogFormat::Json {
        let set = builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init();
        (AccessFormat::Json, set)
    } else {
        let set = builder.with_ansi(ansi).try_init();
        let format = if ansi {
            AccessFormat::Subscriber
        } else {
            AccessFormat::Text
        };
        (format, set)
    };
    if set.is_ok() {
        let _ = ACCESS_FORMAT.set(format);
    }
}

/// Say why `serve` stops before its log is set up (its configuration
/// refused), as the JSON log would: an `ERROR` line `exiting: ...`.
pub fn exiting_before_init(e: &anyhow::Error) {
    let _ = tracing_subscriber::fmt()
        .json()
        .with_timer(Timestamp)
        .with_writer(Writers)
        .with_max_level(tracing::Level::ERROR)
        .try_init();
    tracing::error!(target: "marketplace::cli", "exiting: {e:#}");
    flush_all();
}

/// One answered request, for its log line.
pub struct Access<'a> {
    /// The client's address (behind trusted proxies, the one they name).
    pub client: std::net::IpAddr,
    pub method: &'a str,
    pub path: &'a str,
    pub family: &'a str,
    pub status: u16,
    pub micros: u64,
}

/// The span of a request: every line logged while serving it carries its id.
pub fn request_span(id: &str) -> tracing::Span {
    tracing::info_span!(target: "marketplace::server::http", "request", id = %id)
}

/// Log the line of an answered request (target `request`, level INFO, in
/// a `request` span whose only field is its `id`), unless the filter
/// leaves it out. The line carries the id even where the filter leaves
/// the request's span out.
pub fn access(id: &str, a: &Access) {
    if !tracing::enabled!(target: "request", tracing::Level::INFO) {
        return;
    }
    // What a stranger sent is logged at a bounded length: a 100 kB method
    // is one short line, not 100 kB of log per request.
    let (method, path) = (clip(a.method, MAX_METHOD), clip(a.path, MAX_PATH));
    let a = &Access {
        method: &method,
        path: &path,
        ..*a
    };
    let format = ACCESS_FORMAT
        .get()
        .copied()
        .unwrap_or(AccessFormat::Subscriber);
    if format == AccessFormat::Subscriber {
        access_event(id, a);
        return;
    }
    LINE.with(|line| {
        let mut line = line.borrow_mut();
        line.clear();
        access_line(&mut line, format == AccessFormat::Json, id, a);
        let _ = Stderr { gather: true }.write_all(line.as_bytes());
    });
}

/// Longest request method and path an access line shows.
pub const MAX_METHOD: usize = 32;
pub const MAX_PATH: usize = 2048;
/// Most bytes of a request's path an error message repeats.
pub const SHOWN_PATH: usize = 200;

/// `message` on one line: control characters (a line break that would
/// forge a log line of its own, say) written as escapes, at most
/// `max_chars` characters. For text a plugin chose: its log lines, the
/// names in a wasm backtrace.
pub fn one_line(message: &str, max_chars: usize) -> std::borrow::Cow<'_, str> {
    let cut = message
        .char_indices()
        .nth(max_chars)
        .map_or(message, |(at, _)| &message[..at]);
    if !cut.chars().any(escaped) {
        return std::borrow::Cow::Borrowed(cut);
    }
    let mut out = String::with_capacity(cut.len() + 16);
    for c in cut.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if escaped(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Written as an escape by [`one_line`]: control characters, and those
/// that make a line read otherwise than it is (line and paragraph
/// separators, which some viewers break lines at; bidirectional controls;
/// invisible format characters). A name shown in listings and logs is
/// refused holding one.
pub(crate) fn escaped(c: char) -> bool {
    c.is_control() || marketplace_common::text::reads_otherwise(c)
}

/// `s` cut to at most `max` bytes (at a character boundary), marked `...`
/// with its full length when cut.
pub fn clip(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= max {
        return s.into();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...({} bytes)", &s[..end], s.len()).into()
}

/// [`access`]'s line as an event of the subscriber's.
fn access_event(id: &str, a: &Access) {
    request_span(id).in_scope(|| {
        tracing::info!(
            target: "request",
            client = %a.client,
            method = %a.method,
            path = %a.path,
            family = %a.family,
            status = a.status,
            micros = a.micros,
        )
    });
}

thread_local! {
    static LINE: RefCell<String> = const { RefCell::new(String::new()) };
}

/// The line the subscriber writes for [`access`]'s event, without colours.
/// Written piece by piece (one is made per request; `write!` took two
/// thirds of the line's instructions).
fn access_line(out: &mut String, json: bool, id: &str, a: &Access) {
    let mut number = itoa::Buffer::new();
    if json {
        out.push_str(r#"{"timestamp":""#);
        Timestamp::write(out);
        out.push_str(r#"","level":"INFO","fields":{"client":""#);
        push_ip(out, a.client);
        out.push_str(r#"","method":"#);
        push_json_str(out, a.method);
        out.push_str(r#","path":"#);
        push_json_str(out, a.path);
        out.push_str(r#","family":"#);
        push_json_str(out, a.family);
        out.push_str(r#","status":"#);
        out.push_str(number.format(a.status));
        out.push_str(r#","micros":"#);
        out.push_str(number.format(a.micros));
        out.push_str(r#"},"target":"request","span":{"id":"#);
        push_json_str(out, id);
        out.push_str(r#","name":"request"}}"#);
    } else {
        Timestamp::write(out);
        out.push_str("  INFO request{id=");
        out.push_str(id);
        out.push_str("}: request: client=");
        push_ip(out, a.client);
        for (text, value) in [
            (" method=", a.method),
            (" path=", a.path),
            (" family=", a.family),
            (" status=", number.format(a.status)),
        ] {
            out.push_str(text);
            out.push_str(value);
        }
        out.push_str(" micros=");
        out.push_str(number.format(a.micros));
    }
    out.push('\n');
}

/// `ip` as `Display` writes it (an IPv4 address without the formatting
/// machinery).
fn push_ip(out: &mut String, ip: std::net::IpAddr) {
    match ip {
        std::net::IpAddr::V4(v4) => {
            let mut number = itoa::Buffer::new();
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                out.push_str(number.format(octet));
            }
        }
        std::net::IpAddr::V6(v6) => {
            let _ = write!(out, "{v6}");
        }
    }
}

/// `s` as a JSON string, as `serde_json` writes it.
fn push_json_str(out: &mut String, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push('"');
        out.push_str(s);
        out.push('"');
    } else {
        out.push_str(&serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into()));
    }
}

/// The time of a log line, RFC 3339 in UTC with microseconds
/// (`2026-11-25T16:19:02.330064Z`, as the subscriber's default timer
/// writes it); the part up to the second is formatted once per second per
/// thread.
struct Timestamp;

thread_local! {
    /// The second last formatted and its text up to the `.`.
    static SECOND: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

impl Timestamp {
    fn write(out: &mut String) {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        Self::write_at(out, now);
    }

    fn write_at(out: &mut String, since_epoch: Duration) {
        let secs = since_epoch.as_secs();
        SECOND.with(|second| {
            let mut second = second.borrow_mut();
            if second.0 != secs {
                let text = marketplace_common::time::rfc3339(secs.saturating_mul(1000));
                second.1 = format!("{}.", text.trim_end_matches('Z'));
                second.0 = secs;
            }
            out.push_str(&second.1);
        });
        let micros = since_epoch.subsec_micros();
        let mut number = itoa::Buffer::new();
        let digits = number.format(micros);
        out.extend(std::iter::repeat_n('0', 6 - digits.len().min(6)));
        out.push_str(digits);
        out.push('Z');
    }
}

impl tracing_subscriber::fmt::time::FormatTime for Timestamp {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        let mut text = String::with_capacity(32);
        Timestamp::write(&mut text);
        w.write_str(&text)
    }
}

/// From now on this thread gathers its lines (an async worker that woke
/// up: `on_thread_unpark`).
pub fn gather() {
    with_gathered(|g| g.on = true);
}

/// Write out what this thread gathered, and let its lines go straight out
/// again (an async worker about to park, or stopping; before an exit).
pub fn flush() {
    with_gathered(|g| {
        g.on = false;
        write_gathered(g);
    });
}

fn write_gathered(g: &mut Gathered) {
    if !g.buf.is_empty() {
        let _ = write_out(&g.buf);
        g.buf.clear();
    }
    g.since = None;
}

/// Where lines go: stderr (in unit tests, a buffer of the thread's).
fn write_out(bytes: &[u8]) -> std::io::Result<()> {
    #[cfg(test)]
    return tests::OUT.with(|o| {
        o.borrow_mut().extend_from_slice(bytes);
        Ok(())
    });
    #[cfg(not(test))]
    std::io::stderr().lock().write_all(bytes)
}

/// The subscriber's writers: warnings and errors always go straight out.
struct Writers;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Writers {
    type Writer = Stderr;
    fn make_writer(&'a self) -> Stderr {
        Stderr { gather: true }
    }
    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Stderr {
        Stderr {
            gather: gathers(meta.level()),
        }
    }
}

/// Lines below WARN may gather.
fn gathers(level: &tracing::Level) -> bool {
    *level > tracing::Level::WARN
}

/// One formatted event per `write_all`.
struct Stderr {
    /// The line may gather (below WARN).
    gather: bool,
}

impl Write for Stderr {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let gathered = self.gather
            && with_gathered(|g| {
                if !g.on {
                    return false;
                }
                g.buf.extend_from_slice(bytes);
                let since = *g.since.get_or_insert_with(Instant::now);
                if g.buf.len() >= FLUSH_AT || since.elapsed() >= FLUSH_AFTER {
                    write_gathered(g);
                }
                true
            })
            .unwrap_or(false);
        // A line that cannot be written (stderr full, or its reader gone)
        // is dropped: an error here would make tracing-subscriber report
        // it with `eprintln!`, which panics on that same stderr.
        if !gathered {
            let _ = write_out(bytes);
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A request's error line: while the shared store is unavailable
/// (`outage`, [`crate::store::Storage::unavailable_lately`]) most such
/// lines are the outage's echo, every request failing the same way, so one
/// a second is written, at `warn`, with the count of those held back (the
/// store's own line says what failed); otherwise it is an `error` line.
/// `plugin`: the family whose component logged it (its log field); none
/// for the host's own routes.
pub fn request_error(outage: bool, plugin: Option<&str>, message: &str) {
    if !outage {
        match plugin {
            Some(plugin) => tracing::error!(plugin, "{message}"),
            None => tracing::error!("{message}"),
        }
        return;
    }
    static LINES: Throttle = Throttle::new(Duration::from_secs(1));
    if !tracing::enabled!(tracing::Level::WARN) {
        return;
    }
    if let Some(n) = LINES.note() {
        match plugin {
            Some(plugin) => tracing::warn!(
                plugin,
                lines_since_last = n,
                "while the shared store is unavailable: {message}"
            ),
            None => tracing::warn!(
                lines_since_last = n,
                "while the shared store is unavailable: {message}"
            ),
        }
    }
}

/// At most one log line per interval about an event that can repeat
/// without bound (a flood of refused connections, a store that fails every
/// request): [`Throttle::note`] counts the event and says when a line is
/// due, with how many events it stands for.
pub struct Throttle {
    every: Duration,
    /// Events since the last line, and when that line was.
    since: std::sync::Mutex<(u64, Option<Instant>)>,
}

impl Throttle {
    pub const fn new(every: Duration) -> Throttle {
        Throttle {
            every,
            since: std::sync::Mutex::new((0, None)),
        }
    }

    /// Count one event: `Some(n)` when a line is due now, `n` the events
    /// since the last line (this one included).
    pub fn note(&self) -> Option<u64> {
        let mut since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        self.count(&mut since)
    }

    /// [`Throttle::note`] on the locked state.
    fn count(&self, since: &mut (u64, Option<Instant>)) -> Option<u64> {
        since.0 += 1;
        if since.1.is_some_and(|t| t.elapsed() < self.every) {
            return None;
        }
        let n = since.0;
        *since = (0, Some(Instant::now()));
        Some(n)
    }

    /// [`Throttle::note`], also saying when an event is the first held
    /// back since the last line: the caller then writes the held-back
    /// count after the returned wait ([`Throttle::flush`]), so the tail of
    /// a burst is not left unlogged until another event comes.
    pub fn note_deferred(&self) -> Noted {
        // One lock for the count and the decision: of two events at once,
        // exactly one is the first held back.
        let mut since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = self.count(&mut since) {
            return Noted::Now(n);
        }
        match (since.0, since.1) {
            (1, Some(t)) => Noted::Later(self.every.saturating_sub(t.elapsed())),
            _ => Noted::Held,
        }
    }

    /// The events held back since the last line, if any (that many stand
    /// in a line written now).
    pub fn flush(&self) -> Option<u64> {
        let mut since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        match since.0 {
            0 => None,
            n => {
                *since = (0, Some(Instant::now()));
                Some(n)
            }
        }
    }
}

/// What [`Throttle::note_deferred`] says of an event.
#[derive(Debug, PartialEq)]
pub enum Noted {
    /// Write a line now, standing for this many events.
    Now(u64),
    /// Held back, the first since the last line: flush after this wait.
    Later(Duration),
    /// Held back; a flush is already due.
    Held,
}

/// A log sink for tests: what a subscriber writes to it, kept.
#[cfg(test)]
#[derive(Clone, Default)]
pub(crate) struct Captured(Arc<Mutex<Vec<u8>>>);

#[cfg(test)]
impl Captured {
    /// Everything written so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

#[cfg(test)]
impl Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throttle_lets_one_line_through_per_interval_with_the_count() {
        let t = Throttle::new(Duration::from_secs(3600));
        assert_eq!(t.note(), Some(1), "the first event is logged");
        assert_eq!(t.note(), None);
        assert_eq!(t.note(), None);
        // Past the interval the next line counts the two held back.
        t.since.lock().unwrap().1 = Some(Instant::now() - Duration::from_secs(3601));
        assert_eq!(t.note(), Some(3));
        assert_eq!(t.note(), None);
        let every = Throttle::new(Duration::ZERO);
        assert_eq!((every.note(), every.note()), (Some(1), Some(1)));
    }

    #[test]
    fn a_deferred_throttle_asks_once_for_the_tail_of_a_burst() {
        let t = Throttle::new(Duration::from_secs(3600));
        assert_eq!(t.flush(), None, "nothing held back yet");
        assert_eq!(t.note_deferred(), Noted::Now(1));
        match t.note_deferred() {
            Noted::Later(wait) => assert!(wait <= Duration::from_secs(3600), "{wait:?}"),
            other => panic!("the first held back asks for a flush: {other:?}"),
        }
        assert_eq!(t.note_deferred(), Noted::Held);
        assert_eq!(t.note_deferred(), Noted::Held);
        // The flush writes the three held back, and the next event held
        // back asks for a flush of its own.
        assert_eq!(t.flush(), Some(3));
        assert_eq!(t.flush(), None);
        assert!(matches!(t.note_deferred(), Noted::Later(_)));
    }

    thread_local! {
        pub(super) static OUT: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }

    fn written() -> Vec<u8> {
        OUT.with(|o| std::mem::take(&mut *o.borrow_mut()))
    }

    /// [`gather`], with this thread's lines held as if the first came an
    /// hour from now: a test preempted for [`FLUSH_AFTER`] on a loaded
    /// machine does not see them written for their age.
    fn gather_without_age() {
        gather();
        with_gathered(|g| g.since = Some(Instant::now() + Duration::from_secs(3600)));
    }

    #[test]
    fn clip_cuts_at_a_character_and_says_how_long_it_was() {
        assert_eq!(clip("GET", 32), "GET");
        assert_eq!(
            clip(&"A".repeat(40), 32),
            format!("{}...(40 bytes)", "A".repeat(32))
        );
        // 'é' is two bytes: never cut inside it.
        assert_eq!(clip("aé", 2), "a...(3 bytes)");
    }

    #[test]
    fn lines_gather_between_gather_and_flush_and_go_straight_out_otherwise() {
        Stderr { gather: true }.write_all(b"zero\n").unwrap();
        assert_eq!(written(), b"zero\n");
        gather_without_age();
        Stderr { gather: true }.write_all(b"one\n").unwrap();
        Stderr { gather: true }.write_all(b"two\n").unwrap();
        assert_eq!(written(), b"");
        flush();
        assert_eq!(written(), b"one\ntwo\n");
        Stderr { gather: true }.write_all(b"three\n").unwrap();
        assert_eq!(written(), b"three\n");
    }

    #[test]
    fn warnings_go_straight_out_and_old_lines_are_written_at_the_next() {
        assert!(gathers(&tracing::Level::INFO) && gathers(&tracing::Level::DEBUG));
        assert!(!gathers(&tracing::Level::WARN) && !gathers(&tracing::Level::ERROR));
        gather();
        Stderr { gather: true }.write_all(b"info\n").unwrap();
        Stderr { gather: false }.write_all(b"warn\n").unwrap();
        assert_eq!(
            written(),
            b"warn\n",
            "the warning at once, the info line kept"
        );
        std::thread::sleep(FLUSH_AFTER + Duration::from_millis(5));
        Stderr { gather: true }.write_all(b"later\n").unwrap();
        assert_eq!(
            written(),
            b"info\nlater\n",
            "the old line is written with the next"
        );
        flush();
    }

    #[test]
    fn a_busy_thread_writes_its_lines_out_once_they_fill_the_buffer() {
        gather_without_age();
        let line = [b'x'; 1000];
        let mut sent = 0;
        while sent + line.len() < FLUSH_AT {
            Stderr { gather: true }.write_all(&line).unwrap();
            sent += line.len();
        }
        assert_eq!(written().len(), 0);
        Stderr { gather: true }.write_all(&line).unwrap();
        assert_eq!(written().len(), sent + line.len(), "all of it, in order");
        Stderr { gather: true }.write_all(b"after\n").unwrap();
        flush();
        assert_eq!(written(), b"after\n");
    }

    /// What the subscriber, set up as [`init`] sets it up (no colours),
    /// writes for the event [`access`] replaces.
    fn subscriber_line(json: bool, id: &str, a: &Access) -> String {
        let capture = Captured::default();
        let writer = capture.clone();
        let builder = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_timer(Timestamp);
        let dispatch: tracing::Dispatch = if json {
            builder
                .json()
                .with_current_span(true)
                .with_span_list(false)
                .finish()
                .into()
        } else {
            builder.finish().into()
        };
        tracing::dispatcher::with_default(&dispatch, || access_event(id, a));
        capture.text()
    }

    /// The line with its timestamp (always 27 characters) blanked.
    fn without_time(line: &str, json: bool) -> String {
        let at = if json { r#"{"timestamp":""#.len() } else { 0 };
        let stamp = &line[at..at + 27];
        assert!(
            stamp.len() == 27 && stamp.ends_with('Z') && stamp.as_bytes()[19] == b'.',
            "{line}"
        );
        format!("{}{}", &line[..at], &line[at + 27..])
    }

    #[test]
    fn the_request_line_is_the_subscribers_line_byte_for_byte() {
        let a = Access {
            client: "2001:db8::7".parse().unwrap(),
            method: "POST",
            path: "/api/timeline/01KAB\"x\"",
            family: "timeline",
            status: 201,
            micros: 1234,
        };
        let v4 = Access {
            client: "203.0.113.9".parse().unwrap(),
            method: "GET",
            path: "/api/search\\q\u{1}",
            family: "-",
            status: 404,
            micros: 0,
        };
        for (json, a) in [(false, &a), (true, &a), (false, &v4), (true, &v4)] {
            let mut ours = String::new();
            access_line(&mut ours, json, "a1b2-0000000f", a);
            let theirs = subscriber_line(json, "a1b2-0000000f", a);
            assert_eq!(without_time(&ours, json), without_time(&theirs, json));
            assert!(ours.ends_with('\n') && ours.matches('\n').count() == 1);
            if json {
                let v: serde_json::Value = serde_json::from_str(&ours).unwrap();
                assert_eq!(v["fields"]["path"], a.path);
                assert_eq!(v["fields"]["client"], a.client.to_string());
                assert_eq!(v["span"]["id"], "a1b2-0000000f");
            }
        }
    }

    #[test]
    fn timestamps_are_rfc3339_micros_and_follow_the_second() {
        let at = |secs: u64, micros: u32| {
            let mut out = String::new();
            Timestamp::write_at(&mut out, Duration::new(secs, micros * 1000));
            out
        };
        assert_eq!(at(1_795_316_645, 123), "2026-11-22T03:04:05.000123Z");
        assert_eq!(at(1_795_316_645, 999_999), "2026-11-22T03:04:05.999999Z");
        assert_eq!(at(1_795_316_646, 0), "2026-11-22T03:04:06.000000Z");
        assert_eq!(at(0, 5), "1970-01-01T00:00:00.000005Z");
        assert_eq!(at(1_795_316_645, 1), "2026-11-22T03:04:05.000001Z");
    }
}
