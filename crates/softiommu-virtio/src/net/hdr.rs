//! `struct virtio_net_hdr_v1` (§5.1.6), the header before every packet in
//! both directions, with its layout taken from `virtio-bindings`.

use std::mem::offset_of;

use virtio_bindings::bindings::virtio_net::virtio_net_hdr_v1;

use crate::spec::net;

/// Bytes of the header.
pub const HDR_LEN: usize = net::HDR_LEN;

const FLAGS: usize = offset_of!(virtio_net_hdr_v1, flags);
const GSO_TYPE: usize = offset_of!(virtio_net_hdr_v1, gso_type);
const NUM_BUFFERS: usize = offset_of!(virtio_net_hdr_v1, num_buffers);

/// The header of a packet without offloads: everything zero, `gso_type`
/// NONE, and `num_buffers` 1 on receive (§5.1.6.4: without
/// `VIRTIO_NET_F_MRG_RXBUF` the device sets it to 1; the driver leaves it 0
/// on transmit).
pub fn plain(receive: bool) -> [u8; HDR_LEN] {
    let mut h = [0u8; HDR_LEN];
    h[GSO_TYPE] = net::GSO_NONE;
    if receive {
        h[NUM_BUFFERS..NUM_BUFFERS + 2].copy_from_slice(&1u16.to_le_bytes());
    }
    h
}

/// `(flags, gso_type)` of a header.
pub fn offloads(h: &[u8; HDR_LEN]) -> (u8, u8) {
    (h[FLAGS], h[GSO_TYPE])
}

/// `num_buffers` of a header.
pub fn num_buffers(h: &[u8; HDR_LEN]) -> u16 {
    u16::from_le_bytes([h[NUM_BUFFERS], h[NUM_BUFFERS + 1]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_v1_header_is_twelve_bytes_with_num_buffers_last() {
        assert_eq!(HDR_LEN, 12);
        assert_eq!(NUM_BUFFERS, 10);
        let rx = plain(true);
        assert_eq!(num_buffers(&rx), 1);
        assert_eq!(offloads(&rx), (0, 0));
        assert_eq!(num_buffers(&plain(false)), 0);
    }
}
