#!/usr/bin/env bash
# A real Slurm test cluster on this machine (issue 37), every place of it a
# set of namespaces:
#   scripts/cluster.sh up              builds it and returns once its three
#                                      nodes are idle in Slurm
#   scripts/cluster.sh exec NAME CMD...  runs CMD on node1, node2, node3 or
#                                      ctl with that place's environment
#   scripts/cluster.sh stop|start PLACE DAEMON  stops (by PID), or starts
#                                      again, slurmctld on ctl, or psmd or
#                                      slurmd on a node
#   scripts/cluster.sh down            removes everything it made
#
# Places: ctl (10.77.37.254: the bridge, slurmctld, where srun, sbatch,
# squeue, scancel and scontrol run) and node1..node3 (10.77.37.1-3: a
# slurmd and a psmd each, the psmd on the fabric to the other two). Each
# node's psmd learns the nodes from Slurm: its fabric_nodes_command is
# deploy/slurm/psmd-slurm-nodes, which writes its node table
# (nodeN/fabric_nodes) from `scontrol show nodes`, and its node_id is that
# table's id for the node (psmd-slurm-nodes --self: 9473 for 10.77.37.1,
# the address's low 16 bits). Each
# place is a network, UTS and mount namespace held open by one process (a
# `sleep infinity`, the place's "holder"): its own hostname, its own
# /etc/hosts (the cluster's names), and private /run, /tmp and /dev/shm
# (tmpfs), as separate machines have; so Slurm's PMIx plugin
# (PMIxCliTmpDirBase=/tmp) and Open MPI's session directories do not meet
# between nodes, and a node's psmd listens on /run/psmd/psmd.sock, the
# default path, which ranks find without being told. The veth pairs are made
# inside the namespaces: no cluster link or address exists in the machine's
# own. One munged of the cluster's own (a generated key) authenticates
# Slurm and psmd's fabric. Nodes show a fake Omni-Path adapter
# (scripts/fake_hfi.sh), without which Open MPI's mtl psm2, and so psmd's
# drop-in libpsm2.so.2 under it, does not open.
#
# Everything lives in one directory, $PSMD_CLUSTER_DIR (default
# /tmp/psmd-cluster): configuration (etc/slurm.conf, cgroup.conf, mpi.conf),
# logs (ctl/, nodeN/), spool and state, copies of psmd, psmctl, psmd's Open MPI
# component (components/) and drop-in libpsm2.so.2 (lib/), and run/, a
# directory every user may write in (jobs' working directory; the
# directories above it must let the jobs' users through). `down` ends
# every process of the cluster by PID (the ones it started, then any other
# process in a place's network namespace: slurmstepd, ranks), which removes
# the namespaces and the links with them, and deletes the directory.
# Slurm's step cgroups (proctrack/cgroup, task/cgroup) are the machine's:
# slurm_NODE in each cgroup v1 hierarchy Slurm uses: up refuses while any
# slurmd runs on the machine (another cluster), down removes them.
# psmd's SPANK plugin (deploy/slurm) is in every step: etc/plugstack.conf
# says `required lib/psmd_spank.so psmctl=bin/psmctl`, so each step
# registers with its nodes' psmd and its tasks get the step's job key
# (PSMD_CLUSTER_SPANK=0: not). Every job's end runs deploy/slurm/psmd-epilog
# (slurm.conf Epilog=), which drains a node whose psmd still holds
# anything of the job.
# Needs root. The binaries: $PSMD_BIN, $PSMCTL_BIN, $PSMD_MTL_COMPONENT,
# $PSMD_DROPIN, $PSMD_SPANK_PLUGIN, else Bazel's outputs (and the scripts of
# deploy/slurm from the tree) (bazel build
# //daemon:psmd //tools:psmctl //ompi:mca_mtl_psmd.so //client:libpsm2.so.2
# //deploy/slurm:psmd_spank.so).
set -euo pipefail
PATH=/usr/sbin:/sbin:$PATH  # slurmctld, slurmd, munged, ip (a test's PATH may lack them)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${PSMD_CLUSTER_DIR:-/tmp/psmd-cluster}
nodes=(node1 node2 node3)
places=(ctl "${nodes[@]}")
net=10.77.37
fabric_port=7400

