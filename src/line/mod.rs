//! The waiting line under a name: who is ahead of whom ([`mode`]), joining it and reading
//! one's place ([`queue`]), waiting one's turn ([`wait`]): at the back of a long line on one
//! lookout key ([`behind`]), at the front crossing off the keys ahead as they go
//! ([`crossing`]); beside the line, the keys that ask a holder to let go ([`request`]); a
//! leader's key handed over to a successor ([`handed`]).

pub(crate) mod behind;
pub(crate) mod crossing;
pub(crate) mod cycles;
pub(crate) mod handed;
pub(crate) mod mode;
pub(crate) mod names;
pub(crate) mod queue;
pub(crate) mod request;
pub(crate) mod wait;
