//! The ground floor every layer may use: the seeded random stream ([`rng`]), the process's
//! memory ([`peak_rss`]) and the model directory's file names ([`model_files`]).

pub mod model_files;
pub mod peak_rss;
pub mod rng;
