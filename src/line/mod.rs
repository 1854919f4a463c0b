//! The waiting line under a name: who is ahead of whom ([`mode`]), joining it and reading
//! one's place ([`queue`]), waiting one's turn ([`wait`]): at the back of a long line on one
//! lookout key ([`behind`]), at the front crossing off the keys ahead as they go
//! ([`crossing`]).

pub(crate) mod behind;
pub(crate) mod crossing;
pub(crate) mod mode;
pub(crate) mod queue;
pub(crate) mod wait;
