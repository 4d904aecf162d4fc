#!/usr/bin/env bash
# shellcheck disable=SC2015,SC2016  # `a && b || die` is meant; sh -c scripts are single-quoted
# A multi-host test bed on this one machine (docs/multihost.md): N "hosts", each a Linux network
# namespace with its own address and hostname, on an emulated switch; MPI jobs across them start
# through Open MPI's rsh launcher, with an agent that enters a host's namespace instead of ssh.
#
#   scripts/hosts.sh up N [--rate R | --netem R D] [MOUNTS]    make hosts 1..N (replaces any bed)
#   scripts/hosts.sh down                                      remove the bed and its processes
#   scripts/hosts.sh run N SLOTS [--rate R | --netem R D] [MOUNTS] [--timeout S] -- MPIRUN-ARGS...
#       up N, mpirun across N hosts x SLOTS slots, down whatever happens; exits with mpirun's status
#   scripts/hosts.sh mount I ro PATH | tmpfs SIZE PATH | off   host I's own view of the file system,
#       at once for what runs on it (a job's orted and ranks) and for what it starts later; MOUNTS
#       above are the same as options, repeatable: --readonly I PATH, --tmpfs I SIZE PATH
#   scripts/hosts.sh mpirun SLOTS [--timeout S] -- MPIRUN-ARGS...   mpirun on the bed that is up
#   scripts/hosts.sh exec I -- CMD...      CMD in host I (I = 1..N, or "head": mpirun's side)
#   scripts/hosts.sh pids I                the processes running in host I
#   scripts/hosts.sh kill I [SIGNAL]       signal every process of host I (default KILL: a node dies)
#   scripts/hosts.sh link I up|down        plug/unplug host I's cable at the switch
#   scripts/hosts.sh shape I|all off | rate RATE | netem NETEM-ARGS...   shape host I's link now
#   scripts/hosts.sh info                  hosts, addresses, interfaces, shaping
#   scripts/hosts.sh check                 exit 0 if a bed can be made here, else 77 and why
#   scripts/hosts.sh rsh HOST CMD...       the rsh agent Open MPI calls (plm_rsh_agent)
#
# MPIRUN-ARGS are mpirun's own options and the program; -np N*SLOTS is added unless they hold -n,
# -np or --np. Exit status 77 (ctest's SKIP_RETURN_CODE) means the bed cannot be made here (not
# root, no network namespaces, no netem in this kernel); a job that itself exits 77 reports 1.
#
# Layout: namespace gshard-sw holds the switch (bridge br0, address 198.18.0.254/24, ports
# port1..portN) and is the head node where mpirun runs; namespace gshard-hI holds host I: lo and
# eth0 = 198.18.0.I/24, the far end of portI. No default routes: nothing outside 198.18.0.0/24 is
# reachable and the machine's own namespace is untouched. The hosts share the file system, except
# where `mount` (or --readonly, --tmpfs) gives a host its own mount namespace: PATH read-only there
# (a bind mount), or a tmpfs of SIZE over PATH that only that host sees (its own local disk).
set -euo pipefail

self=$(readlink -f "${BASH_SOURCE[0]}")
root=$(dirname "$(dirname "$self")")
readonly prefix=gshard subnet=198.18.0 head_address=198.18.0.254 max_hosts=16
readonly sw=$prefix-sw
lock_file=/run/lock/$prefix-hosts.lock
[ -d /run/lock ] && [ -w /run/lock ] || lock_file=/tmp/$prefix-hosts.lock
# Per-host mounts of the bed that is up: hI.mounts, one "ro<TAB>PATH" or "tmpfs<TAB>SIZE<TAB>PATH"
# a line; removed with the bed.
state_dir=/run/$prefix-hosts
[ -d /run ] && [ -w /run ] || state_dir=/tmp/$prefix-hosts
# How long to wait for another job's bed, and the default hang limit of a job (seconds).
lock_wait=${GSHARD_HOSTS_LOCK_WAIT:-120}
default_timeout=${GSHARD_HOSTS_TIMEOUT:-300}
mpirun=${GSHARD_HOSTS_MPIRUN:-mpirun}  # Open MPI's; the tests pass CMake's MPIEXEC_EXECUTABLE

