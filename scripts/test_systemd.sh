#!/usr/bin/env bash
# Tests psmd under a real systemd: Debian 12's systemd booted as the init of
# a systemd-nspawn container made from the clean root (scripts/clean_root.sh)
# with psmd's packages installed, the shipped units and their sandbox as
# they are. tests/fdstore_test.py plays systemd's part of the protocol; this
# is systemd itself (scripts/test.sh counts it as one result):
#  1. Boot: the units the packages enabled come up; psmctl health answers.
#  2. systemctl restart psmd, eight times in a row, under two verified
#     exchanges (400,000 messages of up to 64 B; 30,000 of up to 192 KiB):
#     both finish intact, no client loses psmd, the generation is 8 (past
#     systemd's default start limit of 5 in 10 s), and systemd's store is
#     empty while psmd serves (NFileDescriptorStore=0).
#  3. The package upgraded under an exchange (dpkg -i; postinst hands psmd
#     over): the exchange finishes intact.
#  4. systemctl reload (SIGHUP) under an exchange: it finishes intact.
#  5. kill -9 of psmd under an exchange: its ranks fail with "lost psmd"
#     within 5 s (psmd does not survive a crash yet: issue 33), systemd starts
#     psmd again (Restart=on-failure), which reports the crash (2 endpoints
#     lost) and serves a new exchange.
#  6. systemctl stop under a held pair ends it (lost psmd); the socket stays,
#     and the next client starts psmd again (socket activation).
#  7. With the fabric drop-in (psmd-fabric.conf): an exchange between the
#     container's psmd and a psmd on the host, across two restarts of the
#     former; the session resumes each time.
# Prints the blackouts the handovers logged.
#
#   scripts/test_systemd.sh [DEBDIR]   (psmd's built .debs; else built here)
#
# Needs root, systemd-container, and the archive apt uses (the packages'
# dependencies). Removes everything it made; the container's processes end
# with it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/clean_root.sh
work=$(mktemp -d /tmp/psmd-systemd-test.XXXXXX)
root=$work/root
machine=psmd-test-$$
nspawn=
leader=
node2=
cleanup() {
  if [[ -n "$node2" ]] && kill -0 "$node2" 2>/dev/null; then
    kill -KILL "$node2"
    wait "$node2" 2>/dev/null || true
  fi
  # The container is thrown away: its init killed, the kernel ends every
  # process of its pid namespace, and nspawn exits.
  if [[ -n "$leader" ]]; then kill -KILL "$leader" 2>/dev/null || true; fi
  if [[ -n "$nspawn" ]] && kill -0 "$nspawn" 2>/dev/null; then
    [[ -n "$leader" ]] || kill -TERM "$nspawn" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$nspawn" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$nspawn" 2>/dev/null || true
  fi
  if [[ -n "$nspawn" ]]; then wait "$nspawn" 2>/dev/null || true; fi
  if mountpoint -q "$root/proc" 2>/dev/null; then umount "$root/proc"; fi
  rm -rf --one-file-system "$work" "/run/systemd/nspawn/propagate/$machine"
}
trap cleanup EXIT
t0=$SECONDS
step() { echo "test_systemd: [$((SECONDS - t0)) s] $*"; }
fail() {
  echo "test_systemd: FAILED: $*" >&2
  if [[ -n "$leader" ]]; then
    echo "--- psmd's journal in the container:" >&2
    in_ct journalctl -u psmd -u psmd.socket --no-pager 2>&1 | tail -40 >&2 || true
  fi
  exit 1
}
ma=$(dpkg-architecture -qDEB_HOST_MULTIARCH)

# ---- the packages, the root, the test program ----
debs=${1:-}
if [[ -z "$debs" ]]; then
  debs=$work/debs
  scripts/build_deb.sh "$debs" >/dev/null || fail "build_deb.sh"
fi
for p in psmd libpsmclient0 psmd-libpsm2; do
  ls "$debs/${p}_"*.deb >/dev/null 2>&1 || fail "no package $p in $debs"
done
made=$(make_clean_root "$root" "$work/debootstrap.log") || fail "$made"
step "$made"
cp /etc/resolv.conf "$root/etc/resolv.conf"
mkdir "$root/root/debs"
for p in psmd libpsmclient0 psmd-libpsm2; do cp "$debs/${p}_"*.deb "$root/root/debs/$p.deb"; done
mount -t proc proc "$root/proc"
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
in_root apt-get update -qq >/dev/null 2>&1 || fail "apt-get update in the root"
in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd systemd-sysv \
  >"$work/apt.log" 2>&1 || { tail -5 "$work/apt.log"; fail "installing systemd in the root"; }
