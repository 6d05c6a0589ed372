//! The lab's workload engines (to come).