say() { echo "hosts.sh: $*" >&2; }
die() { say "$*"; exit 1; }
skip() { say "SKIP: $*"; exit 77; }
host_ns() { echo "$prefix-h$1"; }
# Becomes CMD in namespace NS under the hostname NS (its own UTS namespace): Open MPI names its
# session directories (/tmp/ompi.HOST.UID) and messages after it, so the hosts are told apart.
# A host with mounts (mount_host) also gets its own mount namespace, set up by host_init.
in_ns() {
  local ns=$1
  shift
  if [ -s "$state_dir/$ns.mounts" ]; then
    exec ip netns exec "$ns" unshare --uts --mount --propagation private "$self" _host_init "$ns" "$@"
  fi
  exec ip netns exec "$ns" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "$ns" "$@"
}

# In host NS's new UTS and mount namespaces: its hostname and mounts, then CMD. A mount that
# fails ends the launch (status 1, saying why) rather than run CMD with the shared view.
host_init() {
  local ns=$1 kind a b
  shift
  hostname "$ns"
  while IFS=$'\t' read -r kind a b; do
    mount_here "$ns" "$kind" "$a" ${b:+"$b"}
  done <"$state_dir/$ns.mounts"
  exec "$@"
}

# One mount in the current mount namespace (never the machine's: see host_init, mount_live):
# ro PATH, tmpfs SIZE PATH, or umount PATH (the topmost mount there).
mount_here() {
  local ns=$1 kind=$2
  shift 2
  case $kind in
    ro) mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" || die "$ns: cannot make $1 read-only" ;;
    tmpfs) mount -t tmpfs -o "size=$1,mode=0755" "$prefix-tmpfs" "$2" ||
      die "$ns: cannot mount a tmpfs of $1 over $2" ;;
    umount) umount "$1" 2>/dev/null || say "$ns: nothing mounted over $1" ;;
    *) die "$ns: unknown mount '$kind'" ;;
  esac
}

# --- preconditions -----------------------------------------------------------------------------

# Why a bed cannot be made here, or nothing. Probes in a throwaway namespace, so leaves nothing.
why_not() {
  [ "$(id -u)" -eq 0 ] || { echo "needs root (network namespaces)"; return; }
  local c
  for c in ip tc unshare nsenter flock timeout hostname "$mpirun"; do
    command -v "$c" >/dev/null || { echo "no $c (scripts/install-deps.sh test installs it)"; return; }
  done
  "$mpirun" --version 2>&1 | grep -qE "Open MPI|OpenRTE" ||
    { echo "$mpirun is not Open MPI's (the bed needs its plm_rsh_agent)"; return; }
  ip netns list >/dev/null 2>&1 || { echo "'ip netns' does not work here"; return; }
  unshare --net --uts sh -c 'ip link add name p0 type veth peer name p1 && ip link add name b0 type bridge &&
    hostname probe' >/dev/null 2>&1 ||
    { echo "cannot make network namespaces with veth pairs and a bridge here"; return; }
}

check_or_skip() {
  local why
  why=$(why_not)
  [ -z "$why" ] || skip "$why"
}

# netem is a kernel module (CONFIG_NET_SCH_NETEM) that some kernels lack; tbf (--rate) is common.
have_netem() {
  unshare --net sh -c 'ip link set lo up && tc qdisc add dev lo root netem delay 1us' >/dev/null 2>&1
}

host_index() {  # validates I against the bed that is up
  [[ $1 =~ ^[0-9]+$ ]] && [ "$1" -ge 1 ] && [ -e "/run/netns/$(host_ns "$1")" ] ||
    die "no host '$1' in the test bed (hosts: $(hosts_up | tr '\n' ' '))"
}

hosts_up() {  # the indices of the hosts that exist, ascending
  ip netns list 2>/dev/null | awk '{print $1}' | sed -n "s/^$prefix-h\([0-9][0-9]*\)\$/\1/p" | sort -n
}

# --- bringing the bed up and down ---------------------------------------------------------------

