#!/usr/bin/env bash
# The softiommu guest kit: QEMU, a Debian 6.1 kernel and a busybox
# initramfs whose init (scripts/guest-init.sh) runs the guest side of a
# test. Everything comes from the distribution's package manager; nothing
# it fetches or builds goes into git.
#
#   scripts/guest-kit.sh            install packages (as root), fetch, build
#   scripts/guest-kit.sh --no-apt   only fetch the kernel and (re)build the initramfs
#
# The kit lands in $SOFTIOMMU_GUEST_KIT (default: target/guest-kit of this
# checkout): vmlinuz, initramfs.cpio.gz, kernel-release. The guest tests
# (crates/softiommu-vhost/tests/guest_blk.rs, guest_net.rs) look there.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
kit="${SOFTIOMMU_GUEST_KIT:-$root/target/guest-kit}"
apt=1
[ "${1:-}" = "--no-apt" ] && apt=0

if [ "$apt" = 1 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "guest-kit: installing packages needs root (or run with --no-apt after installing qemu-system-x86 busybox-static cpio kmod)" >&2
    exit 2
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends qemu-system-x86 busybox-static cpio kmod >/dev/null
fi
for tool in qemu-system-x86_64 busybox cpio depmod apt-get dpkg-deb; do
  command -v "$tool" >/dev/null || { echo "guest-kit: $tool missing (install qemu-system-x86 busybox-static cpio kmod)" >&2; exit 2; }
done

mkdir -p "$kit"
cd "$kit"

# The newest Debian 6.1 kernel the package index offers (linux-image-6.1.0-N-amd64).
pkg="${SOFTIOMMU_GUEST_KERNEL_PKG:-$(apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-amd64$' | awk '{print $1}' | sort -V | tail -n 1)}"
[ -n "$pkg" ] || { echo "guest-kit: no linux-image-6.1.0-N-amd64 in the package index (apt-get update first)" >&2; exit 2; }
release="${pkg#linux-image-}"
if [ ! -f "kernel/boot/vmlinuz-$release" ]; then
  rm -rf kernel dl && mkdir -p dl
  (cd dl && apt-get download "$pkg" >/dev/null 2>&1 || apt-get download "$pkg")
  dpkg-deb -x dl/*.deb kernel
  rm -rf dl
  depmod -b kernel "$release"
fi
cp "kernel/boot/vmlinuz-$release" vmlinuz
echo "$release" >kernel-release

# The initramfs: static busybox, the virtio modules (virtio_net with its
# dependencies net_failover and failover) in modules.dep order, the init.
mods="kernel/lib/modules/$release"
rm -rf initramfs && mkdir -p initramfs/bin initramfs/modules initramfs/proc initramfs/sys initramfs/dev initramfs/tmp
cp "$(command -v busybox)" initramfs/bin/busybox
ln -sf busybox initramfs/bin/sh
: >initramfs/modules.list
want="kernel/drivers/block/virtio_blk.ko kernel/drivers/virtio/virtio_pci.ko kernel/drivers/net/virtio_net.ko"
for m in $want; do
  deps=$(sed -n "s#^$m: ##p" "$mods/modules.dep")
  # modules.dep lists a module's dependencies nearest first: load in reverse.
  for d in $(echo "$deps" | tr ' ' '\n' | tac) "$m"; do
    [ -z "$d" ] && continue
    base=$(basename "$d")
    grep -qx "$base" initramfs/modules.list || {
      cp "$mods/$d" "initramfs/modules/$base"
      echo "$base" >>initramfs/modules.list
    }
  done
done
cp "$root/scripts/guest-init.sh" initramfs/init
chmod +x initramfs/init
(cd initramfs && find . | cpio -o -H newc --quiet | gzip -1) >initramfs.cpio.gz
rm -rf initramfs
echo "guest-kit: $kit (kernel $release, $(qemu-system-x86_64 --version | head -n 1))"
