//! Sequences of DMA API calls against a model of what a device may reach.
//!
//! Two devices share one domain. The model knows every live mapping (its
//! DMA address, length, direction, whether it was bounced) and every page
//! unmapped under the deferred policy that no flush has covered yet. A
//! device access inside a live mapping in an allowed direction must
//! succeed; under a translating policy, an access to a page that no live
//! mapping covers must fail unless the page is a permitted stale one
//! (deferred, before the flush); a write to a read-only (non-bounced)
//! mapping must fail. Frees check ownership with their exact errors, and
//! an unmap the model does not know must be refused.

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use softiommu::{
    DeviceSpec, DmaAccessor, DmaAttrs, DmaDirection, DmaError, DmaPolicy, Platform, SgEntry,
    SgMapping, SourceId, PAGE_SIZE,
};

const DATA_PAGES: u64 = 16;

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    To,
    From,
    Bi,
}

impl Dir {
    fn api(self) -> DmaDirection {
        match self {
            Dir::To => DmaDirection::ToDevice,
            Dir::From => DmaDirection::FromDevice,
            Dir::Bi => DmaDirection::Bidirectional,
        }
    }
    fn read(self) -> bool {
        !matches!(self, Dir::From)
    }
    fn write(self) -> bool {
        !matches!(self, Dir::To)
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Pol {
    Passthrough,
    Strict,
    Deferred,
    Bounce,
}

impl Pol {
    fn api(self) -> DmaPolicy {
        match self {
            Pol::Passthrough => DmaPolicy::Passthrough,
            Pol::Strict => DmaPolicy::Strict,
            Pol::Deferred => DmaPolicy::Deferred,
            Pol::Bounce => DmaPolicy::Bounce,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Op {
    Map {
        dev: bool,
        off: u16,
        len: u16,
        dir: Dir,
    },
    Unmap {
        idx: u8,
    },
    /// An unmap at a live mapping's address and length moved by the deltas
    /// (both zero: a correct one).
    UnmapOff {
        idx: u8,
        daddr: i16,
        dlen: i16,
    },
    MapSg {
        dev: bool,
        entries: Vec<(u16, u16)>,
        dir: Dir,
    },
    UnmapSg {
        idx: u8,
    },
    /// An unmap of a live single mapping through the other device
    /// (`other_dev`) and/or in another direction (`dir`): refused unless
    /// another live mapping is exactly that, as DMA-API debug checks.
    UnmapAs {
        idx: u8,
        other_dev: bool,
        dir: Dir,
    },
    /// A sync of `len` bytes at `off` into a live single mapping (past its
    /// end when `off + len` runs over: refused).
    Sync {
        idx: u8,
        off: u16,
        len: u16,
        for_device: bool,
    },
    AllocCoherent {
        dev: bool,
        len: u16,
    },
    /// 0: correct; 1: the other device; 2: a wrong DMA address; 3: a wrong
    /// length of another page order; 4: memory that is not coherent; 5:
    /// another length in the same order.
    FreeCoherent {
        idx: u8,
        how: u8,
    },
    SetPolicy(Pol),
    FlushOwn,
    FlushAll,
    Access {
        dev: bool,
        idx: u8,
        piece: u8,
        off: u16,
        len: u16,
        write: bool,
    },
    /// One byte at `page` pages and `byte` bytes past a live mapping's end
    /// (or before its start).
    ProbeNear {
        dev: bool,
        idx: u8,
        page: i8,
        byte: u16,
        write: bool,
    },
    ProbeRaw {
        dev: bool,
        iova: u64,
        write: bool,
    },
    ProbeUnmapped {
        dev: bool,
        idx: u8,
        off: u16,
        write: bool,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    policy: Pol,
    ops: Vec<Op>,
}

#[derive(Debug, Clone)]
enum Kind {
    Single,
    Sg(SgMapping, Vec<SgEntry>, Vec<u64>),
    Coherent { phys: u64, len: u64 },
}

#[derive(Debug, Clone)]
struct Live {
    dev: usize,
    /// (DMA address, length) of each piece.
    pieces: Vec<(u64, u64)>,
    dir: Dir,
    bounced: bool,
    kind: Kind,
}

fn pages_of(a: u64, len: u64) -> impl Iterator<Item = u64> {
    (a / PAGE_SIZE)..=((a + len - 1) / PAGE_SIZE)
}

struct Model {
    live: Vec<Live>,
    /// Pages of unmapped (non-bounced) mappings, and whether each awaits a
    /// deferred flush (then reachable) or not.
    gone: Vec<(u64, bool)>,
}

impl Model {
    fn covered(&self, page: u64) -> bool {
        self.live.iter().any(|l| {
            l.pieces
                .iter()
                .any(|&(a, n)| pages_of(a, n).any(|p| p == page))
        })
    }
    fn stale(&self, page: u64) -> bool {
        self.gone.iter().any(|&(p, s)| s && p == page)
    }
    fn flushed(&mut self) {
        for g in &mut self.gone {
            g.1 = false;
        }
    }
    fn retire(&mut self, l: &Live, deferred: bool) {
        if l.bounced {
            return;
        }
        for &(a, n) in &l.pieces {
            for p in pages_of(a, n) {
                self.gone.push((p, deferred));
            }
        }
        if self.gone.len() > 4096 {
            self.gone.drain(..2048);
        }
    }
}

fuzz_target!(|input: Input| {
    let spec = |bus| DeviceSpec {
        sid: SourceId::new(bus, 0, 0).unwrap_or_default(),
        unit: 0,
        mask: u64::MAX,
        untrusted: false,
    };
    let p = Platform::builder()
        .memory(32 << 20)
        .policy(input.policy.api())
        .device_spec(spec(1))
        .device_spec(spec(2))
        .build()
        .expect("platform");
    let devs = [&p.devices[0], &p.devices[1]];
    let mut acc = [
        DmaAccessor::for_device(devs[0]).expect("accessor"),
        DmaAccessor::for_device(devs[1]).expect("accessor"),
    ];
    let mut cpu = p.domain.cpu();
    let data = p.mem.alloc_zeroed_frames(4).expect("data");
    let mut m = Model {
        live: Vec::new(),
        gone: Vec::new(),
    };
    let mut buf = vec![0u8; 1 << 16];
    let span = |off: u16, len: u16| {
        let off = u64::from(off) % (DATA_PAGES * PAGE_SIZE);
        let len = (u64::from(len) % (DATA_PAGES * PAGE_SIZE - off)).max(1);
        (data + off, len)
    };
    for op in input.ops.into_iter().take(96) {
        let policy = p.domain.policy();
        let translated = policy.is_translated();
        match op {
            Op::Map { dev, off, len, dir } => {
                let (phys, len) = span(off, len);
                if let Ok(a) = cpu.map(devs[usize::from(dev)], phys, len, dir.api()) {
                    m.live.push(Live {
                        dev: usize::from(dev),
                        pieces: vec![(a, len)],
                        dir,
                        bounced: policy == DmaPolicy::Bounce,
                        kind: Kind::Single,
                    });
                }
            }
            Op::Unmap { idx } => {
                let Some(i) = pick(&m.live, idx, |l| matches!(l.kind, Kind::Single)) else {
                    continue;
                };
                let l = m.live.remove(i);
                let (a, n) = l.pieces[0];
                let res = cpu.unmap(devs[l.dev], a, n, l.dir.api());
                assert!(res.is_ok(), "unmap of a live mapping: {res:?}");
                m.retire(&l, policy == DmaPolicy::Deferred);
            }
            Op::UnmapOff { idx, daddr, dlen } => {
                let Some(i) = pick(&m.live, idx, |l| matches!(l.kind, Kind::Single)) else {
                    continue;
                };
                let (a, n) = m.live[i].pieces[0];
                let a2 = a.wrapping_add_signed(i64::from(daddr));
                let n2 = n.wrapping_add_signed(i64::from(dlen));
                let l = m.live[i].clone();
                // A streaming unmap naming a scatter list's or a coherent
                // buffer's block is refused (blocks carry their kind); the
                // model takes only single mappings below, so an accepted one
                // stops the run (crash-32a79558 and the coherent twin).
                let res = cpu.unmap(devs[l.dev], a2, n2, l.dir.api());
                // Unmaps are exact, as DMA-API debug checks them: the
                // address and length of a live mapping, to the byte, in
                // every policy (the same pages with another start or
                // length are refused).
                if (a2, n2) == (a, n) {
                    assert!(res.is_ok(), "unmap of a live mapping: {res:?}");
                }
                if res.is_ok() {
                    // The mapping taken: one with exactly that address and
                    // length (any live one, not only `l`).
                    let single = |o: &Live| matches!(o.kind, Kind::Single);
                    let taken = m.live.iter().position(|o| {
                        single(o) && o.pieces[0] == (a2, n2) && o.dev == l.dev && o.dir == l.dir
                    });
                    let Some(j) = taken else {
                        panic!(
                            "unmap of {a2:#x}+{n2:#x} accepted; no live mapping is exactly that ({policy:?}, {l:?}); near: {:?}", m.live.iter().filter(|o| o.pieces.iter().any(|p| p.0 / PAGE_SIZE == a2 / PAGE_SIZE)).collect::<Vec<_>>()
                        );
                    };
                    let o = m.live.remove(j);
                    m.retire(&o, policy == DmaPolicy::Deferred);
                }
            }
            Op::UnmapAs {
                idx,
                other_dev,
                dir,
            } => {
                let Some(i) = pick(&m.live, idx, |l| matches!(l.kind, Kind::Single)) else {
                    continue;
                };
                let l = m.live[i].clone();
                let dev = if other_dev { 1 - l.dev } else { l.dev };
                let (a, n) = l.pieces[0];
                let res = cpu.unmap(devs[dev], a, n, dir.api());
                let exact = m.live.iter().position(|o| {
                    matches!(o.kind, Kind::Single)
                        && o.pieces[0] == (a, n)
                        && o.dev == dev
                        && o.dir == dir
                });
                // The asking device's own mapping of those bytes in another
                // direction names the direction, even when it asks about
                // another device's (pass-through: both map the same bytes).
                let own_other_dir = m.live.iter().any(|o| {
                    matches!(o.kind, Kind::Single) && o.pieces[0] == (a, n) && o.dev == dev
                });
                match exact {
                    Some(j) => {
                        assert!(res.is_ok(), "unmap of a live mapping: {res:?}");
                        let o = m.live.remove(j);
                        m.retire(&o, policy == DmaPolicy::Deferred);
                    }
                    None if dev != l.dev && !own_other_dir => {
                        assert!(
                            matches!(res, Err(DmaError::WrongDevice { .. })),
                            "unmap of {l:?} through the other device: {res:?}"
                        );
                    }
                    None => {
                        // The direction named is one the asking device
                        // holds those bytes in (either, if it holds two).
                        let holds = |d: DmaDirection| {
                            m.live.iter().any(|o| {
                                matches!(o.kind, Kind::Single)
                                    && o.pieces[0] == (a, n)
                                    && o.dev == dev
                                    && o.dir.api() == d
                            })
                        };
                        assert!(
                            matches!(res, Err(DmaError::WrongDirection { addr, mapped, asked })
                                if addr == a && asked == dir.api() && holds(mapped)),
                            "unmap of {l:?} as {dir:?}: {res:?}"
                        );
                    }
                }
            }
            Op::Sync {
                idx,
                off,
                len,
                for_device,
            } => {
                let Some(i) = pick(&m.live, idx, |l| matches!(l.kind, Kind::Single)) else {
                    continue;
                };
                let (a, n) = m.live[i].pieces[0];
                let (off, len) = (u64::from(off) % n, u64::from(len).max(1));
                let res = if for_device {
                    cpu.sync_for_device(a + off, len)
                } else {
                    cpu.sync_for_cpu(a + off, len)
                };
                // Another live mapping may hold the range (pass-through
                // maps the same bytes twice): only a range inside this one
                // is sure to be accepted.
                if off + len <= n {
                    assert!(res.is_ok(), "sync inside {a:#x}+{n:#x}: {res:?}");
                }
                assert!(
                    matches!(res, Ok(()) | Err(DmaError::WrongLength { .. })),
                    "sync at {:#x}+{len:#x} of {a:#x}+{n:#x}: {res:?}",
                    a + off
                );
            }
            Op::MapSg { dev, entries, dir } => {
                let sg: Vec<SgEntry> = entries
                    .into_iter()
                    .take(4)
                    .map(|(o, n)| {
                        let (phys, len) = span(o, n);
                        SgEntry { phys, len }
                    })
                    .collect();
                let mut out = vec![0u64; sg.len()];
                if let Ok(sm) = cpu.map_sg(devs[usize::from(dev)], &sg, dir.api(), &mut out) {
                    m.live.push(Live {
                        dev: usize::from(dev),
                        pieces: sg.iter().zip(&out).map(|(e, &a)| (a, e.len)).collect(),
                        dir,
                        bounced: policy == DmaPolicy::Bounce,
                        kind: Kind::Sg(sm, sg, out),
                    });
                }
            }
            Op::UnmapSg { idx } => {
                let Some(i) = pick(&m.live, idx, |l| matches!(l.kind, Kind::Sg(..))) else {
                    continue;
                };
                let l = m.live.remove(i);
                let Kind::Sg(sm, sg, out) = &l.kind else {
                    continue;
                };
                let res = cpu.unmap_sg(devs[l.dev], sm, sg, out, l.dir.api());
                assert!(res.is_ok(), "unmap_sg of a live list: {res:?}");
                m.retire(&l, policy == DmaPolicy::Deferred);
            }
            Op::AllocCoherent { dev, len } => {
                let len = u64::from(len).max(1);
                if let Ok((phys, a)) = cpu.alloc_coherent(devs[usize::from(dev)], len) {
                    // Mapped in whole power-of-two runs of pages.
                    let mapped = len.div_ceil(PAGE_SIZE).next_power_of_two() * PAGE_SIZE;
                    m.live.push(Live {
                        dev: usize::from(dev),
                        pieces: vec![(a, mapped)],
                        dir: Dir::Bi,
                        bounced: false,
                        kind: Kind::Coherent { phys, len },
                    });
                }
            }
            Op::FreeCoherent { idx, how } => {
                let Some(i) = pick(&m.live, idx, |l| matches!(l.kind, Kind::Coherent { .. }))
                else {
                    continue;
                };
                let l = m.live[i].clone();
                let Kind::Coherent { phys, len } = l.kind else {
                    continue;
                };
                let a = l.pieces[0].0;
                let dev = devs[l.dev];
                let other = devs[1 - l.dev];
                match how % 6 {
                    5 => {
                        // Another length in the same page order.
                        let r = cpu.free_coherent(dev, phys, a, len + 1);
                        assert!(matches!(r, Err(DmaError::WrongLength { .. })), "{r:?}");
                    }
                    1 => {
                        let r = cpu.free_coherent(other, phys, a, len);
                        assert!(matches!(r, Err(DmaError::WrongDevice { .. })), "{r:?}");
                    }
                    2 => {
                        let r = cpu.free_coherent(dev, phys, a ^ PAGE_SIZE << 8, len);
                        assert!(matches!(r, Err(DmaError::NotMapped { .. })), "{r:?}");
                    }
                    3 => {
                        let bad = len.div_ceil(PAGE_SIZE).next_power_of_two() * 2 * PAGE_SIZE;
                        let r = cpu.free_coherent(dev, phys, a, bad);
                        assert!(matches!(r, Err(DmaError::WrongLength { .. })), "{r:?}");
                    }
                    4 => {
                        let r = cpu.free_coherent(dev, data, a, len);
                        assert!(matches!(r, Err(DmaError::NotCoherent { .. })), "{r:?}");
                    }
                    _ => {
                        let r = cpu.free_coherent(dev, phys, a, len);
                        assert!(r.is_ok(), "free of a live coherent buffer: {r:?}");
                        m.live.remove(i);
                        // free_coherent flushes its own queue: nothing is
                        // stale any more.
                        m.retire(&l, false);
                        m.flushed();
                    }
                }
            }
            Op::SetPolicy(pol) => {
                let to = pol.api();
                let r = p.domain.set_policy(to);
                if to != policy && to.is_translated() != translated && !m.live.is_empty() {
                    assert!(
                        matches!(r, Err(DmaError::PolicySwitchBusy { .. })),
                        "{policy:?} -> {to:?} with {} live: {r:?}",
                        m.live.len()
                    );
                } else {
                    assert!(r.is_ok(), "{policy:?} -> {to:?}: {r:?}");
                    if policy == DmaPolicy::Deferred {
                        m.flushed();
                    }
                    if to.is_translated() != translated {
                        // The contexts changed and the IOTLB was flushed.
                        m.gone.clear();
                    }
                }
            }
            Op::FlushOwn => {
                let r = cpu.flush_own();
                assert!(r.is_ok(), "{r:?}");
                m.flushed();
            }
            Op::FlushAll => {
                let r = p.domain.flush_all();
                assert!(r.is_ok(), "{r:?}");
                m.flushed();
            }
            Op::Access {
                dev,
                idx,
                piece,
                off,
                len,
                write,
            } => {
                if m.live.is_empty() {
                    continue;
                }
                let l = &m.live[usize::from(idx) % m.live.len()];
                let (a, n) = l.pieces[usize::from(piece) % l.pieces.len()];
                let off = u64::from(off) % n;
                let len = (u64::from(len) % (n - off)).max(1) as usize;
                let acc = &mut acc[usize::from(dev)];
                let r = if write {
                    acc.write(a + off, &buf[..len], DmaAttrs::ORDERED)
                } else {
                    acc.read(a + off, &mut buf[..len], DmaAttrs::ORDERED)
                };
                let allowed = if write { l.dir.write() } else { l.dir.read() };
                if allowed {
                    assert!(
                        r.is_ok(),
                        "{policy:?}: {} of {a:#x}+{off:#x} len {len} in {l:?}: {r:?}",
                        if write { "write" } else { "read" }
                    );
                } else if translated && !l.bounced && !m.stale(a / PAGE_SIZE) {
                    // Pages of a non-bounced mapping are its own.
                    assert!(
                        r.is_err(),
                        "{policy:?}: forbidden direction in {l:?} allowed"
                    );
                }
            }
            Op::ProbeNear {
                dev,
                idx,
                page,
                byte,
                write,
            } => {
                if m.live.is_empty() {
                    continue;
                }
                let l = &m.live[usize::from(idx) % m.live.len()];
                let (a, n) = l.pieces[0];
                let at = if page >= 0 {
                    (a + n).wrapping_add(u64::from(page as u8) * PAGE_SIZE + u64::from(byte))
                } else {
                    a.wrapping_sub(u64::from(page.unsigned_abs()) * PAGE_SIZE + u64::from(byte))
                };
                probe(&p, &m, &mut acc[usize::from(dev)], at, write, &mut buf);
            }
            Op::ProbeRaw { dev, iova, write } => {
                probe(&p, &m, &mut acc[usize::from(dev)], iova, write, &mut buf);
            }
            Op::ProbeUnmapped {
                dev,
                idx,
                off,
                write,
            } => {
                if m.gone.is_empty() {
                    continue;
                }
                let page = m.gone[usize::from(idx) % m.gone.len()].0;
                let at = page * PAGE_SIZE + u64::from(off) % PAGE_SIZE;
                probe(&p, &m, &mut acc[usize::from(dev)], at, write, &mut buf);
            }
        }
    }
});

/// A one-byte device access the model may forbid.
fn probe(p: &Platform, m: &Model, acc: &mut DmaAccessor, at: u64, write: bool, buf: &mut [u8]) {
    let r = if write {
        acc.write(at, &buf[..1], DmaAttrs::ORDERED)
    } else {
        acc.read(at, &mut buf[..1], DmaAttrs::ORDERED)
    };
    if r.is_err() || !p.domain.policy().is_translated() {
        return;
    }
    let page = at / PAGE_SIZE;
    if m.covered(page) || m.stale(page) {
        return;
    }
    // A bounce pool (made as a device attaches, whatever the policy) stays
    // mapped, in IOMMU frames no one else is given: its free slots are not
    // a leak.
    let pool =
        matches!(p.domain.iova_to_phys(at), Ok(Some(t)) if p.mem.is_iommu_frame(t.leaf_phys()));
    if pool {
        return;
    }
    panic!(
        "{:?}: device {} of {at:#x} succeeded; no live mapping covers it ({} live, stale {})",
        p.domain.policy(),
        if write { "write" } else { "read" },
        m.live.len(),
        m.stale(page)
    );
}

/// The index of a live mapping that `f` accepts, chosen by `idx`.
fn pick(live: &[Live], idx: u8, f: impl Fn(&Live) -> bool) -> Option<usize> {
    let c: Vec<usize> = (0..live.len()).filter(|&i| f(&live[i])).collect();
    (!c.is_empty()).then(|| c[usize::from(idx) % c.len()])
}
