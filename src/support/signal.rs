//! A one-time broadcast: `fire()` disconnects every receiver at once, so
//! `crossbeam_channel::select!` and `recv()` see it everywhere without a thread. Guards use
//! it for "lost".

use std::sync::Mutex as StdMutex;

use crossbeam_channel::{Receiver, Sender};
use tokio_util::sync::CancellationToken;

pub(crate) struct Signal {
    /// Dropped on fire: that is what disconnects the receivers.
    tx: StdMutex<Option<Sender<()>>>,
    rx: Receiver<()>,
    /// Cancelled on fire too, for async waits that must end with it.
    token: Option<CancellationToken>,
}

impl Signal {
    pub(crate) fn new() -> Signal {
        let (tx, rx) = crossbeam_channel::bounded(0);
        Signal {
            tx: StdMutex::new(Some(tx)),
            rx,
            token: None,
        }
    }

    /// A signal whose firing also cancels `token`.
    pub(crate) fn cancelling(token: CancellationToken) -> Signal {
        Signal {
            token: Some(token),
            ..Signal::new()
        }
    }

    /// Fires once; returns whether this call fired it.
    pub(crate) fn fire(&self) -> bool {
        let fired = self.sender().take().is_some();
        if let Some(token) = &self.token {
            token.cancel();
        }
        fired
    }

    pub(crate) fn is_fired(&self) -> bool {
        self.sender().is_none()
    }

    fn sender(&self) -> std::sync::MutexGuard<'_, Option<Sender<()>>> {
        self.tx.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A receiver that becomes ready (disconnected) when the signal fires.
    pub(crate) fn receiver(&self) -> Receiver<()> {
        self.rx.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_once_and_disconnects_every_receiver() {
        let signal = Signal::new();
        let early = signal.receiver();
        assert!(matches!(
            early.try_recv(),
            Err(crossbeam_channel::TryRecvError::Empty)
        ));
        assert!(signal.fire());
        assert!(!signal.fire());
        assert!(signal.is_fired());
        for rx in [early, signal.receiver()] {
            assert!(matches!(
                rx.try_recv(),
                Err(crossbeam_channel::TryRecvError::Disconnected)
            ));
        }
    }
}
