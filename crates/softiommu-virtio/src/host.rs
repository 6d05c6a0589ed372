//! Hosts (to come).
