//! Raw page request descriptors, as a device injects them into its unit's
//! page request queue itself (`Unit::inject_page_request`), for the I/O
//! page fault tests.

use softiommu::hw::PageRequest;
use softiommu::SourceId;

/// The raw descriptor of a read request from `sid`, the last of its
/// group `prgi`, at `addr`.
pub fn read_request(sid: SourceId, prgi: u16, addr: u64) -> [u64; 4] {
    PageRequest {
        sid,
        pasid: None,
        read: true,
        write: false,
        exec: false,
        privileged: false,
        last: true,
        prgi,
        addr,
        private: [0, 0],
    }
    .encode()
}