in_root dpkg -i /root/debs/psmd.deb /root/debs/libpsmclient0.deb /root/debs/psmd-libpsm2.deb \
  >"$work/dpkg.log" 2>&1 || true # dependencies missing
in_root env DEBIAN_FRONTEND=noninteractive apt-get -f install -y -qq >"$work/apt.log" 2>&1 ||
  { tail -5 "$work/apt.log"; fail "apt-get -f install of psmd's packages"; }
umount "$root/proc"
bazel build //tests/programs:exchange //daemon:psmd >/dev/null 2>&1 ||
  fail "bazel build //tests/programs:exchange //daemon:psmd"
# Its RUNPATH names Bazel's tree: in the container it loads the packaged
# drop-in (LD_LIBRARY_PATH below), as an application run on psmd does.
bin=$(bazel info bazel-bin 2>/dev/null)
install -m 0755 "$bin/tests/programs/exchange" "$root/usr/local/bin/exchange"
step "systemd, psmd, libpsmclient0 and psmd-libpsm2 installed in the root"

# ---- 1. boot ----
systemd-nspawn -D "$root" -b --register=no --keep-unit -M "$machine" \
  </dev/null >"$work/console.log" 2>&1 &
nspawn=$!
for _ in $(seq 100); do
  leader=$(pgrep -P "$nspawn" || true)
  [[ -n "$leader" && "$(cat "/proc/$leader/comm" 2>/dev/null)" == systemd ]] && break
  leader=
  sleep 0.1
done
[[ -n "$leader" ]] || { tail -20 "$work/console.log"; fail "the container's systemd did not start"; }
in_ct() {
  nsenter -t "$leader" -m -u -i -n -p -- /usr/bin/env -i \
    PATH=/usr/sbin:/usr/bin:/sbin:/bin LD_LIBRARY_PATH="/usr/lib/$ma/psmd" "$@"
}
# (polled: --wait needs D-Bus, which the root does not have)
state=
for _ in $(seq 600); do
  state=$(in_ct systemctl is-system-running 2>/dev/null) || true
  [[ "$state" == running || "$state" == degraded ]] && break
  sleep 0.2
done
[[ "$state" == running || "$state" == degraded ]] ||
  { tail -20 "$work/console.log"; fail "the container did not finish booting: '$state'"; }
for unit in psmd.socket psmd.service; do
  [[ "$(in_ct systemctl is-active "$unit")" == active ]] || fail "$unit is not active after boot"
done
in_ct psmctl health >/dev/null || fail "psmctl health"
step "booted ($state): psmd.socket and psmd.service active, psmctl health answers"

# ---- helpers: pairs of exchange ranks in the container ----
# pair NAME UUID-SUFFIX MESSAGES MAX-SIZE [HOLD-SECONDS]: starts ranks 1 and
# 0; their pids in pair_pids, stderr in /root/NAME/rR.err.
pair() {
  local name=$1 uuid=5053d0d0$(printf '%024d' "$2") r
  mkdir "$root/root/$1"
  pair_pids=()
  for r in 1 0; do
    in_ct /usr/local/bin/exchange --rank "$r" --dir "/root/$name" --uuid "$uuid" --messages "$3" \
      --max-size "$4" --hold-seconds "${5:-0}" >/dev/null 2>"$root/root/$name/r$r.err" &
    pair_pids+=($!)
  done
}
errors() { cat "$root/root/$1/r0.err" "$root/root/$1/r1.err"; }
# finished PIDS...: 0 if every pid exits 0.
finished() {
  local p ok=0
  for p in "$@"; do wait "$p" || ok=1; done
  return $ok
}
health() { in_ct psmctl health --json; }
field() { sed -n "s/.*\"$1\": \([0-9.]*\).*/\1/p" <<<"$2"; }
endpoints_open() {
  local _
  for _ in $(seq 400); do
    [[ "$(field endpoint_count "$(health)")" == "$1" ]] && return 0
    sleep 0.05
  done
  return 1
}

