//! The market replay: proof, in money and minutes, of what the broker's placement does against
//! the simple strategies users have today.
//!
//! A seeded generator writes a week of three clouds' market ([`trace`], [`generate`]) and a job
//! mix ([`jobs`]); the harness ([`harness`]) replays both through the node's broker, fallback
//! ladder and provider adapters against the cloud simulators on a paused clock, once per
//! strategy ([`strategy`]); the report ([`report`]) reads the simulators' billing ledgers.
//!
//! A tool, not part of the node: nothing depends on this crate.

pub mod generate;
pub mod harness;
pub mod jobs;
pub mod lines;
pub mod plot;
pub mod report;
pub mod strategy;
pub mod trace;

pub use harness::{Options, Outcome, run};
pub use strategy::{Compiled, Strategy};
pub use trace::Trace;