# addr PLACE: its address on the cluster's bridge.
addr() { [[ $1 == ctl ]] && echo "$net.254" || echo "$net.${1#node}"; }

# holder PLACE: the PID of the process that holds its namespaces.
holder() {
  local pid
  pid=$(cat "$dir/ns/$1" 2>/dev/null) || { echo "cluster: no place $1 (is the cluster up?)" >&2; return 1; }
  echo "$pid"
}

# in_place PLACE CMD...: CMD in the place's namespaces, in the current
# directory.
in_place() {
  local pid
  pid=$(holder "$1") || return 1
  shift
  nsenter -t "$pid" -n -u -m --wd="$PWD" -- "$@"
}

# place_env PLACE: the environment of a place, as NAME=VALUE words.
place_env() {
  echo "SLURM_CONF=$dir/etc/slurm.conf PATH=$dir/bin:$PATH"
  [[ $1 == ctl ]] || echo "PSMD_SOCKET=/run/psmd/psmd.sock"
}

# start PLACE NAME CMD...: a daemon in a place, in the background, its
# output in $dir/PLACE/NAME.out, its PID recorded for down.
start() {
  local place=$1 name=$2 pid
  shift 2
  pid=$(holder "$place")
  # nsenter execs CMD (no PID namespace): $! is the daemon's PID.
  nsenter -t "$pid" -n -u -m --wd="$dir" -- "$@" </dev/null >"$dir/$place/$name.out" 2>&1 &
  echo "$! $place $name" >>"$dir/pids"
  disown  # down ends it, by PID; no job notice from this shell
}

# built PATH: a binary of the build, from Bazel's runfiles or bazel-bin.
built() { if [[ -f "$root/$1" ]]; then echo "$root/$1"; else echo "$root/bazel-bin/$1"; fi; }

# Inside a new place's namespaces (run by unshare): its hostname, loopback,
# /etc/hosts, private /run, /tmp and /dev/shm; then holds them.
init_place() {
  local name=$1
  hostname "$name"
  ip link set lo up
  mount --bind "$dir/etc/hosts" /etc/hosts
  # The cluster's directory (under /tmp) stays visible through the new /tmp.
  mount -t tmpfs -o mode=0755 "cluster-$name-run" /run
  mkdir /run/cluster /run/psmd
  mount --bind "$dir" /run/cluster
  mount -t tmpfs -o mode=1777 "cluster-$name-tmp" /tmp
  mkdir -p "$dir"
  mount --move /run/cluster "$dir"
  rmdir /run/cluster
  if [[ $name == ctl ]]; then
    mount -t tmpfs -o mode=1777 "cluster-$name-shm" /dev/shm
    touch "$dir/ns/$name.ready"
    exec sleep infinity
  fi
  # A node shows an Omni-Path adapter (scripts/fake_hfi.sh, which also gives
  # it a private /dev/shm): Open MPI's mtl psm2 opens only where /dev/hfi1_*
  # exists, and on these nodes loads psmd's drop-in libpsm2.so.2.
  mkdir /run/hfi
  # shellcheck disable=SC2016  # expanded by the inner shell
  PSMD_FAKE_HFI_DIR=/run/hfi exec "$root/scripts/fake_hfi.sh" \
    bash -c 'touch "$1" && exec sleep infinity' holder "$dir/ns/$name.ready"
}

