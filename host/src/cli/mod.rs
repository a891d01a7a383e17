//! The subcommands that need more than a few lines.

pub(crate) mod demo;
pub(crate) mod run;
