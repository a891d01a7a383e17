//! The subcommands that need more than a few lines.

pub(crate) mod author;
pub(crate) mod client;
pub(crate) mod demo;
pub(crate) mod progress;
pub(crate) mod run;
pub(crate) mod serve;
pub(crate) mod table;
