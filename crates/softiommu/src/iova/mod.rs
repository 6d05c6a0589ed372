//! IOVA allocation.
