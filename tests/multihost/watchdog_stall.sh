#!/usr/bin/env bash
# A link that stalls mid-collective (issue 23, point 3): 2 hosts x 2 ranks run collectives in a
# loop with GSHARD_COLLECTIVE_TIMEOUT=3; once they run, host 2's cable is pulled (`hosts.sh link 2
# down`). Passes when, within 30 s of the cut, a rank of host 1 reports the collective it waits
# in (AllReduce over "x", the op and the user's line), and every rank of both hosts has exited.
#
#   watchdog_stall.sh HOSTS_SH COMM_WATCHDOG_TEST
set -euo pipefail
hosts=$1
probe=$2
bash "$hosts" check >/dev/null || exit 77
log=$(mktemp)
trap 'rm -f "$log"' EXIT
fail() {
  cat "$log"
  echo "watchdog_stall: FAILED: $*"
  exit 1
}
limit=120  # the bed's mpirun --timeout: the watchdog must end the job well before
GSHARD_COLLECTIVE_TIMEOUT=3 bash "$hosts" run 2 2 --timeout "$limit" -- \
  "$probe" --no-skip --test-case=watchdog:loop >"$log" 2>&1 &
job=$!
for _ in $(seq 1 180); do  # the loop is running within 90 s
  grep -q "watchdog:loop is running" "$log" && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.5
done
grep -q "watchdog:loop is running" "$log" || fail "the collectives did not start"
bash "$hosts" link 2 down
cut=$(date +%s%N)
reported=""
for _ in $(seq 1 60); do  # the report within 30 s
  if grep -q "collective watchdog" "$log"; then
    reported=$((($(date +%s%N) - cut) / 1000000))
    break
  fi
  sleep 0.5
done
# Every rank, on both hosts, ends by its own watchdog. mpirun itself cannot finish the abort: it
# waits for the cut-off host's daemon (until its --timeout, or the TCP timeouts); the test stops
# it once the ranks are gone.
ranks_left() {
  local i p n=0
  for i in 1 2; do
    for p in $(bash "$hosts" pids "$i"); do
      [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "comm_watchdog_t" ] && n=$((n + 1))
    done
  done
  echo "$n"
}
gone=""
for _ in $(seq 1 60); do  # every rank gone within 30 s of the cut
  if [ "$(ranks_left)" -eq 0 ]; then
    gone=$((($(date +%s%N) - cut) / 1000000))
    break
  fi
  sleep 0.5
done
kill -TERM "$job" 2>/dev/null || true
rc=0
wait "$job" || rc=$?
cat "$log"
echo "watchdog_stall: report ${reported:-never} ms after the cut, every rank gone after" \
  "${gone:-never} ms (mpirun stopped by the test, exit $rc)"
[ -n "$reported" ] || fail "no watchdog report within 30 s of the cut"
[ -n "$gone" ] || fail "ranks still running 30 s after the cut"
grep -Eq 'collective watchdog: rank [01] of 4 \(host gshard-h1\) waited more than 3 s in AllReduce over mesh axes "x"' "$log" ||
  fail "the report does not name a rank of host 1, the time limit and the AllReduce over x"
grep -q "op: reshard at watchdog_test.cpp:" "$log" || fail "the report does not name the op"
grep -q "your line: " "$log" || fail "the report does not name the user's line"
echo "watchdog_stall: passed"