# ---- 2. systemctl restart under two exchanges ----
pair small 1 400000 64
small=("${pair_pids[@]}")
pair large 2 30000 196608
large=("${pair_pids[@]}")
endpoints_open 4 || fail "the two pairs did not open 4 endpoints"
for g in 1 2 3 4 5 6 7 8; do
  out=$(in_ct systemctl restart psmd 2>&1) || fail "systemctl restart psmd ($g): $out"
  h=$(health 2>&1) || fail "psmctl health after restart $g: $h"
  [[ "$(field generation "$h")" == "$g" && "$(field last_carried_endpoints "$h")" == 4 ]] ||
    fail "restart $g did not carry the 4 endpoints over: $h"
  stored=$(in_ct systemctl show -p NFileDescriptorStore --value psmd)
  [[ "$stored" == 0 ]] || fail "systemd's store holds $stored descriptors while psmd serves (restart $g)"
done
finished "${small[@]}" || fail "the small pair across 8 restarts: $(errors small)"
finished "${large[@]}" || fail "the large pair across 8 restarts: $(errors large)"
! grep -q "lost psmd" <(errors small; errors large) || fail "a client lost psmd: $(errors small; errors large)"
step "systemctl restart x8 under two exchanges: both intact, generation 8, the store emptied each time"

# ---- 3. the package upgraded under an exchange ----
pair upgraded 3 400000 4096
endpoints_open 2 || fail "the pair for the upgrade did not open"
in_ct dpkg -i /root/debs/psmd.deb >"$work/upgrade.log" 2>&1 ||
  { cat "$work/upgrade.log"; fail "dpkg -i psmd.deb under a running psmd"; }
finished "${pair_pids[@]}" || { cat "$work/upgrade.log"; fail "the pair across the package upgrade: $(errors upgraded)"; }
[[ "$(field generation "$(health)")" -gt 8 ]] || { cat "$work/upgrade.log"; fail "the upgrade handed nothing over"; }
step "dpkg -i under an exchange: handed over (generation $(field generation "$(health)")), the exchange intact"

# ---- 4. systemctl reload ----
pair reloaded 4 200000 4096
endpoints_open 2 || fail "the pair for the reload did not open"
out=$(in_ct systemctl reload psmd 2>&1) || fail "systemctl reload psmd: $out"
finished "${pair_pids[@]}" || fail "the pair across a reload: $(errors reloaded)"
step "systemctl reload under an exchange: intact"

# ---- 5. kill -9 ----
main_pid=$(in_ct systemctl show -p MainPID --value psmd)
pair killed 5 50000000 64
killed=("${pair_pids[@]}")
endpoints_open 2 || fail "the pair for the kill did not open"
in_ct systemctl kill -s KILL psmd || fail "systemctl kill -s KILL psmd"
killed_at=$SECONDS
for p in "${killed[@]}"; do
  for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$p" 2>/dev/null && fail "a rank still ran 5 s after psmd was killed: $(errors killed)"
  wait "$p" && fail "a rank exited 0 although psmd was killed under it"
done
grep -q "lost psmd" <(errors killed) || fail "the ranks did not say they lost psmd: $(errors killed)"
for _ in $(seq 100); do
  [[ "$(in_ct systemctl is-active psmd)" == active && \
    "$(in_ct systemctl show -p MainPID --value psmd)" != "$main_pid" ]] && break
  sleep 0.1
done
[[ "$(in_ct systemctl show -p NRestarts --value psmd)" == 1 ]] || fail "systemd did not restart psmd once"
h=$(health 2>&1) || fail "psmctl health after the crash: $h"
[[ "$(field crash_restarts "$h")" == 1 && "$(field last_crash_lost_endpoints "$h")" == 2 ]] ||
  fail "psmd did not report the crash and its 2 endpoints: $h"
pair after 6 1000 4096
finished "${pair_pids[@]}" || fail "a pair on the psmd started after the crash: $(errors after)"
step "kill -9 under an exchange: its ranks failed (lost psmd) within $((SECONDS - killed_at)) s, systemd restarted psmd, which reported the crash and serves"

# ---- 6. systemctl stop, then socket activation ----
pair held 7 10 64 5
held=("${pair_pids[@]}")
for _ in $(seq 200); do
  [[ -f "$root/root/held/holding.0" && -f "$root/root/held/holding.1" ]] && break
  sleep 0.05
