//! The waiting line under a name: who is ahead of whom ([`mode`]), joining, waiting one's
//! turn and leaving it ([`queue`]), crossing off the keys ahead as they go ([`crossing`]).

pub(crate) mod behind;
pub(crate) mod crossing;
pub(crate) mod mode;
pub(crate) mod queue;
