#!/bin/sh
# The init of the softiommu guest kit's initramfs (built by
# scripts/guest-kit.sh): mounts the pseudo file systems, loads the virtio
# modules, runs the guest side of the test named on the kernel command line
# (softiommu.test=blk|net, softiommu.mib=N) and prints exactly one line that
# starts with SOFTIOMMU-GUEST-RESULT on the serial console, then powers off.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /tmp && mount -t tmpfs tmp /tmp

arg() { # arg NAME DEFAULT: the value of softiommu.NAME= on the command line
  v=$(tr ' ' '\n' </proc/cmdline | sed -n "s/^softiommu\.$1=//p" | tail -n 1)
  echo "${v:-$2}"
}
ms() { # milliseconds since boot, from /proc/uptime (centisecond resolution)
  awk '{ printf "%d\n", $1 * 1000 }' /proc/uptime
}

# Twice: a module whose dependency comes later in the list loads on the second pass.
for pass in 1 2; do
  for m in $(cat /modules.list); do insmod "/modules/$m" 2>/dev/null; done
done

kernel=$(uname -r)
dmar=0
dmesg | grep -q 'DMAR: IOMMU enabled' && dmar=1
policy=$(dmesg | sed -n 's/.*DMA domain TLB invalidation policy: \([a-z]*\) mode.*/\1/p' | tail -n 1)
# The lines the host's test log must show, echoed whatever the console level.
dmesg | grep -E 'Linux version|DMAR: IOMMU enabled|TLB invalidation policy' | sed 's/^/guest-dmesg: /'

test=$(arg test none)
case "$test" in
blk)
  mib=$(arg mib 32)
  dev=
  i=0
  while [ $i -lt 100 ]; do
    [ -b /dev/vda ] && { dev=/dev/vda; break; }
    sleep 0.1
    i=$((i + 1))
  done
  if [ -z "$dev" ]; then
    echo "SOFTIOMMU-GUEST-RESULT test=blk ok=0 kernel=$kernel dmar=$dmar policy=$policy error=no-disk"
  else
    dd if=/dev/urandom of=/tmp/pattern bs=1M count="$mib" 2>/dev/null
    want=$(sha256sum /tmp/pattern | cut -d' ' -f1)
    t0=$(ms)
    dd if=/tmp/pattern of="$dev" bs=1M conv=fsync 2>/dev/null
    werr=$?
    t1=$(ms)
    rm -f /tmp/pattern
    sync
    echo 3 >/proc/sys/vm/drop_caches
    # The host timestamps these two lines as they arrive: the read timed
    # by the host's clock beside the guest's own.
    echo "guest-mark: read-start"
    t2=$(ms)
    got=$(dd if="$dev" bs=1M count="$mib" 2>/dev/null | sha256sum | cut -d' ' -f1)
    t3=$(ms)
    echo "guest-mark: read-end"
    ok=0
    [ "$werr" = 0 ] && [ "$want" = "$got" ] && ok=1
    echo "SOFTIOMMU-GUEST-RESULT test=blk ok=$ok kernel=$kernel dmar=$dmar policy=$policy mib=$mib written=$want read=$got write_ms=$((t1 - t0)) read_ms=$((t3 - t2))"
  fi
  ;;
net)
  # The host's smoltcp peer is 10.0.2.2: its sink on 5555 takes mib MiB
  # and closes; its source on 5556 sends mib MiB and closes.
  mib=$(arg mib 4)
  i=0
  while [ $i -lt 100 ] && [ ! -e /sys/class/net/eth0 ]; do sleep 0.1; i=$((i + 1)); done
  if [ ! -e /sys/class/net/eth0 ]; then
    echo "SOFTIOMMU-GUEST-RESULT test=net ok=0 kernel=$kernel dmar=$dmar policy=$policy error=no-eth0"
  else
    ifconfig lo 127.0.0.1 up
    ifconfig eth0 10.0.2.15 netmask 255.255.255.0 up
    dd if=/dev/urandom of=/tmp/pattern bs=1M count="$mib" 2>/dev/null
    sent=$(sha256sum /tmp/pattern | cut -d' ' -f1)
    t0=$(ms)
    timeout 300 nc 10.0.2.2 5555 </tmp/pattern >/dev/null
    serr=$?
    t1=$(ms)
    got=$(timeout 300 nc 10.0.2.2 5556 </dev/null | sha256sum | cut -d' ' -f1)
    t2=$(ms)
    rm -f /tmp/pattern
    ok=0
    [ "$serr" = 0 ] && ok=1
    echo "SOFTIOMMU-GUEST-RESULT test=net ok=$ok kernel=$kernel dmar=$dmar policy=$policy mib=$mib sent=$sent got=$got send_ms=$((t1 - t0)) recv_ms=$((t2 - t1))"
  fi
  ;;
*)
  echo "SOFTIOMMU-GUEST-RESULT test=$test ok=0 kernel=$kernel dmar=$dmar policy=$policy error=unknown-test"
  ;;
esac
sync
poweroff -f
