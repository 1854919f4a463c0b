//! Fewer socket writes per request: the connection's bytes are held until the runtime has
//! run what was ready, then written in one go.
//!
//! HTTP/2 in hyper writes a unary call in two flushes: the request's HEADERS as soon as the
//! stream opens, and its DATA once the body task, woken by that opening, hands the message
//! over (h2 assigns send capacity to a stream only when its HEADERS go out). A PING that
//! etcd's gRPC server sends with an answer (its bandwidth probe, about one per round trip)
//! is acknowledged in a flush of its own too. So each unary call cost three `writev`s, each
//! a trip through the loopback or network stack on both sides, where one would do.
//!
//! [`Coalesced`] wraps the socket: writes only append to a buffer, and a flush that finds
//! bytes waiting first lets the runtime run the other tasks that are ready (it wakes the
//! connection task and answers `Pending` once, so the connection task comes back after
//! them, the body task among them), then writes everything in one call. The next request's
//! frames, the body that follows its headers and a PING's acknowledgement go out together.
//! A flush is late by one pass of the runtime's ready tasks, with two exceptions: bytes
//! that are only PING acknowledgements wait up to [`LAZY_HOLD`] for other frames (our next
//! request usually follows an answer closely), and once a read has found the socket
//! ended, nothing waits (HTTP/2 is closing the connection). Under TLS the bytes are
//! ciphertext, so only the pass applies.

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;
use tower_service::Service;

/// How long PING acknowledgements held alone wait for other frames to go with.
const LAZY_HOLD: Duration = Duration::from_millis(5);

/// The most one read takes from the socket (HTTP/2 reads in pieces of about this size).
const READ_AT_MOST: usize = 16 * 1024;

/// Bytes held before a write goes out without waiting for the flush: HTTP/2 frames of a
/// large answer or request pass through in pieces of about this size.
const HOLD_AT_MOST: usize = 64 * 1024;

/// A connection whose writes are gathered until a flush, and whose flush lets the runtime
/// run once before it writes (the module's comment says why).
#[derive(Debug)]
pub(crate) struct Coalesced<T> {
    io: T,
    /// Bytes written by HTTP/2 (or TLS) and not yet to the socket; `out[sent..]` remain.
    out: Vec<u8>,
    sent: usize,
    /// Whether the flush under way has already let the runtime run once.
    yielded: bool,
    /// The frames of the bytes held, when they are HTTP/2 in the clear (not under TLS).
    frames: Option<Frames>,
    /// Until when a PING acknowledgement held alone may wait for company.
    lazy: Option<Pin<Box<Sleep>>>,
    /// Whether the socket has ended (end of stream or an error on read): HTTP/2 is closing
    /// the connection, and its last flush must not wait, so that the next request finds
    /// the connection gone (and dials again) rather than closing.
    ended: bool,
    /// Where a read lands before it is copied to hyper's buffer.
    scratch: Box<[u8]>,
}

impl<T> Coalesced<T> {
    /// `clear`: the bytes are HTTP/2 frames as written (no TLS above this).
    pub(crate) fn new(io: T, clear: bool) -> Self {
        Coalesced {
            io,
            out: Vec::new(),
            sent: 0,
            yielded: false,
            frames: clear.then(Frames::default),
            lazy: None,
            ended: false,
            scratch: vec![0; READ_AT_MOST].into_boxed_slice(),
        }
    }

    fn held(&self) -> usize {
        self.out.len() - self.sent
    }

    fn hold(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
        if let Some(frames) = &mut self.frames {
            frames.scan(bytes);
        }
    }

    /// Whether what is held can wait: only PING acknowledgements, whole.
    fn only_lazy(&self) -> bool {
        self.frames.as_ref().is_some_and(Frames::only_lazy)
    }
}

impl<T: AsyncWrite + Unpin> Coalesced<T> {
    /// Writes every held byte to the socket.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.out.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.out[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.out.clear();
        self.sent = 0;
        if let Some(frames) = &mut self.frames {
            frames.urgent = false;
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> Write for Coalesced<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.held() >= HOLD_AT_MOST {
            ready!(self.drain(cx))?;
        }
        self.hold(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.held() >= HOLD_AT_MOST {
            ready!(self.drain(cx))?;
        }
        let mut n = 0;
        for buf in bufs {
            self.hold(buf);
            n += buf.len();
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.held() == 0 {
            return Pin::new(&mut self.io).poll_flush(cx);
        }
        if self.ended {
            // Closing: no reason to wait.
        } else if self.only_lazy() {
            // etcd's PING rides on an answer; our next request is usually close behind.
            let lazy = self
                .lazy
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(LAZY_HOLD)));
            ready!(lazy.as_mut().poll(cx));
        } else if !self.yielded {
            // Come back after the tasks that are ready now: a woken task that is running
            // is queued behind them.
            self.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        ready!(self.drain(cx))?;
        self.yielded = false;
        self.lazy = None;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drain(cx))?;
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<T: AsyncRead + Unpin> Read for Coalesced<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let room = buf.remaining().min(this.scratch.len());
        let mut read = ReadBuf::new(&mut this.scratch[..room]);
        let result = ready!(Pin::new(&mut this.io).poll_read(cx, &mut read));
        let n = read.filled().len();
        if result.is_err() || (n == 0 && room > 0) {
            this.ended = true;
        }
        result?;
        buf.put_slice(&this.scratch[..n]);
        Poll::Ready(Ok(()))
    }
}

