//! Routed experts on the GPU: the fixed slot arena and the slot table the expert kernels read.

pub mod arena;
pub mod slot_table;

pub use arena::SlotArena;
pub use slot_table::SlotTable;
