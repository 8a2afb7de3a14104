#!/bin/bash
# Two copies of libpsmclient in one process, both in use: the drop-in
# libpsm2.so.2 and libpsmclient.so.0 (each links the client statically, as
# mca_mtl_psmd.so does), loaded side by side by tests/programs/two_copies.
# Fails if their static initializers clash (protobuf's descriptor pool) or
# their control calls or data paths interfere.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/workdir.sh" psmd-two
source "$root/tests/mpi/private_psmd.sh"
start_psmd
before=$(sent)
"$root/tests/programs/two_copies" "$root/client/libpsm2.so.2" "$root/client/libpsmclient.so.0"
status=$?
after=$(sent)
echo "two_copies_test: exit $status; psmd carried $((after - before)) messages"
((status == 0 && after > before))
