//! `etcd-sync top [PREFIX]`: a live view of who holds and who waits for which names under
//! PREFIX, and the cycles among the waits, redrawn every second from `Client::wait_graph`
//! until `q` or a signal (Ctrl-C); `--json` prints the graph once. The terminal is put in
//! non-canonical mode without echo (so that `q` needs no Enter) and on its alternate
//! screen, both undone on the way out; no curses, plain ANSI sequences.

use std::collections::HashMap;
use std::io::{self, IsTerminal, Write};
use std::time::{Duration, Instant};

use etcd_sync::{Client, Holder, WaitGraph};

use crate::args::TopArgs;
use crate::exit::{EXIT_ERROR, EXIT_OK, EXIT_SIGNAL_BASE, Exit, fail};
use crate::graph_view::{self, Seen};
use crate::signals;
use crate::wait::{TICK, Waited, interruptible};

/// How often the view is read again.
pub const REFRESH: Duration = Duration::from_secs(1);

pub fn top(client: &Client, args: &TopArgs) -> Exit {
    if args.json {
        return match read(client, &args.prefix) {
            Ok(Ok(graph)) => print_json(&graph),
            Ok(Err(e)) => fail(&e),
            Err(code) => code,
        };
    }
    let terminal = Terminal::enter();
    let code = live(client, &args.prefix, &terminal);
    drop(terminal);
    code
}

/// One read on a worker thread; `Err(code)` if a signal came first.
fn read(client: &Client, prefix: &str) -> Result<etcd_sync::Result<WaitGraph>, Exit> {
    let (client, prefix) = (client.clone(), prefix.to_string());
    match interruptible(move || client.wait_graph(prefix))? {
        Waited::Done(read) => Ok(read),
        Waited::Signal(signo) => Err(EXIT_SIGNAL_BASE + signo),
    }
}

fn print_json(graph: &WaitGraph) -> Exit {
    let text = match graph_view::json(graph) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("etcd-sync: cannot write the graph as JSON: {e}");
            return EXIT_ERROR;
        }
    };
    crate::status::print(&text)
}

/// Redraws until `q` or a signal (both exit 0). A failed read is shown and tried again at
/// the next refresh: etcd may come back.
fn live(client: &Client, prefix: &str, terminal: &Terminal) -> Exit {
    // When top first saw each wait (its key and create revision), and whether that was at
    // its first refresh.
    let mut first_seen: HashMap<(Vec<u8>, i64), (Instant, bool)> = HashMap::new();
    let mut first_refresh = true;
    loop {
        let started = Instant::now();
        let frame = match read(client, prefix) {
            // A signal (Ctrl-C) ends the view as `q` does.
            Err(code) if code > EXIT_SIGNAL_BASE => return EXIT_OK,
            Err(code) => return code,
            Ok(Ok(graph)) => {
                let now = Instant::now();
                let mut live_waits = HashMap::new();
                for p in &graph.participants {
                    for wait in &p.waits {
                        let id = (wait.key.key.clone(), wait.key.create_revision);
                        let seen = first_seen.get(&id).copied().unwrap_or((now, first_refresh));
                        live_waits.insert(id, seen);
                    }
                }
                first_seen = live_waits;
                first_refresh = false;
                let seen = |key: &Holder| -> Option<Seen> {
                    let (at, at_least) =
                        *first_seen.get(&(key.key.clone(), key.create_revision))?;
                    Some(Seen {
                        waiting: now.saturating_duration_since(at),
                        at_least,
                    })
                };
                graph_view::screen(&graph, &seen)
            }
            Ok(Err(e)) => format!(
                "etcd-sync top {prefix:?}  (q or Ctrl-C quits)\n\ncannot read etcd: {e}\ntrying again every {}s\n",
                REFRESH.as_secs()
            ),
        };
        if let Err(e) = terminal.draw(&frame) {
            if e.kind() == io::ErrorKind::BrokenPipe {
                return EXIT_OK;
            }
            eprintln!("etcd-sync: cannot write to stdout: {e}");
            return EXIT_ERROR;
        }
        // Until the next refresh: keys and signals, one tick at a time.
        while started.elapsed() < REFRESH {
            if signals::take().is_some() || terminal.quit_key(TICK) {
                return EXIT_OK;
            }
        }
    }
}

/// The terminal while `top` runs: stdin without echo and line buffering (restored on
/// drop) when it is a terminal, stdout on the alternate screen when it is one.
struct Terminal {
    saved: Option<libc::termios>,
    screen: bool,
}

