//! Sizing a Memcached from memcached's own signals: the members' `stats` (`stats`), and the
//! decision they lead to (`decide`, pure). The controller reads, decides and applies
//! (controller/autoscale.rs).

pub mod decide;
pub mod stats;

pub use decide::{Decision, History, MemberStats, Reading, Reason, decide};