/// The HTTP/2 frames of the bytes held, told apart by their 9-byte headers as they are
/// written (the connection begins with the client's 24-byte preface).
#[derive(Debug)]
struct Frames {
    /// Bytes of the preface still to come.
    preface: usize,
    /// A frame header read so far.
    head: [u8; 9],
    head_len: usize,
    /// Bytes of the current frame's payload still to come.
    body_left: usize,
    /// Whether a frame held (or the preface) is anything but a PING acknowledgement.
    urgent: bool,
}

impl Default for Frames {
    fn default() -> Self {
        Frames {
            preface: PREFACE_LEN,
            head: [0; 9],
            head_len: 0,
            body_left: 0,
            urgent: false,
        }
    }
}

/// `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`.
const PREFACE_LEN: usize = 24;
const PING: u8 = 0x6;
const ACK: u8 = 0x1;

impl Frames {
    fn scan(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let n = if self.preface > 0 {
                self.urgent = true;
                let n = self.preface.min(bytes.len());
                self.preface -= n;
                n
            } else if self.body_left > 0 {
                let n = self.body_left.min(bytes.len());
                self.body_left -= n;
                n
            } else {
                let n = (9 - self.head_len).min(bytes.len());
                self.head[self.head_len..self.head_len + n].copy_from_slice(&bytes[..n]);
                self.head_len += n;
                if self.head_len == 9 {
                    let [l0, l1, l2, kind, flags, ..] = self.head;
                    self.body_left = usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2);
                    self.head_len = 0;
                    if kind != PING || flags & ACK == 0 {
                        self.urgent = true;
                    }
                }
                n
            };
            bytes = &bytes[n..];
        }
    }

    /// Whole frames, all of them PING acknowledgements.
    fn only_lazy(&self) -> bool {
        !self.urgent && self.head_len == 0 && self.body_left == 0
    }
}

/// Dials TCP as tonic's own connector does (no scheme check: TLS goes on top; no Nagle),
/// and wraps the socket in [`Coalesced`].
#[derive(Debug, Clone)]
pub(super) struct Connector {
    http: HttpConnector,
}

impl Connector {
    pub(super) fn new() -> Self {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        Connector { http }
    }
}

/// A dial's error as tonic's own connector passes it on, so its chain reads the same.
type DialError = Box<dyn std::error::Error + Send + Sync>;

type Dialled = Pin<Box<dyn Future<Output = Result<Coalesced<TcpStream>, DialError>> + Send>>;

