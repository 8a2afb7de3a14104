#!/bin/bash
# fake_hfi.sh CMD [ARGS...]: runs CMD in a private mount namespace that shows
# an Omni-Path adapter (/dev/hfi1_0 and an ACTIVE port 1 under
# /sys/class/infiniband), as Intel's libpsm2 and Open MPI's mtl/psm2 require
# before they will use shared memory. The host's /dev and /sys are untouched:
# everything is mounted inside the namespace and vanishes with it. Needs root
# (or CAP_SYS_ADMIN). Exit status is CMD's.
set -euo pipefail

if [[ "${PSMD_FAKE_HFI_DIR:-}" == "" ]]; then
  # Outside: a mount point for the namespace's private tmpfs, removed however
  # we end (a terminating signal is passed on to the command first).
  dir=$(mktemp -d /tmp/psmd-hfi-XXXXXX)
  PSMD_FAKE_HFI_DIR="$dir" unshare -m --propagation private "$0" "$@" &
  child=$!
  trap 'kill -TERM "$child" 2>/dev/null' TERM INT HUP
  status=0
  wait "$child" || status=$?
  # wait returns early when a signal arrives: wait for the child to finish.
  while kill -0 "$child" 2>/dev/null; do wait "$child" || status=$?; done
  rmdir "$dir"
  exit "$status"
fi

dir=$PSMD_FAKE_HFI_DIR
unset PSMD_FAKE_HFI_DIR
mount -t tmpfs psmd-fake-hfi "$dir"
mkdir -p "$dir/upper" "$dir/work" "$dir/pts" "$dir/class"

# /dev: an overlay adds the device file. /dev/pts is a separate mount that
# the overlay would hide, so it is carried over; /dev/shm becomes a private
# tmpfs, so whatever Intel's libpsm2 leaves there (a killed rank leaves its
# psm2_shm.* segments) vanishes with the namespace instead of piling up on
# the host. Processes that must share memory run in one namespace.
mount --bind /dev/pts "$dir/pts"
mount -t overlay psmd-fake-dev -o "lowerdir=/dev,upperdir=$dir/upper,workdir=$dir/work" /dev
mount -t tmpfs -o mode=1777 psmd-fake-shm /dev/shm
mount --move "$dir/pts" /dev/pts
touch /dev/hfi1_0
chmod 666 /dev/hfi1_0

# /sys/class: sysfs cannot gain a directory, so a copy of its symlinks (which
# are relative, ../../devices/..., and still resolve) plus the fake port.
for class in /sys/class/*; do cp -a "$class" "$dir/class/" 2>/dev/null || true; done
mkdir -p "$dir/class/infiniband/hfi1_0/ports/1"
echo "4: ACTIVE" >"$dir/class/infiniband/hfi1_0/ports/1/state"
mount --bind "$dir/class" /sys/class

export HFI_SYSFS_PATH=/sys/class/infiniband/hfi1_0
export PSM2_DEVICES="${PSM2_DEVICES:-self,shm}"
exec "$@"
