//! The admin commands: `status`, `gc`, `doctor` and `configure`, each returning a typed report
//! that [`report::render`] turns into text or JSON.

pub mod cdi;
pub mod configure;
pub mod doctor;
pub mod engines;
pub mod events;
pub mod gc;
pub mod metrics;
pub mod report;
pub mod serve;
pub mod status;