impl Service<Uri> for Connector {
    type Response = Coalesced<TcpStream>;
    type Error = DialError;
    type Future = Dialled;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let clear = uri.scheme_str() != Some("https");
        let dialling = self.http.call(uri);
        Box::pin(async move {
            let io = dialling.await?;
            Ok(Coalesced::new(io.into_inner(), clear))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::task::Waker;

    /// A socket that records each write it is given.
    #[derive(Clone, Default)]
    struct Recorder(Arc<Mutex<Vec<Vec<u8>>>>);

    impl Recorder {
        fn writes(&self) -> Vec<Vec<u8>> {
            self.0.lock().map(|w| w.clone()).unwrap_or_default()
        }
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            if let Ok(mut writes) = self.0.lock() {
                writes.push(buf.to_vec());
            }
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// A socket the peer has closed.
    impl AsyncRead for Recorder {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn frame(kind: u8, flags: u8, stream: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            flags,
            0,
            0,
            0,
            stream,
        ];
        f.extend_from_slice(payload);
        f
    }

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    const HEADERS: u8 = 0x1;
    const DATA: u8 = 0x0;

    fn ping_ack() -> Vec<u8> {
        frame(PING, ACK, 0, &[2, 4, 16, 16, 9, 14, 7, 7])
    }

    fn write(c: &mut Coalesced<Recorder>, bytes: &[u8]) {
        let mut cx = Context::from_waker(Waker::noop());
        assert!(
            matches!(Pin::new(c).poll_write(&mut cx, bytes), Poll::Ready(Ok(n)) if n == bytes.len())
        );
    }

    fn flush(c: &mut Coalesced<Recorder>) -> Poll<io::Result<()>> {
        let mut cx = Context::from_waker(Waker::noop());
        Pin::new(c).poll_flush(&mut cx)
    }

    /// A plaintext connection whose preface went out (its first write), after one pass.
    fn past_the_preface() -> (Recorder, Coalesced<Recorder>) {
        let recorder = Recorder::default();
        let mut c = Coalesced::new(recorder.clone(), true);
        write(&mut c, PREFACE);
        assert!(flush(&mut c).is_pending());
        assert!(flush(&mut c).is_ready());
        (recorder, c)
    }

    #[test]
    fn the_preface_and_requests_are_urgent_and_ping_acknowledgements_are_not() {
        let mut frames = Frames::default();
        frames.scan(PREFACE);
        assert!(!frames.only_lazy(), "the preface must go");

        let mut frames = Frames {
            preface: 0,
            ..Frames::default()
        };
        frames.scan(&ping_ack());
        frames.scan(&ping_ack());
        assert!(frames.only_lazy());
        // A PING that is not an acknowledgement (ours, a keep-alive) must go.
        frames.scan(&frame(PING, 0, 0, &[0; 8]));
        assert!(!frames.only_lazy());

        // A header split across writes is read whole; a payload that looks like a PING
        // acknowledgement is payload.
        let mut frames = Frames {
            preface: 0,
            ..Frames::default()
        };
        let data = frame(DATA, 0, 3, &ping_ack());
        frames.scan(&data[..4]);
        assert!(!frames.only_lazy(), "half a header");
        frames.scan(&data[4..]);
        assert!(!frames.only_lazy());
        assert_eq!((frames.head_len, frames.body_left), (0, 0));
    }

    #[tokio::test]
    async fn a_request_goes_in_one_write_after_the_runtime_has_run_once() {
        let recorder = Recorder::default();
        let mut c = Coalesced::new(recorder.clone(), true);
        write(&mut c, PREFACE);
        assert!(
            flush(&mut c).is_pending(),
            "the first flush lets the runtime run"
        );
        assert!(recorder.writes().is_empty());
        assert!(flush(&mut c).is_ready());
        assert_eq!(recorder.writes(), vec![PREFACE.to_vec()]);

        // HEADERS, then (after the body task ran) DATA: one write.
        let headers = frame(HEADERS, 0x4, 3, &[0x83; 20]);
        let data = frame(DATA, 0x1, 3, &[7; 30]);
        write(&mut c, &headers);
        assert!(flush(&mut c).is_pending());
        write(&mut c, &data);
        assert!(flush(&mut c).is_ready());
        let writes = recorder.writes();
        assert_eq!(writes.len(), 2);
        assert_eq!(writes[1], [headers, data].concat());
    }

    #[tokio::test]
    async fn a_ping_acknowledgement_waits_for_company_or_its_time() {
        let (recorder, mut c) = past_the_preface();

        // Alone, it waits; a request's frames take it along.
        write(&mut c, &ping_ack());
        assert!(flush(&mut c).is_pending());
        assert!(flush(&mut c).is_pending());
        let headers = frame(HEADERS, 0x5, 5, &[0x83; 10]);
        write(&mut c, &headers);
        assert!(flush(&mut c).is_pending(), "the runtime runs once");
        assert!(flush(&mut c).is_ready());
        assert_eq!(recorder.writes()[1], [ping_ack(), headers].concat());

        // Alone for LAZY_HOLD, it goes by itself.
        write(&mut c, &ping_ack());
        let started = tokio::time::Instant::now();
        std::future::poll_fn(|cx| Pin::new(&mut c).poll_flush(cx))
            .await
            .unwrap_or_else(|e| panic!("flush: {e}"));
        assert!(started.elapsed() >= LAZY_HOLD);
        assert_eq!(recorder.writes()[2], ping_ack());

        // Under TLS the bytes are not read: everything goes after one pass.
        let recorder = Recorder::default();
        let mut c = Coalesced::new(recorder.clone(), false);
        write(&mut c, &ping_ack());
        assert!(flush(&mut c).is_pending());
        assert!(flush(&mut c).is_ready());
        assert_eq!(recorder.writes(), vec![ping_ack()]);
    }

    #[tokio::test]
    async fn once_the_socket_has_ended_a_flush_does_not_wait() {
        let (recorder, mut c) = past_the_preface();
        let mut room = [0u8; 64];
        let mut buf = hyper::rt::ReadBuf::new(&mut room);
        let mut cx = Context::from_waker(Waker::noop());
        assert!(matches!(
            Pin::new(&mut c).poll_read(&mut cx, buf.unfilled()),
            Poll::Ready(Ok(()))
        ));
        assert!(c.ended, "end of stream");
        write(&mut c, &ping_ack());
        assert!(flush(&mut c).is_ready());
        write(&mut c, &frame(HEADERS, 0x5, 7, &[0x83; 10]));
        assert!(flush(&mut c).is_ready());
        assert_eq!(recorder.writes().len(), 3);
    }
}
