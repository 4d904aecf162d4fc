#!/usr/bin/env python3
"""Checks moe_lm's --trace output: runs the demo for N steps on R ranks, then parses the Chrome
trace (json module) and its step plan. Every rank is a process with events; every event is a
complete event with a start and a duration; every collective names its kind, axes, bytes and the
user's source line, a line of examples/moe_lm (the user's code, not the library's headers); the
step plan's collectives per step times N equal rank 0's collectives in the trace."""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys


def fail(why):
    print("trace_check: FAILED: " + why)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moe-lm", required=True)
    ap.add_argument("--mpirun", required=True, help="mpirun and its options, '|'-separated")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--mesh", default="2x2")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--work", required=True)
    ap.add_argument("--sources", required=True, help="examples/moe_lm: the user's files")
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    trace = os.path.join(a.work, "trace.json")
    cmd = a.mpirun.split("|") + [a.moe_lm, "--mesh", a.mesh, "--steps", str(a.steps),
                                 "--d-model", "32", "--layers", "2", "--heads", "2", "--ffn",
                                 "64", "--experts", "4", "--context", "32", "--batch", "8",
                                 "--eval-every", "100", "--eval-batches", "1", "--sample-bytes",
                                 "8", "--out", os.path.join(a.work, "out"), "--trace", trace,
                                 "--trace-steps", str(a.steps)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        fail("moe_lm exited with %d\n%s\n%s" % (run.returncode, run.stdout, run.stderr))
    if "step plan on rank 0" not in run.stdout:
        fail("moe_lm printed no step plan:\n" + run.stdout)

    with open(trace) as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    if doc["otherData"]["ranks"] != a.ranks or doc["otherData"]["steps"] != a.steps:
        fail("otherData: %s" % doc["otherData"])
    user_files = set(os.listdir(a.sources))
    site_re = re.compile(r"^([A-Za-z0-9_.+-]+):([0-9]+)$")
    per_rank = {r: {"op": 0, "kernel": 0, "collective": 0} for r in range(a.ranks)}
    named = set()
    rank0 = {}
    for e in events:
        pid = e["pid"]
        if pid not in per_rank:
            fail("event of an unknown rank: %s" % e)
        if e["ph"] == "M":
            named.add(pid)
            continue
        if e["ph"] != "X" or not isinstance(e["ts"], (int, float)) or e["dur"] < 0 or e["ts"] < 0:
            fail("not a complete event: %s" % e)
        per_rank[pid][e["cat"]] += 1
        if e["cat"] != "collective":
            continue
        args = e["args"]
        m = site_re.match(args.get("site", ""))
        if not m or m.group(1) not in user_files:
            fail("a collective without the user's source line: %s" % e)
        if not args.get("axes") or not isinstance(args.get("bytes"), int) or args["bytes"] < 0:
            fail("a collective without axes or bytes: %s" % e)
        if not args.get("op"):
            fail("a collective without its op: %s" % e)
        if pid == 0:
            key = (e["name"], args["axes"])
            rank0[key] = rank0.get(key, 0) + 1
    if named != set(range(a.ranks)):
        fail("process names for ranks %s" % sorted(named))
    for r, c in per_rank.items():
        if c["collective"] == 0 or c["op"] == 0 or c["kernel"] == 0:
            fail("rank %d has %s" % (r, c))

    with open(trace + ".plan.json") as f:
        plan = json.load(f)
    if plan["steps"] != a.steps or plan["rank"] != 0:
        fail("plan: steps %s rank %s" % (plan["steps"], plan["rank"]))
    from_plan = {(c["kind"], c["axes"]): round(c["calls_per_step"] * a.steps)
                 for c in plan["collectives"]}
    if from_plan != rank0:
        fail("plan %s, trace %s" % (from_plan, rank0))
    shares = sum(o["share"] for o in plan["ops"])
    if abs(shares - 1) > 1e-6 or not plan["ops"]:
        fail("op shares add up to %g" % shares)
    total = sum(sum(c.values()) for c in per_rank.values())
    print("trace_check: %d events on %d ranks (%s on rank 0), %d kinds of collective; plan agrees"
          % (total, a.ranks, per_rank[0], len(rank0)))


if __name__ == "__main__":
    main()