write_config() {
  local n
  mkdir -p "$dir/etc"
  {
    echo "127.0.0.1 localhost"
    for n in "${places[@]}"; do echo "$(addr "$n") $n"; done
  } >"$dir/etc/hosts"
  cat >"$dir/etc/slurm.conf" <<EOF
# The test cluster of scripts/cluster.sh.
ClusterName=psmd
SlurmctldHost=ctl($(addr ctl))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/ctl/state
SlurmctldPidFile=$dir/ctl/slurmctld.pid
SlurmctldLogFile=$dir/ctl/slurmctld.log
SlurmdSpoolDir=$dir/%n/spool
SlurmdPidFile=$dir/%n/slurmd.pid
SlurmdLogFile=$dir/%n/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
DefMemPerCPU=128
MpiDefault=none
PlugStackConfig=$dir/etc/plugstack.conf
Epilog=$dir/bin/psmd-epilog
ReturnToService=2
MailProg=/bin/true
EOF
  for n in "${nodes[@]}"; do
    echo "NodeName=$n NodeAddr=$(addr "$n") CPUs=$(nproc) RealMemory=1024 State=UNKNOWN" >>"$dir/etc/slurm.conf"
  done
  echo "PartitionName=psmd Nodes=ALL Default=YES MaxTime=30 State=UP" >>"$dir/etc/slurm.conf"
  # This machine mounts cgroup v1 controllers under a tmpfs: slurmd's
  # autodetection of the cgroup version fails without this.
  echo "CgroupPlugin=cgroup/v1" >"$dir/etc/cgroup.conf"
  # Each node's /tmp is its own (init_place): the PMIx plugin makes
  # spmix_appdir_UID_JOB.STEP there, which nodes sharing one /tmp collide on.
  echo "PMIxCliTmpDirBase=/tmp" >"$dir/etc/mpi.conf"
  # psmd's SPANK plugin, with the cluster's psmctl (a node's psmd is at the
  # default socket); PSMD_CLUSTER_SPANK=0 leaves it out (a negative control).
  if [[ ${PSMD_CLUSTER_SPANK:-1} == 1 ]]; then
    echo "required $dir/lib/psmd_spank.so psmctl=$dir/bin/psmctl"
  else
    echo "# PSMD_CLUSTER_SPANK=0: without psmd's plugin"
  fi >"$dir/etc/plugstack.conf"
}

# node_cgroups: the cgroups of this machine's slurmd named like the
# cluster's nodes (this Debian build names a node's cgroup slurm_NODE, in
# each controller its plugins use).
node_cgroups() {
  local n
  for n in "${nodes[@]}"; do
    compgen -G "/sys/fs/cgroup/*/slurm_$n" || true
  done
}

# remove_cgroups: removes the cluster's node cgroups, innermost first; a
# cgroup that still holds a process is not removed (and said).
remove_cgroups() {
  local cg
  for cg in $(node_cgroups); do
    find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null ||
      echo "cluster: could not remove $cg (a process in it?)" >&2
  done
}

# wait_for WHAT SECONDS CMD...: until CMD succeeds; else says so, returns 1.
wait_for() {
  local what=$1 limit=$(($2 * 10)) i
  shift 2
  for ((i = 0; i < limit; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "cluster: $what not within $((limit / 10)) s" >&2
  return 1
}

# start_daemon PLACE DAEMON: starts slurmctld (on ctl), or psmd or slurmd (on
# a node), and waits until it serves: slurmctld answers scontrol ping, psmd
# its socket. The cluster comes up this way, and `cluster.sh start` starts
# again a daemon that `cluster.sh stop` stopped.
start_daemon() {
  local place=$1 daemon=$2 id
  case $place/$daemon in
    ctl/slurmctld)
      start ctl slurmctld slurmctld -D -i -f "$dir/etc/slurm.conf"
      wait_for slurmctld 20 in_place ctl env SLURM_CONF="$dir/etc/slurm.conf" scontrol ping ||
        { tail -20 "$dir/ctl/slurmctld.log" >&2; return 1; }
      ;;
    node?/psmd)
      # Its node table comes from Slurm (slurmctld must answer), as its node
      # id: the one the table gives the node.
      id=$(in_place "$place" env SLURM_CONF="$dir/etc/slurm.conf" \
        "$dir/bin/psmd-slurm-nodes" --port "$fabric_port" --self) || return 1
      start "$place" psmd env SLURM_CONF="$dir/etc/slurm.conf" \
        "$dir/bin/psmd" --socket /run/psmd/psmd.sock --node-id "$id" \
        --fabric-listen "$(addr "$place"):$fabric_port" --fabric-nodes "$dir/$place/fabric_nodes" \
        --fabric-nodes-command "$dir/bin/psmd-slurm-nodes --port $fabric_port" \
        --munge-socket "$dir/munge/socket" --log-level "${PSMD_CLUSTER_PSMD_LOG:-warn}"
      wait_for "psmd on $place" 10 in_place "$place" test -S /run/psmd/psmd.sock ||
        { cat "$dir/$place/psmd.out" >&2; return 1; }
      ;;
    node?/slurmd) start "$place" slurmd slurmd -D -N "$place" -f "$dir/etc/slurm.conf" ;;
    *) echo "cluster: no daemon $daemon on $place" >&2; return 2 ;;
  esac
}

