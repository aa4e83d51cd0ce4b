//! tollgate's tools that run without a server, over the `tollgate` library and the
//! runtime's argument parsers and progress line (never a server's parts).
//!
//! The tools that run without a server: [`replay`] (a trace through a policy on a
//! virtual clock), [`simulate`] (generated traffic through several policies) and the
//! [`chart`] that draws a simulation; a simulation offers [`traffic`] to each policy
//! and reports each [`run`]; [`overload`] is the closed-loop simulation of
//! concurrency limits against a modelled upstream; [`plot`] charts a CSV of samples
//! (the soak script's); [`usage`] charges usages known after the work
//! (`simulate --usage`).

#![forbid(unsafe_code)]

pub mod chart;
pub mod overload;
pub mod plot;
pub mod replay;
pub mod run;
pub mod simulate;
pub mod traffic;
pub mod usage;
