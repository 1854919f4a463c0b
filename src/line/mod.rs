//! The waiting line under a name: who is ahead of whom ([`mode`]), joining, waiting one's
//! turn and leaving it ([`queue`]).

pub(crate) mod mode;
pub(crate) mod queue;
