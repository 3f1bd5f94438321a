//! The shared vocabulary: words every layer uses and that do nothing themselves (modes,
//! GPUs and compute modes, isolation domains and their limits, safe names, sizes, capped
//! reading, error chains).

pub mod chain;
pub mod domain;
pub mod gpu;
pub mod memcap;
pub mod mode;
pub mod names;
pub mod quantity;
pub mod read;
pub mod size;

pub use chain::chain;
pub use domain::{Isolation, Limits};
pub use gpu::{ComputeMode, Gpu, Inventory, InventoryError};
pub use mode::{Mode, Timeslice};
pub use names::is_safe_name;
pub use read::{read_capped, text};
