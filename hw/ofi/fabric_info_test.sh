#!/usr/bin/env bash
# psmd --fabric-info lists the providers of this node that can serve psmd's
# ofi fabric (both that the tests use among them, on loopback) and exits 0;
# narrowed to a provider this node lacks, it says so and exits 1.
set -uo pipefail
psmd=$1
out=$("$psmd" --fabric-info) || { echo "FAIL: exit $?"; exit 1; }
echo "$out" | head -3
for p in "tcp;ofi_rxm" "udp;ofi_rxd"; do
  grep -E "^$p +127\.0\.0\.1/32 +lo .*usable \(--fabric-provider $p\)" <<<"$out" >/dev/null ||
    { echo "FAIL: no usable $p on lo"; exit 1; }
done
none=$("$psmd" --fabric ofi --fabric-provider verbs --fabric-info)
rc=$?
[[ $rc == 1 && $none == *"no libfabric provider matching verbs"* ]] ||
  { echo "FAIL: verbs: exit $rc: $none"; exit 1; }
echo "ok"
