//! Routed experts on the GPU: the fixed slot arena and the slot table the expert kernels read.

pub mod arena;
pub mod cache_model;
pub mod eam;
pub mod io_pool;
pub mod policy;
pub mod predictor;
pub mod residency;
pub mod route_memory;
pub mod slot_table;
pub mod source;
pub mod tiled_source;
pub mod trace;

pub use arena::{SlotArena, SlotLayout};
pub use slot_table::SlotTable;