impl Terminal {
    fn enter() -> Terminal {
        let saved = io::stdin().is_terminal().then(raw_stdin).flatten();
        let screen = io::stdout().is_terminal();
        if screen {
            // The alternate screen, cursor hidden.
            let mut out = io::stdout().lock();
            let _ = out.write_all(b"\x1b[?1049h\x1b[?25l");
            let _ = out.flush();
        }
        Terminal { saved, screen }
    }

    /// Replaces the screen with `frame` (on a terminal; else prints it, then a blank line).
    fn draw(&self, frame: &str) -> io::Result<()> {
        let mut out = io::stdout().lock();
        if self.screen {
            // Home, clear, then as much of the frame as fits (the cycles come first).
            out.write_all(b"\x1b[H\x1b[2J")?;
            out.write_all(fit(frame, window_size()).as_bytes())?;
        } else {
            writeln!(out, "{frame}")?;
        }
        out.flush()
    }

    /// Waits up to `tick` for a key on stdin; whether it was `q` (or `Q`). Without a
    /// terminal on stdin, only sleeps.
    fn quit_key(&self, tick: Duration) -> bool {
        if self.saved.is_none() {
            std::thread::sleep(tick);
            return false;
        }
        let mut poll = libc::pollfd {
            fd: libc::STDIN_FILENO,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = tick.as_millis() as libc::c_int;
        // SAFETY: one valid pollfd, for the length given.
        if unsafe { libc::poll(&mut poll, 1, ms) } <= 0 {
            return false;
        }
        let mut buf = [0u8; 64];
        // SAFETY: reads at most buf.len() bytes into buf.
        let n = unsafe { libc::read(libc::STDIN_FILENO, buf.as_mut_ptr().cast(), buf.len()) };
        n > 0 && buf[..n as usize].iter().any(|&b| b == b'q' || b == b'Q')
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        if self.screen {
            let mut out = io::stdout().lock();
            let _ = out.write_all(b"\x1b[?25h\x1b[?1049l");
            let _ = out.flush();
        }
        if let Some(saved) = &self.saved {
            // SAFETY: restores the settings read from this descriptor.
            unsafe {
                libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, saved);
            }
        }
    }
}

/// The terminal's rows and columns, if stdout is one that says.
fn window_size() -> Option<(usize, usize)> {
    // SAFETY: TIOCGWINSZ fills a zero-initialised winsize.
    unsafe {
        let mut size: libc::winsize = std::mem::zeroed();
        if libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) != 0 {
            return None;
        }
        (size.ws_row > 0 && size.ws_col > 0).then(|| (size.ws_row.into(), size.ws_col.into()))
    }
}

/// `frame` cut to a screen of `size` (rows, columns): each line to the width, and the
/// lines that do not fit replaced by one that says how many there are more.
fn fit(frame: &str, size: Option<(usize, usize)>) -> String {
    let Some((rows, columns)) = size else {
        return frame.to_string();
    };
    let lines: Vec<&str> = frame.lines().collect();
    // The last row stays empty: a newline there would scroll the screen.
    let room = rows.saturating_sub(1).max(1);
    let shown = if lines.len() > room {
        room - 1
    } else {
        lines.len()
    };
    let mut out = String::new();
    for line in &lines[..shown] {
        out.extend(line.chars().take(columns));
        out.push('\n');
    }
    if shown < lines.len() {
        let more = format!(
            "... {} more lines (a narrower PREFIX, a larger window, or --json)",
            lines.len() - shown
        );
        out.extend(more.chars().take(columns));
        out.push('\n');
    }
    out
}

/// Turns off echo and line buffering on stdin (signals keep working: Ctrl-C is SIGINT);
/// returns the settings to restore, or `None` if they could not be read or set.
fn raw_stdin() -> Option<libc::termios> {
    // SAFETY: tcgetattr fills a zero-initialised termios; tcsetattr reads one.
    unsafe {
        let mut saved: libc::termios = std::mem::zeroed();
        if libc::tcgetattr(libc::STDIN_FILENO, &mut saved) != 0 {
            return None;
        }
        let mut raw = saved;
        raw.c_lflag &= !(libc::ICANON | libc::ECHO);
        raw.c_cc[libc::VMIN] = 0;
        raw.c_cc[libc::VTIME] = 0;
        if libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &raw) != 0 {
            return None;
        }
        Some(saved)
    }
}

#[cfg(test)]
mod tests {
    use super::fit;

    #[test]
    fn a_frame_is_cut_to_the_screen() {
        let frame = "title\nno cycles\n\nname  held\n  holder  a\n  waiter  b\n";
        assert_eq!(fit(frame, None), frame);
        assert_eq!(fit(frame, Some((40, 80))), frame);
        assert_eq!(fit(frame, Some((7, 80))), frame);
        assert_eq!(fit(frame, Some((5, 5))), "title\nno cy\n\n... 3\n");
    }
}