# stop_daemon PLACE DAEMON: ends the daemon started there (SIGTERM, by its
# recorded PID; KILL after 10 s) and forgets its PID.
stop_daemon() {
  local pid
  pid=$(awk -v p="$1" -v n="$2" '$2 == p && $3 == n {print $1}' "$dir/pids" | tail -1)
  [[ -n $pid ]] || { echo "cluster: no $2 on $1" >&2; return 1; }
  stop_pids TERM "$pid"
  awk -v pid="$pid" '$1 != pid' "$dir/pids" >"$dir/pids.new" && mv "$dir/pids.new" "$dir/pids"
}

nodes_idle() {
  local states
  states=$(in_place ctl env SLURM_CONF="$dir/etc/slurm.conf" sinfo -h -N -o '%N %t')
  [[ $(grep -c ' idle$' <<<"$states") == "${#nodes[@]}" ]]
}

up() {
  if [[ -e "$dir" ]]; then
    echo "cluster: $dir exists (a cluster is up, or left over: scripts/cluster.sh down)" >&2
    return 1
  fi
  # Slurm's cgroups are the machine's, named by node (slurmd makes them when
  # it starts): one cluster at a time.
  # (A zombie is no slurmd: one that `down` just ended waits for its reaper.)
  local running=() pid
  for pid in $(pgrep -x slurmd); do alive "$pid" && running+=("$pid"); done
  if ((${#running[@]})); then
    echo "cluster: a slurmd runs on this machine (another cluster?): pids ${running[*]}" >&2
    return 1
  fi
  remove_cgroups  # ones a killed run left
  mkdir -p "$dir"/{ns,bin,lib,components,run}
  chmod 0755 "$dir"
  chmod 1777 "$dir/run"
  trap 'echo "cluster: up failed; taking it down" >&2; down' ERR
  cp "${PSMD_BIN:-$(built daemon/psmd)}" "$dir/bin/psmd"
  cp "${PSMCTL_BIN:-$(built tools/psmctl)}" "$dir/bin/psmctl"
  cp "${PSMD_MTL_COMPONENT:-$(built ompi/mca_mtl_psmd.so)}" "$dir/components/mca_mtl_psmd.so"
  cp "${PSMD_DROPIN:-$(built client/libpsm2.so.2)}" "$dir/lib/libpsm2.so.2"
  cp "${PSMD_SPANK_PLUGIN:-$(built deploy/slurm/psmd_spank.so)}" "$dir/lib/psmd_spank.so"
  cp "$root/deploy/slurm/psmd-slurm-nodes" "$root/deploy/slurm/psmd-epilog" "$dir/bin/"
  chmod -R a+rX "$dir"
  write_config
  for p in "${places[@]}"; do mkdir -p "$dir/$p"; done
  mkdir -p "$dir/ctl/state"

  # The cluster's munged (scripts/nodes.sh), its PID recorded like the rest.
  # shellcheck disable=SC2034  # work: start_munged's directory
  local work=$dir pids=()
  # shellcheck source=/dev/null
  source "$root/scripts/nodes.sh"
  start_munged
  echo "${pids[0]} - munged" >>"$dir/pids"

  local p
  for p in "${places[@]}"; do
    unshare -n -u -m --propagation private "$0" _init "$p" </dev/null >"$dir/$p/init.out" 2>&1 &
    echo "$!" >"$dir/ns/$p"
    disown
  done
  for p in "${places[@]}"; do
    wait_for "place $p" 10 test -e "$dir/ns/$p.ready" || { cat "$dir/$p/init.out" >&2; false; }
  done

  # The bridge in ctl; a veth pair per node, made from ctl's namespace with
  # its other end in the node's.
  in_place ctl ip link add br0 type bridge
  in_place ctl ip addr add "$(addr ctl)/24" dev br0
  in_place ctl ip link set br0 up
  for p in "${nodes[@]}"; do
    in_place ctl ip link add "v$p" type veth peer name eth0 netns "$(holder "$p")"
    in_place ctl ip link set "v$p" master br0 up
    in_place "$p" ip addr add "$(addr "$p")/24" dev eth0
    in_place "$p" ip link set eth0 up
  done

  start_daemon ctl slurmctld
  for p in "${nodes[@]}"; do start_daemon "$p" psmd; done
  for p in "${nodes[@]}"; do start_daemon "$p" slurmd; done
  wait_for "3 idle nodes" 60 nodes_idle ||
    { in_place ctl env SLURM_CONF="$dir/etc/slurm.conf" sinfo -N >&2
      for p in "${nodes[@]}"; do tail -5 "$dir/$p/slurmd.log" >&2; done; false; }
  trap - ERR
  echo "cluster: up in $dir: ${nodes[*]} idle; scripts/cluster.sh exec ctl srun ..."
}

# alive PID: the process exists and is not a zombie.
alive() { [[ -e /proc/$1 && $(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) != Z ]]; }

# stop_pids SIGNAL PID...: SIGNAL to each, then up to 10 s for all to end;
# KILL to what is left.
stop_pids() {
  local sig=$1 pid i left
  shift
  (($#)) || return 0
  kill "-$sig" "$@" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    left=0
    for pid; do alive "$pid" && left=1; done
    ((left)) || return 0
    sleep 0.1
  done
  for pid; do alive "$pid" && { echo "cluster: pid $pid outlived SIG$sig; killed" >&2; kill -KILL "$pid" 2>/dev/null; }; done
  return 0
}

# in_namespaces: the PIDs of every process in a place's network namespace,
# holders excluded.
in_namespaces() {
  local inodes=() p pid ns h
  for p in "${places[@]}"; do
    h=$(cat "$dir/ns/$p" 2>/dev/null) || continue
    ns=$(readlink "/proc/$h/ns/net" 2>/dev/null) && inodes+=("$ns")
  done
  ((${#inodes[@]})) || return 0
  for pid in /proc/[0-9]*; do
    pid=${pid#/proc/}
    ns=$(readlink "/proc/$pid/ns/net" 2>/dev/null) || continue
    for h in "${inodes[@]}"; do
      [[ $ns == "$h" ]] && ! grep -qx "$pid" "$dir"/ns/* 2>/dev/null && echo "$pid"
    done
  done
}

down() {
  trap - ERR
  [[ -d "$dir" ]] || { echo "cluster: nothing at $dir"; return 0; }
  local daemons=() munged=() pid place name
  if [[ -f "$dir/pids" ]]; then
    while read -r pid place name; do
      if [[ $name == munged ]]; then munged+=("$pid"); else daemons+=("$pid"); fi
    done <"$dir/pids"
  fi
  # Slurm's daemons and psmd first (their own orderly stop), then whatever
  # else runs in the places (slurmstepd, job processes), then the holders:
  # the namespaces, and the links in them, go with the last of their
  # processes.
  stop_pids TERM "${daemons[@]}"
  local rest
  mapfile -t rest < <(in_namespaces)
  stop_pids KILL "${rest[@]}"
  local holders=()
  for place in "${places[@]}"; do pid=$(cat "$dir/ns/$place" 2>/dev/null) && holders+=("$pid"); done
  stop_pids KILL "${holders[@]}"
  stop_pids TERM "${munged[@]}"
  remove_cgroups
  rm -rf "$dir"
  echo "cluster: down"
}

case ${1:-} in
  up) up ;;
  down) down ;;
  exec)
    [[ $# -ge 3 ]] || { echo "usage: cluster.sh exec NAME CMD..." >&2; exit 2; }
    place=$2
    shift 2
    # shellcheck disable=SC2046  # place_env's words are NAME=VALUE pairs
    in_place "$place" env $(place_env "$place") "$@"
    ;;
  stop | start)
    [[ $# == 3 ]] || { echo "usage: cluster.sh $1 PLACE DAEMON" >&2; exit 2; }
    [[ -f "$dir/pids" ]] || { echo "cluster: not up" >&2; exit 1; }
    "${1}_daemon" "$2" "$3"
    ;;
  _init) init_place "$2" ;;
  *) echo "usage: scripts/cluster.sh up | exec NAME CMD... | stop|start PLACE DAEMON | down" >&2; exit 2 ;;
esac
