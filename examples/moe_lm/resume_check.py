#!/usr/bin/env python3
"""Crash and resume of the main job (CTest: example.moe_lm.crash_and_resume).

1. An uninterrupted run on 2x2 with checkpoints (the reference).
2. The same run, and kill -9 of one rank once the first checkpoint is on disk: the whole job must
   end within 30 s, no rank left behind.
3. The same command again: it resumes from the newest checkpoint and must reproduce the
   reference's loss.csv exactly (bitwise: 9 significant digits of float losses).
4. From the crash's oldest checkpoint, a run on 1x4 (another expert-parallel degree) and one
   on 4x1 resume there: their losses must stay within 1e-4 of the reference.

    resume_check.py --moe-lm PATH --mpirun "mpirun|-n|4|..." --work DIR
"""
import argparse
import csv
import os
import shutil
import signal
import subprocess
import sys
import time

SMALL = ["--steps", "24", "--d-model", "32", "--layers", "2", "--heads", "2", "--ffn", "64",
         "--experts", "4", "--context", "32", "--batch", "8", "--eval-every", "4",
         "--eval-batches", "1", "--sample-bytes", "8", "--time-limit", "0"]


def fail(msg):
    print("resume_check: FAILED: " + msg, flush=True)
    sys.exit(1)


def command(args, mesh, name):
    out = os.path.join(args.work, name)
    return args.mpirun + [args.moe_lm, "--mesh", mesh, "--out", out,
                          "--checkpoint-dir", os.path.join(out, "ck")] + SMALL


def run(cmd, what):
    t = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    print(f"--- {what} ({time.time() - t:.1f} s, exit {p.returncode})\n" + p.stdout[-1500:], flush=True)
    if p.returncode != 0:
        fail(f"{what} exited with {p.returncode}")
    return p.stdout


def losses(name, args):
    with open(os.path.join(args.work, name, "loss.csv")) as f:
        return list(csv.reader(f))


def ranks_of(marker):
    """Pids of processes whose command line holds `marker` (this job's output directory)."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            cmd = open(f"/proc/{d}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if cmd and os.path.basename(cmd[0]) == b"moe_lm" and marker.encode() in cmd:
            pids.append(int(d))
    return sorted(pids)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moe-lm", required=True)
    ap.add_argument("--mpirun", required=True, help="the mpirun command for 4 ranks, '|'-separated")
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    args.mpirun = args.mpirun.split("|")
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)

    run(command(args, "2x2", "reference"), "reference run, 2x2")
    reference = losses("reference", args)
    if len(reference) != 26:
        fail(f"the reference's loss.csv has {len(reference)} lines, expected 26")

    # The run to crash.
    cmd = command(args, "2x2", "crashed")
    out_dir = os.path.join(args.work, "crashed")
    ck = os.path.join(out_dir, "ck")
    log = open(os.path.join(args.work, "crashed.log"), "w")
    job = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 240
    while time.time() < deadline and job.poll() is None:
        if os.path.isdir(ck) and any(n.endswith(".safetensors") for n in os.listdir(ck)):
            break
        time.sleep(0.01)
    if job.poll() is not None:
        fail("the run ended before it could be killed (exit %s)" % job.returncode)
    pids = ranks_of(out_dir)
    if len(pids) != 4:
        fail(f"found {len(pids)} ranks of the job to kill, expected 4: {pids}")
    victim = pids[2]
    killed_at = time.time()
    os.kill(victim, signal.SIGKILL)
    try:
        code = job.wait(timeout=60)
    except subprocess.TimeoutExpired:
        job.kill()
        fail("the job did not end within 60 s of kill -9 of one rank")
    ended = time.time() - killed_at
    time.sleep(0.5)
    left = ranks_of(out_dir)
    print(f"--- kill -9 of rank pid {victim}: the job ended in {ended:.2f} s with exit {code}; "
          f"ranks left: {left}", flush=True)
    if ended > 30:
        fail(f"the job took {ended:.1f} s to end after kill -9 of one rank (limit 30 s)")
    if code == 0:
        fail("the job exited 0 after one rank was killed")
    if left:
        for p in left:
            os.kill(p, signal.SIGKILL)
        fail(f"ranks {left} were left running")
    saved = sorted(n for n in os.listdir(ck) if n.endswith(".safetensors"))
    print("--- checkpoints left by the crash: " + ", ".join(saved), flush=True)
    # The oldest one, for resuming on other meshes (the restart below replaces it).
    first = os.path.join(args.work, saved[0])
    shutil.copy(os.path.join(ck, saved[0]), first)

    text = run(cmd, "restart of the crashed run, 2x2")
    if "resumed from" not in text:
        fail("the restarted run did not resume from a checkpoint")
    resumed = losses("crashed", args)
    if resumed != reference:
        for a, b in zip(reference, resumed):
            if a != b:
                print("reference:", a, " resumed:", b)
        fail("the resumed run's losses differ from the uninterrupted run's")
    print("--- resumed on 2x2: loss.csv identical to the uninterrupted run's (%d rows)" % (len(resumed) - 1))

    # Other meshes, from the crash's oldest checkpoint.
    for mesh in ("1x4", "4x1"):
        name = "mesh_" + mesh
        os.makedirs(os.path.join(args.work, name, "ck"))
        shutil.copy(first, os.path.join(args.work, name, "ck", saved[0]))
        text = run(command(args, mesh, name), f"resume on {mesh} from {saved[0]}")
        if "resumed from" not in text:
            fail(f"the run on {mesh} did not resume")
        got = losses(name, args)
        if len(got) != len(reference):
            fail(f"{mesh}: {len(got)} rows, the reference has {len(reference)}")
        worst = 0.0
        for a, b in zip(reference[1:], got[1:]):
            for x, y in zip(a[1:], b[1:]):
                if x or y:
                    worst = max(worst, abs(float(x) - float(y)))
        print(f"--- resumed on {mesh}: largest loss difference to the reference {worst:.3g}")
        if worst > 1e-4:
            fail(f"{mesh}: losses differ by {worst} (limit 1e-4)")
    print("resume_check: passed")


if __name__ == "__main__":
    main()
