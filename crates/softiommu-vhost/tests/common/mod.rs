//! A fake vhost-user front-end over socket pairs: shared memory from a
//! memfd, one ring, IOTLB messages, and a back-end channel it reads misses
//! from — enough to drive the back-end the way QEMU does, and to misbehave.
#![allow(dead_code)]

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::time::Duration;

use softiommu_vhost::proto::{iotlb as m, req, vf};
use softiommu_vhost::testing;
use softiommu_vhost::{BlkBackend, BlkBackendConfig, SessionReport};

pub const MEM_BYTES: usize = 1 << 20;
/// The front-end virtual address the region claims to live at.
pub const UA: u64 = 0x7f00_0000_0000;
pub const RING_IOVA: u64 = 0x10000;
pub const NUM: u16 = 8;
pub const DESC: u64 = RING_IOVA;
pub const AVAIL: u64 = RING_IOVA + 0x100;
pub const USED: u64 = RING_IOVA + 0x200;
pub const HDR_IOVA: u64 = 0x11000;
pub const STATUS_IOVA: u64 = 0x12000;
pub const DATA_IOVA: u64 = 0x20000;
/// Offsets in the memfd (IOVA == offset in these tests).
pub const DISK_BYTES: u64 = 1 << 20;

pub struct FrontEnd {
    pub sock: UnixStream,
    pub chan: UnixStream,
    pub mem: *mut u8,
    pub kick: OwnedFd,
    pub call: OwnedFd,
    pub report: mpsc::Receiver<SessionReport>,
    pub disk: std::path::PathBuf,
    _dir: std::path::PathBuf,
    next_avail: u16,
}

