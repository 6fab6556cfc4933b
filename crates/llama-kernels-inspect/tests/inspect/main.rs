//! The inspect crate's tests: static checks of the device code's SASS and PTX, and the
//! performance report against its calibrations.

mod perf_report;
mod static_checks;