done
endpoints_open 2 || fail "the held pair did not open"
in_ct systemctl stop psmd.service || fail "systemctl stop psmd"
for p in "${held[@]}"; do wait "$p" && fail "a held rank exited 0 although psmd stopped"; done
grep -q "lost psmd" <(errors held) || fail "the held ranks did not say they lost psmd: $(errors held)"
[[ "$(in_ct systemctl is-active psmd.socket)" == active ]] || fail "psmd.socket stopped with psmd"
pair activated 8 1000 4096
finished "${pair_pids[@]}" || fail "a pair after the stop (socket activation): $(errors activated)"
[[ "$(in_ct systemctl is-active psmd.service)" == active ]] || fail "the socket did not start psmd"
step "systemctl stop ended a held pair (lost psmd); the next client started psmd through its socket"

# ---- 7. with the fabric drop-in: a job across two nodes ----
# Node 1 is the container's psmd with psmd-fabric.conf (its sandbox opened
# to inet sockets and io_uring), node 2 a psmd on the host (the container
# shares its network). No MUNGE here: fabric_auth = "none".
port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
p1=$(port) p2=$(port)
printf '1 node1 1@127.0.0.5:%s\n2 node2 2@127.0.0.6:%s\n' "$p1" "$p2" >"$root/etc/psmd/nodes"
cp "$root/etc/psmd/nodes" "$work/nodes"
sed -i -e 's|^node_id = 0$|node_id = 1|' \
  -e "s|^# fabric_listen = .*|fabric_listen = [\"127.0.0.5:$p1\"]|" \
  -e 's|^# fabric_nodes = "/etc/psmd/nodes"$|fabric_nodes = "/etc/psmd/nodes"|' \
  -e 's|^fabric_auth = "munge"$|fabric_auth = "none"|' "$root/etc/psmd/psmd.toml"
mkdir -p "$root/etc/systemd/system/psmd.service.d"
cp "$root/usr/share/psmd/psmd-fabric.conf" "$root/etc/systemd/system/psmd.service.d/fabric.conf"
in_ct systemctl daemon-reload
in_ct systemctl restart psmd || fail "psmd with the fabric drop-in did not start"
in_ct journalctl -u psmd --no-pager -o cat | grep -q "fabric: node table /etc/psmd/nodes: 2 nodes" ||
  fail "psmd in the container did not read its node table"
"$bin/daemon/psmd" --socket "$work/node2.sock" --config /dev/null \
  --node-id 2 --fabric-listen "127.0.0.6:$p2" --fabric-nodes "$work/nodes" --fabric-auth none \
  >"$work/node2.log" 2>&1 &
node2=$!
for _ in $(seq 100); do [[ -S "$work/node2.sock" ]] && break; sleep 0.1; done
mkdir "$root/root/across"
in_ct /usr/local/bin/exchange --rank 0 --dir /root/across --messages 200000 --max-size 4096 \
  >/dev/null 2>"$root/root/across/r0.err" &
across=($!)
PSMD_SOCKET=$work/node2.sock "$bin/tests/programs/exchange" --rank 1 --dir "$root/root/across" \
  --messages 200000 --max-size 4096 >/dev/null 2>"$root/root/across/r1.err" &
across+=($!)
for _ in $(seq 200); do [[ -f "$root/root/across/rank11.epid" ]] && break; sleep 0.05; done
for g in 1 2; do
  in_ct systemctl restart psmd || fail "systemctl restart psmd with a fabric ($g)"
done
finished "${across[@]}" || { tail -5 "$work/node2.log"; fail "the pair across two nodes and 2 restarts: $(errors across)"; }
kill -TERM "$node2"
wait "$node2" || fail "node 2's psmd did not exit 0 on SIGTERM"
grep -c "the session with node 1 resumed" "$work/node2.log" | grep -qx 2 ||
  { tail -10 "$work/node2.log"; fail "node 2 did not resume its session twice"; }
! in_ct journalctl -u psmd --no-pager -o cat | grep "nothing submitted" ||
  fail "psmd took the sender held for its receiver on node 2 for a doorbell flooder"
step "with psmd-fabric.conf: a job across the container's psmd and another restarted twice under it, intact, the session resumed each time"

blackouts=$(in_ct journalctl -u psmd --no-pager -o cat | sed -n 's/.*blackout \([0-9.]*\) ms.*/\1/p' | tr '\n' ' ')
step "blackouts logged (ms): $blackouts"
echo "test_systemd: ok"
