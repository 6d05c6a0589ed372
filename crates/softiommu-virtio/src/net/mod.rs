//! virtio-net (virtio 1.2 §5.1): the device model, a wire between two
//! devices, the driver on the DMA API, and smoltcp over the driver.
//!
//! ```text
//!  host A                                            host B
//!  smoltcp (NetStack)                                smoltcp
//!  NetDriver: map ToDevice, post, kick               NetDriver: post FromDevice, unmap when used
//!     | MmioTransport registers, rings (IOVAs)          ^
//!  NetDevice thread: pop, walk, DMA read ----wire----> NetDevice thread: pop, walk, DMA write
//!     (IommuMemory + DmaAccessor via unit A)           (via unit B)
//! ```

mod config;
mod device;
mod dma;
mod driver;
mod frame;
mod hdr;
mod stack;
mod wire;

pub use crate::transport::DeviceMemory;
pub use crate::vring::{DriverRing, RingLayout};
pub use config::{NetConfig, CONFIG_LEN, MAC_OFFSET, MTU_OFFSET, STATUS_OFFSET};
pub use device::{NetDevice, NetDeviceConfig, NetDeviceError, NetDeviceStats};
pub use dma::{NetDma, RingMemory};
pub use driver::{
    DriverError, DriverStats, NetDriver, NetDriverConfig, NetRxToken, NetTxToken, RX_BUDGET,
};
pub use frame::{gather_frame, scatter_frame, FrameFault};
pub use hdr::{num_buffers, offloads, plain as plain_header, HDR_LEN};
pub use stack::NetStack;
pub use wire::{
    wire, LaneStats, Pacer, TxSlot, WireConfig, WirePort, WireRx, WireStats, WireTx,
    ETHERNET_OVERHEAD,
};
