//! virtio-blk (virtio 1.2 §5.2): the device model with several request
//! queues and a bounded set of device threads, its back-ends, the driver
//! on the DMA API, and the host that builds both.
//!
//! ```text
//!  fio-like jobs (one queue each)          interrupt CPUs (optional)
//!  BlkQueue: map_sg, header, post, kick    BlkQueue::reap: unmap_sg, status
//!     | MmioTransport registers, rings (IOVAs)   ^
//!  BlkDevice workers: pop, walk, header, checks, DMA through the unit,
//!     back-end I/O (null / memory / file), status, used ring, interrupt
//! ```

mod backend;
mod completion;
mod config;
mod device;
mod driver;
mod host;
pub mod pattern;
mod queue;
mod request;
mod serve;
mod slow;
mod stats;
mod worker;

pub use backend::{
    BackendConfig, BackendError, BlkBackend, FileBackend, MemoryBackend, NullBackend, DIRECT_ALIGN,
    MAX_MEMORY_CAPACITY, MAX_NULL_CAPACITY,
};
pub use completion::{BlkCompletion, QueueStats, SlotData};
pub use config::{
    BlkConfig, BlkConfigError, BlkGeometry, MAX_QUEUES, MAX_REQUEST_BYTES, MAX_SIZE_MAX,
};
pub use device::{device_id_string, BlkDevice, BlkDeviceConfig, BlkDeviceError};
pub use driver::{BlkDriver, BlkDriverConfig, BlkDriverError, MAX_DRIVER_REQUEST};
pub use host::{BlkHost, BlkHostConfig, BlkHostError};
pub use queue::BlkQueue;
pub use request::{BlkHeader, BlkLimits, BlkOp, BlkPlan, RequestError};
pub use serve::{BlkRequests, Completed, Prepared, ServeError};
pub use slow::{SlowRegion, MAX_HOLD};
pub use stats::{BlkDeviceStats, RequestLog, RequestRecord};
