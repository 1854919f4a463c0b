//! A unary request's body handed to HTTP/2 whole, so that its message and its end go out
//! in one DATA frame.
//!
//! tonic encodes a request as a stream of messages, and that stream only finds out it has
//! ended when it is polled again after its one message. hyper sends what it gets as it gets
//! it: the message in one DATA frame, then, once HTTP/2 has assigned the stream capacity
//! again (the next pass of the connection task), an empty DATA frame that ends the stream.
//! For a message of more than about 250 bytes that second pass came after the first write:
//! every uncontended acquire (whose Txn is about 370 bytes) cost two socket writes, two
//! reads on etcd's side, where one does (issue 49; `strace` counted 3 writes per lock +
//! release against 2 for the same Txns when small).
//!
//! [`Channel`] wraps tonic's channel and, before a request leaves, polls its body once or
//! twice (a message of ours is encoded at once, so that never waits): a body that has
//! given its message and ended goes out as one frame that ends the stream. A body that
//! has more to come (a watch stream's requests) keeps the frames read from it and goes on
//! as before; nothing is lost or reordered.

use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http_body::{Body as _, Frame, SizeHint};
use tonic::Status;
use tonic::body::Body;
use tower_service::Service;

/// tonic's channel, whose requests' bodies go out whole when they are ready whole.
#[derive(Clone, Debug)]
pub(crate) struct Channel(tonic::transport::Channel);

impl From<tonic::transport::Channel> for Channel {
    fn from(channel: tonic::transport::Channel) -> Channel {
        Channel(channel)
    }
}

impl Service<http::Request<Body>> for Channel {
    type Response = http::Response<Body>;
    type Error = tonic::transport::Error;
    type Future = tonic::transport::channel::ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        self.0.call(request.map(whole))
    }
}

/// `body`, with what it has ready read ahead: when that is all of it, a body that knows it
/// ends after its last frame.
fn whole(mut body: Body) -> Body {
    // A waker that does nothing is enough: a body that is not ready registers it, and
    // HTTP/2 polls the body again with its own waker before it waits on it.
    let mut cx = Context::from_waker(Waker::noop());
    let first = match Pin::new(&mut body).poll_frame(&mut cx) {
        Poll::Ready(Some(frame)) => frame,
        Poll::Ready(None) => return Body::empty(),
        Poll::Pending => return body,
    };
    let (second, rest) = match Pin::new(&mut body).poll_frame(&mut cx) {
        Poll::Ready(None) => (None, None),
        Poll::Ready(Some(frame)) => (Some(frame), Some(body)),
        Poll::Pending => (None, Some(body)),
    };
    Body::new(ReadAhead {
        ahead: [Some(first), second],
        rest,
    })
}

type Polled = Result<Frame<Bytes>, Status>;

/// The frames read ahead from a body (in order, taken out as they go), then the rest of
/// it (`None`: it had ended).
struct ReadAhead {
    ahead: [Option<Polled>; 2],
    rest: Option<Body>,
}

impl http_body::Body for ReadAhead {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Polled>> {
        if let Some(frame) = self.ahead.iter_mut().find_map(Option::take) {
            return Poll::Ready(Some(frame));
        }
        match self.rest.as_mut() {
            Some(rest) => Pin::new(rest).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ahead.iter().all(Option::is_none)
            && self.rest.as_ref().is_none_or(|rest| rest.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let ahead: u64 = self
            .ahead
            .iter()
            .flatten()
            .filter_map(|frame| frame.as_ref().ok()?.data_ref())
            .map(|data| data.len() as u64)
            .sum();
        match &self.rest {
            None => SizeHint::with_exact(ahead),
            Some(rest) => {
                let rest = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(ahead + rest.lower());
                if let Some(upper) = rest.upper() {
                    hint.set_upper(ahead + upper);
                }
                hint
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};
    use tokio_stream::wrappers::UnboundedReceiverStream;

    fn next(body: &mut Body) -> Poll<Option<Polled>> {
        Pin::new(body).poll_frame(&mut Context::from_waker(Waker::noop()))
    }

    /// The next frame's data, which must be ready.
    fn ready_data(body: &mut Body) -> Option<Bytes> {
        let Poll::Ready(frame) = next(body) else {
            panic!("a frame is ready")
        };
        frame?.ok()?.into_data().ok()
    }

    fn frame(part: &'static [u8]) -> Polled {
        Ok(Frame::data(Bytes::from_static(part)))
    }

    /// A body fed by a channel, as a watch stream's requests are, passed through [`whole`]
    /// after `ready` was sent.
    fn stream_body(ready: &[&'static [u8]]) -> (UnboundedSender<Polled>, Body) {
        let (sender, receiver) = unbounded_channel();
        for part in ready {
            sender.send(frame(part)).unwrap();
        }
        let stream = UnboundedReceiverStream::new(receiver);
        (sender, whole(Body::new(StreamBody(stream))))
    }

    /// A body of one message, ended, as tonic's unary request bodies are: it knows it ends
    /// once its message is out, so the message's DATA frame ends the stream.
    #[test]
    fn a_body_ready_whole_ends_with_its_last_frame() {
        let once = tokio_stream::once(frame(b"txn"));
        let mut body = whole(Body::new(StreamBody(once)));
        assert!(!body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(3));
        assert_eq!(ready_data(&mut body).as_deref(), Some(&b"txn"[..]));
        assert!(body.is_end_stream(), "ended with its one frame");
        assert!(matches!(next(&mut body), Poll::Ready(None)));
    }

    /// A stream's body (a watch's requests) keeps what was read ahead, in order, and goes
    /// on with the rest when it comes.
    #[test]
    fn a_stream_keeps_its_frames_in_order_and_the_rest_follows() {
        let (sender, mut body) = stream_body(&[b"one", b"two"]);
        assert!(!body.is_end_stream());
        assert_eq!(ready_data(&mut body).as_deref(), Some(&b"one"[..]));
        assert_eq!(ready_data(&mut body).as_deref(), Some(&b"two"[..]));
        assert!(next(&mut body).is_pending(), "nothing more yet");
        sender.send(frame(b"three")).unwrap();
        assert_eq!(ready_data(&mut body).as_deref(), Some(&b"three"[..]));
        drop(sender);
        assert!(matches!(next(&mut body), Poll::Ready(None)));
    }

    /// A body with nothing ready yet is passed on untouched.
    #[test]
    fn a_body_not_ready_is_passed_on() {
        let (sender, mut body) = stream_body(&[]);
        assert!(next(&mut body).is_pending());
        sender.send(frame(b"late")).unwrap();
        assert_eq!(ready_data(&mut body).as_deref(), Some(&b"late"[..]));
    }

    /// A stream of frames as an HTTP body (what `http_body_util::StreamBody` does).
    struct StreamBody<S>(S);

    impl<S> http_body::Body for StreamBody<S>
    where
        S: tokio_stream::Stream<Item = Polled> + Unpin,
    {
        type Data = Bytes;
        type Error = Status;

        fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Polled>> {
            Pin::new(&mut self.0).poll_next(cx)
        }
    }
}
