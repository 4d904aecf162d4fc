#!/usr/bin/env bash
# shellcheck disable=SC2015,SC2016  # `a && b || fail` is meant; the ranks' script is single-quoted
# Checks of the multi-host test bed itself (scripts/hosts.sh, docs/multihost.md), one per CASE:
#   placement  2 hosts x 2: each rank runs in its host's namespace under its hostname, with no
#              default route, and every pair of ranks, on one host or two, talks over the TCP BTL
#   rate       4 hosts x 1 with --rate: every host's link is shaped (tbf)
#   netem      2 hosts x 1 with --netem: every host's link has netem's rate and delay
#   hang       a job that hangs ends at --timeout and leaves no namespace and no process
#   interrupt  SIGTERM to hosts.sh ends job and bed; after a SIGKILL, `down` clears the leftovers
#   testbed_test.sh CASE HOSTS_SH PROBE   (PROBE: the harness_probe test program)
# Exits 77 (skipped) where the bed cannot be made (not root, no namespaces, no netem for `netem`).
set -euo pipefail

[ $# -eq 3 ] || { echo "usage: $0 CASE HOSTS_SH PROBE" >&2; exit 2; }
case_name=$1 hosts=$2 probe=$3
fail() { echo "FAIL ($case_name): $*" >&2; exit 1; }

# Marks this test's processes, so that strays are found by their environment (which the bed
# passes on to every rank), not mistaken for another test's.
export GSHARD_TESTBED_MARK="testbed-$case_name-$$-$RANDOM"
marked_pids() {  # live (not zombie) processes carrying the mark: ranks, or [$1] any of the job's
  local p
  for p in $(pgrep -x "${1:-harness_probe}" || true); do
    grep -qz "^GSHARD_TESTBED_MARK=$GSHARD_TESTBED_MARK\$" "/proc/$p/environ" 2>/dev/null || continue
    [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" != Z ] && echo "$p"
  done
  return 0
}
bed_namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^gshard-(sw|h[0-9]+)$' || true; }
expect_clean() {  # no namespace and no process of ours after the bed is gone (strays get 5 s)
  local left
  [ -z "$(bed_namespaces)" ] || fail "namespaces left behind: $(bed_namespaces | tr '\n' ' ')"
  for _ in $(seq 50); do
    left=$(marked_pids 'harness_probe|orted|mpirun|mpiexec|timeout')
    [ -n "$left" ] || return 0
    sleep 0.1
  done
  fail "processes left behind: $left"
}

# Runs HOSTS SLOTS [options] -- ARGS on the bed into $out, $status; 77 skips the test.
run_bed() {
  status=0
  out=$(bash "$hosts" run "$@" 2>&1) || status=$?
  if [ "$status" -eq 77 ]; then echo "$out"; exit 77; fi
}

# What each rank reports about where it runs before it becomes the probe (exec: same process).
where='echo "where: rank=$OMPI_COMM_WORLD_RANK ns=$(ip netns identify $$) host=$(hostname)" \
"net=$(readlink /proc/self/ns/net) default_routes=$(ip route show default | wc -l)" \
"qdisc=$(tc qdisc show dev eth0 root | head -1)"; exec "$0" --no-skip "$1"'
where_line() { grep -E "^where: rank=$1 " <<<"$out" || fail "rank $1 did not report:"$'\n'"$out"; }

case $case_name in
  placement)
    # Preconnect: every rank opens its connections to all others in MPI_Init, so the BML reports
    # the BTL of every pair whatever the probe's collectives talk to.
    run_bed 2 2 --timeout 60 -- --mca mpi_preconnect_mpi 1 --mca btl_base_verbose 30 \
      sh -c "$where" "$probe" --test-case=probe:passes
    [ "$status" -eq 0 ] || fail "the job failed ($status):"$'\n'"$out"
    echo "$out" | grep -E '^where:|^gshard-test:'
    own_net=$(readlink /proc/self/ns/net)
    for rank in 0 1 2 3; do
      host=$((rank / 2 + 1))
      line=$(where_line $rank)
      [[ $line == *" ns=gshard-h$host host=gshard-h$host "* ]] ||
        fail "rank $rank should run in gshard-h$host: $line"
      [[ $line != *"net=$own_net "* ]] || fail "rank $rank runs in this machine's own namespace"
      [[ $line == *" default_routes=0 "* ]] || fail "rank $rank's host has a default route: $line"
    done
    # The BML names the BTL a process of a host uses to send to each rank, with the rank's
    # address: from each host, TCP to every rank (to the other rank of the same host too).
    for from in 1 2; do
      for to in 0 1 2 3; do
        grep -qE "^\[gshard-h$from:[0-9]+\] mca: bml: Using tcp btl for send to \[\[[0-9]+,[0-9]+\],$to\] on node 198\.18\.0\.$((to / 2 + 1))\$" <<<"$out" ||
          fail "host $from does not send to rank $to over TCP:"$'\n'"$out"
      done
    done
    others=$(grep -E "mca: bml: Using [a-z0-9_]+ btl" <<<"$out" | grep -vE "Using (tcp|self) btl" || true)
    [ -z "$others" ] || fail "BTLs other than tcp and self were used: $others"
    grep -q "gshard-test: passed on all 4 rank(s)" <<<"$out" || fail "the probe did not pass:"$'\n'"$out"
    expect_clean ;;
  rate)
    run_bed 4 1 --rate 1gbit --timeout 60 -- sh -c "$where" "$probe" --test-case=probe:passes
    [ "$status" -eq 0 ] || fail "the job failed ($status):"$'\n'"$out"
    echo "$out" | grep -E '^where:'
    for rank in 0 1 2 3; do
      line=$(where_line $rank)
      [[ $line == *" ns=gshard-h$((rank + 1)) "* ]] || fail "rank $rank should run in gshard-h$((rank + 1))"
      [[ $line == *"qdisc=qdisc tbf "*"rate 1Gbit"* ]] || fail "host $((rank + 1)) is not shaped: $line"
    done
    expect_clean ;;
  netem)
    run_bed 2 1 --netem 10gbit 30us --timeout 60 -- sh -c "$where" "$probe" --test-case=probe:passes
    [ "$status" -eq 0 ] || fail "the job failed ($status):"$'\n'"$out"
    echo "$out" | grep -E '^where:'
    for rank in 0 1; do
      line=$(where_line $rank)
      [[ $line == *"qdisc=qdisc netem "*"delay 30us"* && $line == *"rate 10Gbit"* ]] ||
        fail "host $((rank + 1)) has no netem: $line"
    done
    expect_clean ;;
  hang)
    start=$SECONDS
    run_bed 2 2 --timeout 10 -- "$probe" --no-skip --test-case=probe:hangs-on-rank-1
    elapsed=$((SECONDS - start))
    echo "$out" | tail -3
    [ "$status" -ne 0 ] || fail "a hanging job passed"
    grep -q "time limit for job execution has been reached" <<<"$out" ||
      fail "the job did not end at its time limit ($status):"$'\n'"$out"
    [ "$elapsed" -le 40 ] || fail "a job with a 10 s limit took ${elapsed} s"
    expect_clean
    echo "ended with status $status after ${elapsed} s" ;;
  interrupt)
    for sig in TERM KILL; do
      log=$(mktemp)
      bash "$hosts" run 2 2 --timeout 100 -- "$probe" --no-skip --test-case=probe:hangs-on-rank-1 \
        >"$log" 2>&1 &
      bed=$!
      for _ in $(seq 200); do
        [ "$(marked_pids | wc -l)" -lt 4 ] && kill -0 "$bed" 2>/dev/null || break
        sleep 0.1
      done
      if [ "$(marked_pids | wc -l)" -lt 4 ]; then
        wait "$bed" && status=0 || status=$?
        [ "$status" -ne 77 ] || { cat "$log"; rm -f "$log"; exit 77; }
        fail "the 4 ranks did not start within 20 s:"$'\n'"$(cat "$log")"
      fi
      start=$SECONDS
      kill -s "$sig" "$bed"
      wait "$bed" && status=0 || status=$?
      echo "SIG$sig: hosts.sh exited $status after $((SECONDS - start)) s"
      if [ "$sig" = TERM ]; then
        [ "$status" -eq 143 ] || fail "hosts.sh exited $status on SIGTERM:"$'\n'"$(cat "$log")"
        [ $((SECONDS - start)) -le 20 ] || fail "hosts.sh took $((SECONDS - start)) s to end on SIGTERM"
      else
        # Nothing can clean up after SIGKILL: the next `down` (or up, or run) must.
        [ -n "$(bed_namespaces)" ] || fail "expected the killed run's namespaces to be left"
        timeout 30 bash "$hosts" down
      fi
      rm -f "$log"
      expect_clean
    done ;;
  *) fail "unknown case" ;;
esac
echo "PASS ($case_name)"
