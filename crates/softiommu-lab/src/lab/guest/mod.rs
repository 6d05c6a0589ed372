//! `softiommu lab guest`: seed 000 in its own code. A Debian 6.1 guest
//! under QEMU (TCG) writes and reads back a disk on our vhost-user-blk
//! back-end, then exchanges a checksummed TCP transfer over our
//! vhost-user-net back-end, its intel-iommu driver in strict then lazy
//! mode driving the back-end's device IOTLB; the back-end counts updates,
//! invalidations and misses per I/O and its own CPU per I/O. Beside it,
//! the same guest and disk on QEMU's own virtio-blk (strict) as the anchor
//! for guest read time, in the same round.
//!
//! An I/O is one descriptor chain our back-end served: a block request,
//! or a network frame (a TCP segment, an acknowledgement, an ARP frame),
//! transmitted plus received.
//!
//! Guest times are TCG times (an emulated CPU, ~10-100x slower than
//! hardware): only their ratios mean anything, and they are marked so
//! (`‡` in the table, `guest_seconds_basis: "tcg"` in JSON). Without the
//! guest kit (`scripts/guest-kit.sh`) the report says it was skipped and
//! why, in one line.

mod args;
mod priority;
mod render;
mod run;
#[cfg(test)]
mod tests;

pub use args::GuestArgs;
pub use run::run;

use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(600);
/// The mark on guest (TCG) times.
const TCG_MARK: &str = "‡";
/// What `guest_seconds` is, in the JSON.
const TIME_BASIS: &str = "guest_seconds are TCG guest time (QEMU's emulated CPU, 10-100x slower than hardware, shared with the back-end): compare ratios within one run only; device_cpu_us_per_io is host CPU time of the back-end's threads";
