//! The leaves every layer may use: errors, key-value types, cancellation, backoff, clocks,
//! wake-up signals, telemetry, the simulation's seam, test tuning, identities, etcd's error texts and
//! TLS settings. Nothing here imports from a layer above.

pub(crate) mod backoff;
pub(crate) mod cancel;
pub(crate) mod clock;
pub(crate) mod error;
pub(crate) mod etcd_text;
pub(crate) mod identity;
pub(crate) mod kv;
pub(crate) mod signal;
pub(crate) mod sim;
pub(crate) mod telemetry;
#[cfg(feature = "tls")]
pub(crate) mod tls;
pub(crate) mod tuning;
