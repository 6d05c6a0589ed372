//! softiommu's devices as vhost-user back-ends behind a front-end's IOMMU.
//!
//! A front-end (QEMU) with a virtual IOMMU hands the back-end its guest
//! memory (`SET_MEM_TABLE`, shared file descriptors), the rings (as IOVAs
//! once `VIRTIO_F_ACCESS_PLATFORM` is negotiated) and IOTLB updates and
//! invalidations (`IOTLB_MSG`); the back-end asks for what it misses on the
//! back-end channel. This crate implements the back-end side of that
//! protocol itself ([`session`]), because the `vhost` and
//! `vhost-user-backend` crates do not carry IOTLB messages, cannot send a
//! miss, and translate ring addresses as front-end virtual addresses even
//! when they are IOVAs.
//!
//! - [`iotlb`]: the device IOTLB, which takes every range the protocol allows;
//! - [`space`]: translation, misses and the invalidation contract;
//!   its hit path takes no lock (the internal `readers`, `seat`,
//!   `pagecache` and `sync`; model-checked in `loom_tests`); the space
//!   is the `DeviceDma` the shared request code runs over;
//! - [`blk`]: virtio-blk on one split ring;
//! - [`net`]: virtio-net on a receive and a transmit ring, frames on a wire;
//! - [`session`]: the message handling and the ring lifecycle; the
//!   descriptors a front-end hands over are checked for their kind and
//!   never waited on (the internal `peerfd`);
//! - [`side`]: the space as a `DmaSide`, so `softiommu-virtio`'s devices
//!   themselves can run behind a front-end's IOTLB;
//! - [`peer`]: a smoltcp TCP peer on the net back-end's wire;
//! - [`guest`]: a real Linux guest under QEMU for tests and the lab;
//! - [`sched`]: what the host's scheduler did to a thread (where a guest
//!   run's time went on a shared machine).

#![warn(missing_docs)]
#![warn(missing_debug_implementations)]

pub mod blk;
mod device_dma;
pub mod disk;
pub mod error;
pub mod guest;
pub mod iotlb;
#[cfg(all(test, loom))]
mod loom_tests;
pub(crate) mod memtable;
pub mod net;
pub(crate) mod pagecache;
pub mod peer;
pub(crate) mod peerfd;
pub mod proto;
pub(crate) mod queue;
pub(crate) mod readers;
pub mod sched;
pub(crate) mod seat;
pub mod session;
pub mod side;
pub mod space;
#[cfg(all(test, not(loom)))]
mod space_bench;
pub(crate) mod sync;
pub mod testing;
pub(crate) mod wire;

pub use blk::BlkStats;
pub use error::{AccessError, ConfigError, IotlbError, MsgError, SessionError};
pub use net::{NetBackend, NetBackendConfig, NetStats};
pub use session::{
    BlkBackend, BlkBackendConfig, FdStats, SessionEnd, SessionReport, SessionTiming,
};
pub use space::{DmaSpace, IotlbStats};
