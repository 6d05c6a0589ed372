//! How a table treats the CPU caches: coherent walkers, and the flush
//! method for those that are not (VT-d `ECAP_REG.C`).

use super::*;

/// How a [`VtdPageTable`] treats the CPU caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VtdConfig {
    /// Whether the walker snoops the CPU caches (`ECAP.C` = 1).
    pub coherent: bool,
    /// How lines are flushed when it does not.
    pub flush: FlushMethod,
}

impl Default for VtdConfig {
    fn default() -> Self {
        Self::coherent()
    }
}

impl VtdConfig {
    /// A coherent walker: no flushes.
    pub fn coherent() -> Self {
        Self {
            coherent: true,
            flush: FlushMethod::detect(),
        }
    }

    /// A walker that does not snoop: flushes with the best method this CPU
    /// has ([`FlushMethod::detect`]).
    pub fn non_coherent() -> Self {
        Self {
            coherent: false,
            ..Self::coherent()
        }
    }

    /// As the unit's extended capability register says (bit [`ECAP_C`]).
    pub fn from_ecap(ecap: u64) -> Self {
        Self {
            coherent: ecap & ECAP_C != 0,
            ..Self::coherent()
        }
    }

    /// The same, flushing with `method`.
    pub fn with_flush(self, method: FlushMethod) -> Self {
        Self {
            flush: method,
            ..self
        }
    }
}
