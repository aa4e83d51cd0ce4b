pub use tollgate_core::*;
