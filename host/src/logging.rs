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
//! [`FLUSH_AT`] bytes per worker).

use crate::config::{Config, LogFormat};
use std::cell::RefCell;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

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
    static GATHERED: RefCell<Gathered> = const {
        RefCell::new(Gathered { on: false, buf: Vec::new(), since: None })
    };
}

/// Set up the global subscriber from the configuration (or `RUST_LOG`).
pub fn init(config: &Config) {
    use tracing_subscriber::EnvFilter;
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| config.log.clone());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(filter))
        .with_writer(Writers);
    let _ = if config.log_format == LogFormat::Json {
        builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init()
    } else {
        builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init()
    };
}

/// From now on this thread gathers its lines (an async worker that woke
/// up: `on_thread_unpark`).
pub fn gather() {
    let _ = GATHERED.try_with(|g| g.borrow_mut().on = true);
}

/// Write out what this thread gathered, and let its lines go straight out
/// again (an async worker about to park, or stopping; before an exit).
pub fn flush() {
    let _ = GATHERED.try_with(|g| {
        let mut g = g.borrow_mut();
        g.on = false;
        write_gathered(&mut g);
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
            && GATHERED
                .try_with(|g| {
                    let mut g = g.borrow_mut();
                    if !g.on {
                        return false;
                    }
                    g.buf.extend_from_slice(bytes);
                    let since = *g.since.get_or_insert_with(Instant::now);
                    if g.buf.len() >= FLUSH_AT || since.elapsed() >= FLUSH_AFTER {
                        write_gathered(&mut g);
                    }
                    true
                })
                .unwrap_or(false);
        if !gathered {
            write_out(bytes)?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        pub(super) static OUT: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }

    fn written() -> Vec<u8> {
        OUT.with(|o| std::mem::take(&mut *o.borrow_mut()))
    }

    #[test]
    fn lines_gather_between_gather_and_flush_and_go_straight_out_otherwise() {
        Stderr { gather: true }.write_all(b"zero\n").unwrap();
        assert_eq!(written(), b"zero\n");
        gather();
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
        gather();
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
}