with_lock() {  # one bed on this machine at a time: ctest -j, other checkouts, a benchmark
  exec {lock_fd}>"$lock_file"
  flock -w "$lock_wait" "$lock_fd" ||
    die "another test bed has been in use for ${lock_wait}s ($lock_file); giving up"
}

# Ends every process in our namespaces (orteds, ranks, a stray `exec`), then removes them; a
# namespace's veth pair goes with it. Idempotent: also clears what a killed run left behind.
down_unlocked() {
  local names ns pids sig
  rm -rf "$state_dir"
  names=$(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$prefix-(h[0-9]+|sw)\$" || true)
  [ -n "$names" ] || return 0
  for sig in TERM KILL; do
    pids=$(for ns in $names; do ip netns pids "$ns" 2>/dev/null; done)
    [ -n "$pids" ] || break
    # shellcheck disable=SC2086  # a list of pids
    kill -s "$sig" $pids 2>/dev/null || true
    for _ in $(seq 20); do  # up to 2 s for them to go
      pids=$(for ns in $names; do ip netns pids "$ns" 2>/dev/null; done)
      [ -n "$pids" ] || break 2
      sleep 0.1
    done
  done
  [ -z "$pids" ] || say "processes $pids would not die; removing the namespaces anyway"
  for ns in $names; do ip netns del "$ns" 2>/dev/null || say "could not remove namespace $ns"; done
  # What killed runs leave: Open MPI's session directories (named after our hostnames), hostfiles.
  rm -rf "/tmp/ompi.$prefix-"* "/tmp/$prefix-hostfile."*
}

# Host I's own view of the file system for what it starts from now on (see host_init): `ro PATH`
# adds PATH read-only, `tmpfs SIZE PATH` a tmpfs over PATH, `off` removes every mount of host I.
# PATH must be an existing directory or file, named by its absolute path.
mount_host() {
  local i=$1 kind=$2 file
  shift 2
  file="$state_dir/$(host_ns "$i").mounts"
  case $kind in
    off)
      if [ -s "$file" ]; then
        local k a b
        while IFS=$'\t' read -r k a b; do mount_live "$i" umount "${b:-$a}"; done <"$file"
      fi
      rm -f "$file"
      return ;;
    ro) [ $# -eq 1 ] || die "mount: ro PATH" ;;
    tmpfs) [ $# -eq 2 ] && [[ $1 =~ ^[0-9]+[kKmMgG%]?$ ]] || die "mount: tmpfs SIZE PATH (SIZE: e.g. 64k, 1m)" ;;
    *) die "mount: unknown kind '$kind' (ro PATH, tmpfs SIZE PATH, off)" ;;
  esac
  local path=${*: -1}
  [[ $path == /* && $path != *[[:cntrl:]]* ]] || die "mount: '$path' is not an absolute path"
  [ -e "$path" ] || die "mount: $path does not exist"
  mkdir -p "$state_dir"
  if [ "$kind" = ro ]; then printf 'ro\t%s\n' "$path"; else printf 'tmpfs\t%s\t%s\n' "$1" "$path"; fi >>"$file"
  mount_live "$i" "$kind" "$@"
}

# The same mount in the processes host I runs now (a job's orted and ranks), as when a disk goes
# read-only under a running job. Each launch into a host has a mount namespace of its own (ip
# netns exec makes one); the machine's own, or this script's, is never touched.
mount_live() {
  local i=$1 pid mnt seen=" " mine root_mnt
  shift
  mine=$(readlink /proc/self/ns/mnt)
  root_mnt=$(readlink /proc/1/ns/mnt 2>/dev/null || true)  # unreadable in some containers
  for pid in $(ip netns pids "$(host_ns "$i")"); do
    mnt=$(readlink "/proc/$pid/ns/mnt" 2>/dev/null) || continue  # gone meanwhile
    [[ $seen != *" $mnt "* ]] || continue
    seen+="$mnt "
    if [ "$mnt" = "$mine" ] || [ "$mnt" = "${root_mnt:-$mine}" ]; then
      say "mount: process $pid of host $i shares this machine's mount namespace; left alone"
      continue
    fi
    nsenter --mount="/proc/$pid/ns/mnt" -- "$self" _mount_here "$(host_ns "$i")" "$@" ||
      die "mount: could not change the file system of host $i's running process $pid"
  done
}

# Shaping of host I's link: its NIC's egress (eth0, in the host) and the switch port's egress
# towards it (portI), so both sending and receiving run at the link's rate; the delay is added
# once per direction, on the sender's NIC.
shape_host() {
  local i=$1 mode=$2 ns
  shift 2
  ns=$(host_ns "$i")
  tc -n "$ns" qdisc del dev eth0 root 2>/dev/null || true
  tc -n "$sw" qdisc del dev "port$i" root 2>/dev/null || true
  case $mode in
    off) ;;
    rate)
      local bytes burst limit
      bytes=$(rate_bytes "$1")
      # A burst of 1 ms at the rate (at least one 64 KiB GSO packet), a queue of 20 ms.
      burst=$((bytes / 1000 > 65536 ? bytes / 1000 : 65536))
      limit=$((bytes / 50 > 4 * burst ? bytes / 50 : 4 * burst))
      tc -n "$ns" qdisc add dev eth0 root tbf rate "$1" burst "$burst" limit "$limit"
      tc -n "$sw" qdisc add dev "port$i" root tbf rate "$1" burst "$burst" limit "$limit" ;;
    netem)
      have_netem || skip "this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM); --rate shapes with tbf"
      tc -n "$ns" qdisc add dev eth0 root netem "$@"
      # The switch side only serialises at the same rate, if one was given.
      local rate="" prev=""
      for a in "$@"; do [ "$prev" != rate ] || rate=$a; prev=$a; done
      [ -z "$rate" ] || tc -n "$sw" qdisc add dev "port$i" root netem rate "$rate" ;;
    *) die "shape: unknown mode '$mode' (off, rate RATE, netem ARGS...)" ;;
  esac
}

rate_bytes() {  # tc's rate syntax (SI units) to bytes per second, for tbf's burst
  local n unit
  [[ $1 =~ ^([0-9]+)([a-zA-Z]*)$ ]] || die "cannot read rate '$1' (e.g. 10gbit, 100mbit)"
  n=${BASH_REMATCH[1]} unit=${BASH_REMATCH[2],,}
  case $unit in
    bit) echo $((n / 8)) ;; kbit) echo $((n * 1000 / 8)) ;; mbit) echo $((n * 1000000 / 8)) ;;
    gbit) echo $((n * 1000000000 / 8)) ;; tbit) echo $((n * 1000000000000 / 8)) ;;
    ""|bps) echo "$n" ;; kbps) echo $((n * 1000)) ;; mbps) echo $((n * 1000000)) ;;
    gbps) echo $((n * 1000000000)) ;;
    *) die "unknown rate unit in '$1' (bit, kbit, mbit, gbit, tbit, bps, kbps, mbps, gbps)" ;;
  esac
}

# Reads the shaping options shared by up and run into the array `shaping` (mode and arguments),
# and the mount options into `mounts` (I KIND ARGS... per mount, for mount_host after up).
shaping=(off)
mounts=()
parse_shaping() {  # sets `consumed` to the number of arguments used
  consumed=0
  case ${1:-} in
    --rate) [ $# -ge 2 ] || die "--rate RATE"; rate_bytes "$2" >/dev/null; shaping=(rate "$2"); consumed=2 ;;
    --netem) [ $# -ge 3 ] || die "--netem RATE DELAY"; shaping=(netem rate "$2" delay "$3"); consumed=3 ;;
    --readonly) [ $# -ge 3 ] || die "--readonly I PATH"; mounts+=("$2|ro|$3"); consumed=3 ;;
    --tmpfs) [ $# -ge 4 ] || die "--tmpfs I SIZE PATH"; mounts+=("$2|tmpfs|$3|$4"); consumed=4 ;;
  esac
}

apply_mounts() {  # the mounts of the options, on the bed just made
  local m parts
  for m in "${mounts[@]}"; do
    IFS='|' read -r -a parts <<<"$m"
    host_index "${parts[0]}"
    mount_host "${parts[@]}"
  done
}

up_unlocked() {
  local n=$1 i ns
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le $max_hosts ] || die "N must be 1..$max_hosts"
  [ "${shaping[0]}" != netem ] || have_netem ||
    skip "this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM); --rate shapes with tbf"
  down_unlocked
  ip netns add "$sw"
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge  # STP off (the default): ports forward at once
  ip -n "$sw" addr add "$head_address/24" dev br0
  ip -n "$sw" link set br0 up
  for i in $(seq "$n"); do
    ns=$(host_ns "$i")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$sw" link add "port$i" type veth peer name eth0 netns "$ns"
    ip -n "$sw" link set "port$i" master br0 up
    ip -n "$ns" addr add "$subnet.$i/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
  # IPv4 only: no link-local IPv6 addresses, router solicitations or DAD on the wire.
  for ns in "$sw" $(for i in $(seq "$n"); do host_ns "$i"; done); do
    ip netns exec "$ns" sh -c 'echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6' 2>/dev/null || true
  done
  if [ "${shaping[0]}" != off ]; then
    for i in $(seq "$n"); do shape_host "$i" "${shaping[@]}"; done
  fi
  [ ${#mounts[@]} -eq 0 ] || apply_mounts
}

info() {
  local i ns q
  [ -e "/run/netns/$sw" ] || { echo "no test bed is up"; return; }
  printf '%-6s %-12s %-14s %-8s %-7s %s\n' host namespace address nic port "shaping (nic egress)"
  printf '%-6s %-12s %-14s %-8s %-7s %s\n' head "$sw" "$head_address" br0 - -
  for i in $(hosts_up); do
    ns=$(host_ns "$i")
    q=$(tc -n "$ns" qdisc show dev eth0 root 2>/dev/null | head -1 |
      sed -E 's/^qdisc //; s/ [0-9a-f]+: (root )?(refcnt [0-9]+ )?/ /')
    printf '%-6s %-12s %-14s %-8s %-7s %s\n' "$i" "$ns" "$subnet.$i" eth0 "port$i" "$q"
  done
  for i in $(hosts_up); do
    ns=$(host_ns "$i")
    [ ! -s "$state_dir/$ns.mounts" ] || sed "s/^/host $i mounts: /; s/\t/ /g" "$state_dir/$ns.mounts"
  done
}

# --- running MPI jobs ---------------------------------------------------------------------------

# Runs mpirun in the head namespace on the hosts that are up, SLOTS ranks each, with a hang limit
# of `timeout` seconds: Open MPI's own --timeout ends the job (every rank, with a message), and
# timeout(1) a little later ends an mpirun that did not. Sets `job_status`.
run_mpirun() {
  local slots=$1 n i has_np=0 a
  shift
  n=$(hosts_up | wc -l)
  [ "$n" -ge 1 ] || die "no test bed is up (scripts/hosts.sh up N)"
  [[ $self != *[[:space:]]* ]] || die "the agent's path must not contain blanks: $self"
  hostfile=$(mktemp "/tmp/$prefix-hostfile.XXXXXX")
  for i in $(hosts_up); do echo "$subnet.$i slots=$slots"; done >"$hostfile"
  for a in "$@"; do case $a in -n|-np|--np) has_np=1 ;; esac; done
  local np=()
  [ $has_np -eq 1 ] || np=(-np $((n * slots)))
  # Variables for running as root and oversubscribed, as for the single-machine tests.
  # shellcheck source=scripts/mpi-env.sh
  source "$root/scripts/mpi-env.sh"
  # pml ob1 with btl tcp,self: the TCP BTL only, neither shared memory (vader) between the ranks
  # of a host nor UCX; every connection on the bed's subnet. No tree spawn: the head starts every
  # orted itself. --bind-to none: the hosts share these cores. A parameter given again in
  # MPIRUN-ARGS (say --mca btl vader,tcp,self) replaces the bed's: mpirun refuses one given twice.
  # shellcheck disable=SC2054  # tcp,self is one argument
  local bed_mca=(plm rsh plm_rsh_agent "$self rsh" plm_rsh_no_tree_spawn 1 pml ob1 btl tcp,self
    osc '^ucx' btl_tcp_if_include "$subnet.0/24" oob_tcp_if_include "$subnet.0/24") mca=() k j
  local given=" "
  for ((k = 1; k < $#; k++)); do
    case ${!k} in -mca|--mca|-gmca|--gmca) j=$((k + 1)); given+="${!j} " ;; esac
  done
  for ((k = 0; k < ${#bed_mca[@]}; k += 2)); do
    [[ $given == *" ${bed_mca[k]} "* ]] || mca+=(--mca "${bed_mca[k]}" "${bed_mca[k + 1]}")
  done
  local cmd=("$mpirun" --hostfile "$hostfile" "${np[@]}" --timeout "$timeout" --bind-to none
    "${mca[@]}" "$@")
  say "$n host(s) x $slots slot(s), in $sw:$(printf ' %q' "${cmd[@]}")"
  # In the background, so that a signal to this script runs its trap at once (bash runs traps
  # only between foreground commands); timeout(1) puts the job in its own process group.
  # The job must not inherit the lock: a stray mpirun would hold it after this script is killed.
  (
    [ -z "${lock_fd:-}" ] || exec {lock_fd}>&-
    exec timeout -k 10 $((timeout + 20)) "$self" _in_ns "$sw" "${cmd[@]}"
  ) &
  job_pid=$!
  job_status=0
  wait "$job_pid" || job_status=$?
  job_pid=""
  rm -f "$hostfile"
  hostfile=""
  [ "$job_status" -ne 124 ] || say "mpirun outlived its --timeout $timeout by 20 s and was ended"
  [ "$job_status" -ne 77 ] || { say "the job exited 77, reported as 1 (77 means skipped)"; job_status=1; }
}

# On a signal: end the job (timeout(1) passes the signal on to mpirun, which ends its ranks),
# give it 10 s, then exit; the EXIT trap removes the bed and whatever still runs in it.
job_pid="" hostfile=""
on_signal() {
  trap - INT TERM HUP
  if [ -n "$job_pid" ]; then
    kill -TERM "$job_pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$job_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$job_pid" 2>/dev/null || true
  fi
  [ -z "$hostfile" ] || rm -f "$hostfile"
  exit $((128 + $1))
}

# The options after SLOTS (or N for up): shaping and --timeout, up to "--".
timeout=$default_timeout
parse_job_options() {  # sets `rest` to the arguments after "--"
  rest=()
  while [ $# -gt 0 ]; do
    parse_shaping "$@"
    if [ "$consumed" -gt 0 ]; then shift "$consumed"; continue; fi
    case $1 in
      --timeout) [[ ${2:-} =~ ^[0-9]+$ ]] || die "--timeout SECONDS"; timeout=$2; shift 2 ;;
      --) shift; rest=("$@"); return ;;
      *) die "unknown option '$1' (did you forget '--' before mpirun's arguments?)" ;;
    esac
  done
}

# --- the rsh agent ------------------------------------------------------------------------------

# Open MPI runs `agent [options] HOST COMMAND...` as it would ssh: the words of COMMAND are joined
# and run by a shell on HOST. Here that shell runs in HOST's namespace, under HOST's hostname.
# Unlike ssh, the caller's environment comes along (Open MPI passes its MCA settings on the
# command line too).
rsh_agent() {
  while [ $# -gt 0 ]; do  # ssh options (plm_rsh_args): ignored, with their values
    case $1 in
      -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;
      -*) shift ;;
      *) break ;;
    esac
  done
  [ $# -ge 2 ] || { say "rsh: usage: rsh [options] HOST COMMAND..."; exit 255; }
  local host=$1 i
  shift
  case $host in
    "$subnet".*) i=${host#"$subnet".} ;;
    "$prefix"-h*) i=${host#"$prefix"-h} ;;
    *) i="" ;;
  esac
  [[ $i =~ ^[0-9]+$ ]] && [ -e "/run/netns/$(host_ns "$i")" ] ||
    { say "rsh: $host is no host of the test bed"; exit 255; }
  local ns
  ns=$(host_ns "$i")
  in_ns "$ns" /bin/sh -c "$*"
}

# --- commands -----------------------------------------------------------------------------------

usage() { sed -n '/^#   scripts\/hosts.sh up/,/^# MPIRUN-ARGS/p' "$self" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

[ $# -ge 1 ] || usage
command=$1
shift
case $command in
  check)
    why=$(why_not)
    if [ -n "$why" ]; then echo "no: $why"; exit 77; fi
    echo "yes$(have_netem && echo ", with netem" || echo ", without netem (--rate only)")" ;;
  up)
    [ $# -ge 1 ] || usage
    n=$1
    shift
    while [ $# -gt 0 ]; do
      parse_shaping "$@"
      [ "$consumed" -gt 0 ] || die "up: unexpected '$1'"
      shift "$consumed"
    done
    check_or_skip
    with_lock
    trap 'down_unlocked' EXIT  # no half-made bed if a step fails
    up_unlocked "$n"
    trap - EXIT
    info ;;
  down)
    [ "$(id -u)" -eq 0 ] || die "needs root"
    with_lock
    down_unlocked ;;
  run)
    [ $# -ge 2 ] || usage
    n=$1 slots=$2
    shift 2
    [[ $slots =~ ^[0-9]+$ ]] && [ "$slots" -ge 1 ] || die "SLOTS must be a positive number"
    parse_job_options "$@"
    [ ${#rest[@]} -gt 0 ] || die "run: nothing to run (give mpirun's arguments after '--')"
    check_or_skip
    with_lock
    trap 'down_unlocked' EXIT
    trap 'on_signal 2' INT
    trap 'on_signal 15' TERM
    trap 'on_signal 1' HUP
    started=$SECONDS
    up_unlocked "$n"
    run_mpirun "$slots" "${rest[@]}"
    say "job ended with status $job_status after $((SECONDS - started)) s"
    exit "$job_status" ;;
  mpirun)
    [ $# -ge 1 ] || usage
    slots=$1
    shift
    parse_job_options "$@"
    [ "${shaping[0]}" = off ] || die "mpirun: shape the bed with 'up' or 'shape'"
    [ ${#mounts[@]} -eq 0 ] || die "mpirun: give hosts their mounts with 'up' or 'mount'"
    [ ${#rest[@]} -gt 0 ] || die "mpirun: nothing to run (give mpirun's arguments after '--')"
    trap 'on_signal 2' INT
    trap 'on_signal 15' TERM
    trap 'on_signal 1' HUP
    run_mpirun "$slots" "${rest[@]}"
    exit "$job_status" ;;
  exec)
    [ $# -ge 3 ] && [ "$2" = -- ] || usage
    if [ "$1" = head ]; then ns=$sw; else host_index "$1"; ns=$(host_ns "$1"); fi
    shift 2
    in_ns "$ns" "$@" ;;
  pids)
    [ $# -eq 1 ] || usage
    host_index "$1"
    ip netns pids "$(host_ns "$1")" ;;
  kill)
    [ $# -ge 1 ] && [ $# -le 2 ] || usage
    host_index "$1"
    pids=$(ip netns pids "$(host_ns "$1")")
    # shellcheck disable=SC2086  # a list of pids
    [ -z "$pids" ] || kill -s "${2:-KILL}" $pids ;;
  link)
    [ $# -eq 2 ] || usage
    host_index "$1"
    case $2 in up|down) ip -n "$sw" link set "port$1" "$2" ;; *) usage ;; esac ;;
  shape)
    [ $# -ge 2 ] || usage
    if [ "$1" = all ]; then targets=$(hosts_up); else host_index "$1"; targets=$1; fi
    shift
    [ "$1" != rate ] || [ $# -eq 2 ] || die "shape: rate RATE"
    for i in $targets; do shape_host "$i" "$@"; done ;;
  mount)
    [ $# -ge 2 ] || usage
    [ "$(id -u)" -eq 0 ] || die "needs root"
    host_index "$1"
    mount_host "$@" ;;
  info) info ;;
  rsh) rsh_agent "$@" ;;
  _in_ns) in_ns "$@" ;;  # internal: timeout(1) runs mpirun through it
  _host_init) host_init "$@" ;;  # internal: in_ns runs a host with mounts through it
  _mount_here) mount_here "$@" ;;  # internal: mount_live, in a running process's namespace
  *) usage ;;
esac