fn eventfd() -> OwnedFd {
    // SAFETY: plain syscall; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: a fresh descriptor we own.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

impl FrontEnd {
    /// A back-end on a fresh disk (filled with 0x5c) and a connected front-end
    /// that negotiated ACCESS_PLATFORM and shared 1 MiB of memory.
    pub fn start(name: &str, miss_timeout: Duration) -> Self {
        let dir =
            std::env::temp_dir().join(format!("softiommu-vhost-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let disk = dir.join("disk.img");
        std::fs::File::create(&disk)
            .unwrap()
            .write_all(&vec![0x5c; DISK_BYTES as usize])
            .unwrap();
        let mut cfg = BlkBackendConfig::new(&disk);
        cfg.miss_timeout = miss_timeout;
        let backend = BlkBackend::open(cfg).unwrap();
        let (sock, be) = UnixStream::pair().unwrap();
        let (tx, report) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(backend.serve(be));
        });
        let (memfd, mem) = testing::shared_memory(c"softiommu-test", MEM_BYTES).unwrap();
        let (chan, be_chan) = UnixStream::pair().unwrap();
        let fe = FrontEnd {
            sock,
            chan,
            mem,
            kick: eventfd(),
            call: eventfd(),
            report,
            disk,
            _dir: dir,
            next_avail: 0,
        };
        fe.chan
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        testing::send(&fe.sock, req::GET_FEATURES, &[], &[], false).unwrap();
        let (_, _, f) = testing::recv(&fe.sock).unwrap();
        let offered = u64::from_le_bytes(f.try_into().unwrap());
        assert_ne!(offered & vf::ACCESS_PLATFORM, 0);
        let want = vf::VERSION_1 | vf::ACCESS_PLATFORM | vf::PROTOCOL_FEATURES;
        assert_eq!(fe.ack(req::SET_FEATURES, &want.to_le_bytes(), &[]), 0);
        let pf = (1u64 << 3) | (1 << 5) | (1 << 9);
        assert_eq!(
            fe.ack(req::SET_PROTOCOL_FEATURES, &pf.to_le_bytes(), &[]),
            0
        );
        assert_eq!(
            fe.ack(req::SET_BACKEND_REQ_FD, &[], &[be_chan.as_raw_fd()]),
            0
        );
        drop(be_chan);
        let mut t = Vec::new();
        t.extend_from_slice(&1u32.to_le_bytes());
        t.extend_from_slice(&0u32.to_le_bytes());
        for v in [0u64, MEM_BYTES as u64, UA, 0] {
            t.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(fe.ack(req::SET_MEM_TABLE, &t, &[memfd.as_raw_fd()]), 0);
        fe
    }

    /// Sends a message asking for a reply-ack; returns the ack's value.
    pub fn ack(&self, request: u32, payload: &[u8], fds: &[i32]) -> u64 {
        testing::send(&self.sock, request, payload, fds, true).unwrap();
        let (code, _, p) = testing::recv(&self.sock).unwrap();
        assert_eq!(code, request);
        u64::from_le_bytes(p.try_into().unwrap())
    }

    pub fn iotlb(&self, kind: u8, iova: u64, size: u64, uaddr: u64, perm: u8) -> u64 {
        let mut p = [0u8; m::MSG_LEN];
        p[0..8].copy_from_slice(&iova.to_le_bytes());
        p[8..16].copy_from_slice(&size.to_le_bytes());
        p[16..24].copy_from_slice(&uaddr.to_le_bytes());
        p[24] = perm;
        p[25] = kind;
        self.ack(req::IOTLB_MSG, &p, &[])
    }

    /// Maps `[iova, +size)` onto the same offsets of the memfd.
    pub fn map(&self, iova: u64, size: u64) {
        assert_eq!(
            self.iotlb(m::UPDATE, iova, size, UA + iova, m::ACCESS_RW),
            0
        );
    }

    /// Sets the ring up and starts it.
    pub fn start_ring(&self) {
        let state = |i: u32, v: u32| (u64::from(i) | (u64::from(v) << 32)).to_le_bytes();
        assert_eq!(self.ack(req::SET_VRING_NUM, &state(0, NUM.into()), &[]), 0);
        assert_eq!(self.ack(req::SET_VRING_BASE, &state(0, 0), &[]), 0);
        let mut a = Vec::new();
        a.extend_from_slice(&0u32.to_le_bytes());
        a.extend_from_slice(&0u32.to_le_bytes());
        for v in [DESC, USED, AVAIL, 0] {
            a.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(self.ack(req::SET_VRING_ADDR, &a, &[]), 0);
        assert_eq!(
            self.ack(
                req::SET_VRING_CALL,
                &0u64.to_le_bytes(),
                &[self.call.as_raw_fd()]
            ),
            0
        );
        assert_eq!(
            self.ack(
                req::SET_VRING_KICK,
                &0u64.to_le_bytes(),
                &[self.kick.as_raw_fd()]
            ),
            0
        );
        assert_eq!(self.ack(req::SET_VRING_ENABLE, &state(0, 1), &[]), 0);
    }

    pub fn poke(&self, off: u64, bytes: &[u8]) {
        assert!(off as usize + bytes.len() <= MEM_BYTES);
        // SAFETY: inside the mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.mem.add(off as usize), bytes.len())
        };
    }

    pub fn peek(&self, off: u64, len: usize) -> Vec<u8> {
        assert!(off as usize + len <= MEM_BYTES);
        let mut v = vec![0u8; len];
        // SAFETY: inside the mapping.
        unsafe { std::ptr::copy_nonoverlapping(self.mem.add(off as usize), v.as_mut_ptr(), len) };
        v
    }

    /// Queues a read of `len` bytes from sector 0 into DATA_IOVA and kicks.
    pub fn submit_read(&mut self, len: u32) {
        self.submit_read_segs(&[(DATA_IOVA, len)]);
    }

    /// Queues a read from sector 0 into the given data segments and kicks.
    pub fn submit_read_segs(&mut self, segs: &[(u64, u32)]) {
        self.submit_request(0, segs); // VIRTIO_BLK_T_IN
    }

    /// Queues a request of type `ty` at sector 0 with the given writable
    /// data segments, and kicks.
    pub fn submit_request(&mut self, ty: u32, segs: &[(u64, u32)]) {
        let mut hdr = [0u8; 16];
        hdr[0..4].copy_from_slice(&ty.to_le_bytes());
        self.poke(HDR_IOVA, &hdr);
        self.poke(STATUS_IOVA, &[0xee]);
        let d = |addr: u64, len: u32, flags: u16, next: u16| {
            let mut b = [0u8; 16];
            b[0..8].copy_from_slice(&addr.to_le_bytes());
            b[8..12].copy_from_slice(&len.to_le_bytes());
            b[12..14].copy_from_slice(&flags.to_le_bytes());
            b[14..16].copy_from_slice(&next.to_le_bytes());
            b
        };
        assert!(segs.len() + 2 <= usize::from(NUM));
        self.poke(DESC, &d(HDR_IOVA, 16, 1, 1));
        for (i, &(iova, len)) in segs.iter().enumerate() {
            let i = i as u16 + 1;
            self.poke(DESC + 16 * u64::from(i), &d(iova, len, 1 | 2, i + 1));
        }
        let st = segs.len() as u64 + 1;
        self.poke(DESC + 16 * st, &d(STATUS_IOVA, 1, 2, 0));
        let slot = u64::from(self.next_avail % NUM);
        self.poke(AVAIL + 4 + 2 * slot, &0u16.to_le_bytes());
        self.next_avail = self.next_avail.wrapping_add(1);
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        self.poke(AVAIL + 2, &self.next_avail.to_le_bytes());
        let one = 1u64;
        // SAFETY: 8 bytes to an eventfd.
        unsafe { libc::write(self.kick.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Waits until the used index reaches `n` (bounded).
    pub fn wait_used(&self, n: u16, within: Duration) -> bool {
        let t = std::time::Instant::now();
        while t.elapsed() < within {
            let v = self.peek(USED + 2, 2);
            if u16::from_le_bytes([v[0], v[1]]) == n {
                return true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        false
    }

    /// Reads one back-end request (a miss): `(request, iova, perm, type)`.
    pub fn read_miss(&self) -> (u32, u64, u8, u8) {
        let (code, _, p) = testing::recv(&self.chan).unwrap();
        (
            code,
            u64::from_le_bytes(p[0..8].try_into().unwrap()),
            p[24],
            p[25],
        )
    }
}
