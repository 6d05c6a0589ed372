//! Real UDP/IPv4/Ethernet frames, as a sender's stack builds them: headers,
//! the payload copied from the user's buffer, the IPv4 header checksum and
//! the UDP checksum over pseudo-header, header and payload (RFC 768, RFC 791,
//! the ones' complement sum of RFC 1071). The device side verifies both.

/// Ethernet header bytes.
pub const ETH_LEN: usize = 14;
/// IPv4 header bytes (no options).
pub const IP_LEN: usize = 20;
/// UDP header bytes.
pub const UDP_LEN: usize = 8;
/// All headers.
pub const HEADERS: usize = ETH_LEN + IP_LEN + UDP_LEN;

/// The addresses of a flow.
#[derive(Debug, Clone, Copy)]
pub struct Flow {
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// Destination MAC.
    pub dst_mac: [u8; 6],
    /// Source IPv4 address.
    pub src_ip: [u8; 4],
    /// Destination IPv4 address.
    pub dst_ip: [u8; 4],
    /// Source UDP port.
    pub src_port: u16,
    /// Destination UDP port (netperf's default data port is 12865's control
    /// peer; any will do).
    pub dst_port: u16,
}

impl Default for Flow {
    fn default() -> Self {
        Self {
            src_mac: [0x02, 0, 0, 0, 0, 1],
            dst_mac: [0x02, 0, 0, 0, 0, 2],
            src_ip: [192, 0, 2, 1],
            dst_ip: [192, 0, 2, 2],
            src_port: 40000,
            dst_port: 9,
        }
    }
}

/// Adds `data` to a ones'-complement running sum (16-bit big-endian words).
fn sum16(mut acc: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// Builds a frame for `payload` into `out` (which must hold
/// `HEADERS + payload.len()` bytes); returns the frame length.
pub fn build(out: &mut [u8], flow: &Flow, ip_id: u16, payload: &[u8]) -> usize {
    let total = HEADERS + payload.len();
    let f = &mut out[..total];
    f[0..6].copy_from_slice(&flow.dst_mac);
    f[6..12].copy_from_slice(&flow.src_mac);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip = ETH_LEN;
    let ip_total = (IP_LEN + UDP_LEN + payload.len()) as u16;
    f[ip] = 0x45;
    f[ip + 1] = 0;
    f[ip + 2..ip + 4].copy_from_slice(&ip_total.to_be_bytes());
    f[ip + 4..ip + 6].copy_from_slice(&ip_id.to_be_bytes());
    f[ip + 6..ip + 8].copy_from_slice(&0x4000u16.to_be_bytes()); // DF
    f[ip + 8] = 64;
    f[ip + 9] = 17;
    f[ip + 10..ip + 12].copy_from_slice(&[0, 0]);
    f[ip + 12..ip + 16].copy_from_slice(&flow.src_ip);
    f[ip + 16..ip + 20].copy_from_slice(&flow.dst_ip);
    let c = fold(sum16(0, &f[ip..ip + IP_LEN]));
    f[ip + 10..ip + 12].copy_from_slice(&c.to_be_bytes());
    let u = ip + IP_LEN;
    let udp_len = (UDP_LEN + payload.len()) as u16;
    f[u..u + 2].copy_from_slice(&flow.src_port.to_be_bytes());
    f[u + 2..u + 4].copy_from_slice(&flow.dst_port.to_be_bytes());
    f[u + 4..u + 6].copy_from_slice(&udp_len.to_be_bytes());
    f[u + 6..u + 8].copy_from_slice(&[0, 0]);
    // The payload copy `sendmsg` does from the user's buffer.
    f[HEADERS..].copy_from_slice(payload);
    let c = udp_checksum(f, udp_len);
    f[u + 6..u + 8].copy_from_slice(&c.to_be_bytes());
    total
}

fn udp_checksum(frame: &[u8], udp_len: u16) -> u16 {
    let ip = ETH_LEN;
    let mut acc = sum16(0, &frame[ip + 12..ip + 20]); // source and destination
    acc += 17 + u32::from(udp_len);
    acc = sum16(acc, &frame[ip + IP_LEN..]);
    match fold(acc) {
        0 => 0xffff, // RFC 768: a computed zero is sent as all ones
        c => c,
    }
}

/// Why a frame was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadFrame {
    /// Shorter than its headers say.
    Truncated,
    /// Not IPv4/UDP.
    NotUdp,
    /// The IPv4 header checksum does not verify.
    IpChecksum,
    /// The UDP checksum does not verify.
    UdpChecksum,
}

/// Verifies a frame as a NIC with checksum offload checking would; returns
/// the payload length.
pub fn verify(f: &[u8]) -> Result<usize, BadFrame> {
    if f.len() < HEADERS {
        return Err(BadFrame::Truncated);
    }
    let ip = ETH_LEN;
    if f[12..14] != [0x08, 0x00] || f[ip] != 0x45 || f[ip + 9] != 17 {
        return Err(BadFrame::NotUdp);
    }
    if fold(sum16(0, &f[ip..ip + IP_LEN])) != 0 {
        return Err(BadFrame::IpChecksum);
    }
    let udp_len = u16::from_be_bytes([f[ip + IP_LEN + 4], f[ip + IP_LEN + 5]]) as usize;
    if udp_len < UDP_LEN || ip + IP_LEN + udp_len > f.len() {
        return Err(BadFrame::Truncated);
    }
    let frame = &f[..ip + IP_LEN + udp_len];
    let mut acc = sum16(0, &frame[ip + 12..ip + 20]);
    acc += 17 + udp_len as u32;
    acc = sum16(acc, &frame[ip + IP_LEN..]);
    if fold(acc) != 0 {
        return Err(BadFrame::UdpChecksum);
    }
    Ok(udp_len - UDP_LEN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_verify_and_corruption_is_caught() {
        let flow = Flow::default();
        for len in [0usize, 1, 32, 1471] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let mut buf = vec![0u8; HEADERS + len];
            let n = build(&mut buf, &flow, 42, &payload);
            assert_eq!(verify(&buf[..n]), Ok(len));
            if len > 0 {
                buf[HEADERS] ^= 0x10;
                assert_eq!(verify(&buf[..n]), Err(BadFrame::UdpChecksum));
                buf[HEADERS] ^= 0x10;
            }
            buf[ETH_LEN + 8] ^= 1; // TTL
            assert_eq!(verify(&buf[..n]), Err(BadFrame::IpChecksum));
        }
        assert_eq!(verify(&[0u8; 10]), Err(BadFrame::Truncated));
    }

    #[test]
    fn the_ip_checksum_matches_a_known_header() {
        // The worked example of RFC 1071's era, from Wikipedia's "IPv4 header
        // checksum": 4500 0073 0000 4000 4011 [b861] c0a8 0001 c0a8 00c7.
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0, 0, 0xc0, 0xa8, 0x00,
            0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(fold(sum16(0, &h)), 0xb861);
    }
}
