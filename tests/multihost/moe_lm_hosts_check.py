#!/usr/bin/env python3
"""The main job (examples/moe_lm) on the multi-host test bed (scripts/hosts.sh, docs/multihost.md).

One CASE per CTest test (multihost.moe_lm.<case>); every job runs under a time limit and the bed
is removed after each (hosts.sh run does that, whatever happens):

  bitwise      24 steps with checkpoints on 2 hosts x 2 ranks (--mesh 2x2), and the same on one
               host with plain mpirun -n 4: loss.csv identical as text, the checkpoints they both
               keep byte-identical, the newest one's checksums right.
  host_killed  kill -9 of every process of host 2 (its orted and ranks 2, 3) once the first
               checkpoint is on disk: mpirun and the ranks of host 1 end within 60 s with Open
               MPI's message naming the lost host; every checkpoint left is byte-identical to
               what was there at the kill or newer, and its per-tensor checksums are right; the
               restart on the bed resumes from the newest and reproduces an uninterrupted run's
               loss.csv bitwise.
  unwritable   the checkpoint directory turns read-only for host 2 alone (its own mount
               namespace) once the first checkpoint is on disk: the job ends non-zero at its next
               save, within 60 s, every rank printing the same gshard::Error (write_safetensors
               ... naming that save's file); the checkpoints on disk are byte-identical and their
               checksums right; with the directory writable again the run resumes from the newest
               and ends with an uninterrupted run's loss.csv.
  readonly_resume  (disabled in CTest: hangs under Open MPI 4.1's OMPIO) a run resumes from a
               directory read-only on host 2 from its start, then fails its first save as above.
  full_disk    (disabled in CTest: hangs under Open MPI 4.1's OMPIO) the checkpoint directory on
               a tmpfs, seen by every host, with room for one checkpoint and a half: the second
               save fails on every rank with the same gshard::Error (write_safetensors, naming
               the file) and the first checkpoint is byte-identical afterwards, checksums right.
  other_hosts  a 2x2 checkpoint of step 8 written by 2 hosts x 2 ranks resumes on 1 host x 2
               (--mesh 1x2) and on 4 hosts x 2 (--mesh 2x4: 2 of the 8 experts per rank, and
               --mesh 1x8: one per rank): loss.csv and the final checkpoint identical to the same
               resume on one host with plain mpirun, steps 0-8 as the 2x2 run wrote them and the
               steps after 8 within 1e-4 of the 2x2 run's.

    moe_lm_hosts_check.py CASE --moe-lm PATH --hosts scripts/hosts.sh
        --mpirun "mpiexec|--oversubscribe|...|-n|4" --work DIR

--mpirun is the plain mpirun command for 4 ranks ('|'-separated, ending in -n 4: the count is
replaced for other sizes). Exits 77 (skipped) where the bed cannot be made (hosts.sh check).
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time

SMALL = ["--d-model", "32", "--layers", "2", "--heads", "2", "--ffn", "64", "--experts", "8",
         "--context", "32", "--batch", "8", "--eval-every", "4", "--eval-batches", "1",
         "--sample-bytes", "8", "--time-limit", "0"]
BED_TIMEOUT = 100    # hosts.sh run --timeout: Open MPI ends a job at this many seconds
JOB_LIMIT = 130      # this script's limit on one job (hosts.sh adds 20 s to its own)
MASK = (1 << 64) - 1
args = None
current = None       # the job running now (a Popen in its own session), for cleanup


def log(msg):
    print(msg, flush=True)


def fail(msg):
    log(f"moe_lm_hosts_check ({args.case if args else '?'}): FAILED: {msg}")
    stop_current()
    sys.exit(1)


def stop_current():
    """Ends the running job: SIGTERM to its session (hosts.sh's trap ends mpirun and removes
    the bed; a plain mpirun ends its ranks), SIGKILL 20 s later."""
    global current
    job, current = current, None
    if job is None or job.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
        try:
            os.killpg(job.pid, sig)
        except ProcessLookupError:
            return
        try:
            job.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            pass


def on_signal(signum, _frame):
    log(f"moe_lm_hosts_check: signal {signum}: ending the job")
    stop_current()
    sys.exit(128 + signum)


# --- commands -----------------------------------------------------------------------------------

def moe_lm(mesh, out, steps, ck=None):
    cmd = [args.moe_lm, "--mesh", mesh, "--steps", str(steps), "--out", out] + SMALL
    return cmd + (["--checkpoint-dir", ck] if ck else [])


def bed(hosts, slots, program, extra=(), mpirun_options=()):
    return (["bash", args.hosts, "run", str(hosts), str(slots), "--timeout", str(BED_TIMEOUT)]
            + list(extra) + ["--"] + list(mpirun_options) + program)


def one_host(ranks, program):
    return args.mpirun[:-1] + [str(ranks)] + program


def start(cmd, logfile):
    global current
    log("$ " + " ".join(cmd))
    current = subprocess.Popen(cmd, stdout=logfile, stderr=subprocess.STDOUT,
                               start_new_session=True)
    return current


def run(cmd, what, expect_ok=True, limit=JOB_LIMIT):
    """Runs cmd to its end (at most `limit` s); returns (exit status, output)."""
    global current
    t = time.time()
    log(f"--- {what}")
    job = start(cmd, subprocess.PIPE)
    try:
        out, _ = job.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        fail(f"{what}: still running after {limit} s")
    current = None
    out = out.decode(errors="replace")
    if job.returncode == 77 and cmd[:2] == ["bash", args.hosts]:
        log(out)
        log("moe_lm_hosts_check: SKIP: the test bed cannot be made here")
        sys.exit(77)
    log(f"    ({time.time() - t:.1f} s, exit {job.returncode})\n" + tail(out))
    if expect_ok and job.returncode != 0:
        fail(f"{what} exited with {job.returncode}")
    return job.returncode, out


def tail(text, n=1800):
    return text if len(text) <= n else "[...]\n" + text[-n:]


def marked_ranks(marker):
    """Pids of live moe_lm processes whose command line holds `marker` (a job's directory)."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = open(f"/proc/{d}/cmdline", "rb").read().split(b"\0")
            state = open(f"/proc/{d}/stat", "rb").read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if (cmd and os.path.basename(cmd[0]) == b"moe_lm" and marker.encode() in cmd
                and state != b"Z"):
            pids.append(int(d))
    return sorted(pids)


def expect_no_ranks(marker):
    for _ in range(50):
        left = marked_ranks(marker)
        if not left:
            return
        time.sleep(0.1)
    for p in left:
        os.kill(p, signal.SIGKILL)
    fail(f"moe_lm processes {left} were left running")


def bed_namespaces():
    out = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True).stdout
    return [w.split()[0] for w in out.splitlines() if re.match(r"gshard-(sw|h\d+)\b", w)]


# --- results ------------------------------------------------------------------------------------

def loss_text(out):
    with open(os.path.join(out, "loss.csv")) as f:
        return f.read()


def loss_rows(out):
    """loss.csv as {step: [train, aux, held_out]}, each as written ("" where there is none)."""
    rows = {}
    for line in loss_text(out).splitlines()[1:]:
        step, *values = line.split(",")
        rows[int(step)] = values
    return rows


def checkpoints(ck):
    """The complete checkpoints of a directory, as moe_lm sees them: step_<8 digits>.safetensors
    (written as .tmp and renamed when whole), oldest first; the newest is where a run resumes."""
    if not os.path.isdir(ck):
        return []
    return sorted(n for n in os.listdir(ck) if re.fullmatch(r"step_\d{8}\.safetensors", n))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def mix64(x):  # io/format.hpp: splitmix64's finaliser
    x ^= x >> 30
    x = (x * 0xbf58476d1ce4e5b9) & MASK
    x ^= x >> 27
    x = (x * 0x94d049bb133111eb) & MASK
    return x ^ (x >> 31)


def element_checksum(data, size):
    """gshard::io's checksum of a tensor's bytes: the sum over elements, modulo 2^64, of
    element_hash(global flat index, element bits) (io/format.hpp)."""
    elements = memoryview(data).cast({1: "B", 2: "H", 4: "I", 8: "Q"}[size])
    total = 0
    for i, bits in enumerate(elements):
        x = (bits + mix64((i + 0x9e3779b97f4a7c15) & MASK)) & MASK
        x ^= x >> 30
        x = (x * 0xbf58476d1ce4e5b9) & MASK
        x ^= x >> 27
        x = (x * 0x94d049bb133111eb) & MASK
        total += x ^ (x >> 31)
    return total & MASK


DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
               "U8": 1, "BOOL": 1}


def verify_checkpoint(path):
    """Parses a safetensors checkpoint and checks it whole: sizes add up and every tensor's
    checksum (metadata gshard.checksum.<name>) is right. Returns its metadata."""
    with open(path, "rb") as f:
        data = f.read()
    name = os.path.basename(path)
    if len(data) < 8:
        fail(f"{name}: {len(data)} bytes, no header")
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    start = 8 + n
    end_all = 0
    for tname, t in header.items():
        size = DTYPE_BYTES[t["dtype"]]
        count = 1
        for d in t["shape"]:
            count *= d
        b, e = t["data_offsets"]
        if e - b != count * size or start + e > len(data):
            fail(f"{name}: tensor {tname} has {e - b} bytes at {b}, expected {count * size} "
                 f"(file of {len(data)} bytes)")
        end_all = max(end_all, e)
        recorded = meta.get("gshard.checksum." + tname)
        if recorded is None:
            fail(f"{name}: no checksum for tensor {tname}")
        got = f"{element_checksum(data[start + b:start + e], size):016x}"
        if got != recorded:
            fail(f"{name}: tensor {tname}: checksum {got}, recorded {recorded}: the file is "
                 "corrupt")
    if start + end_all != len(data):
        fail(f"{name}: {len(data)} bytes, its header says {start + end_all}")
    if meta.get("moe_lm.step") != str(int(name[5:13])):
        fail(f"{name}: its metadata says step {meta.get('moe_lm.step')}")
    log(f"    {name}: {len(header)} tensors, checksums right ({len(data)} bytes)")
    return meta


def expect_resumed(out, ck, step):
    path = os.path.join(ck, f"step_{step:08d}.safetensors")
    if f"resumed from {path} at step {step}" not in out:
        fail(f"the run did not resume from {path}")


def same_files(a, b, names, what):
    for n in names:
        if sha256(os.path.join(a, n)) != sha256(os.path.join(b, n)):
            fail(f"{what}: {n} differs")
    log(f"    {what}: {', '.join(names)} byte-identical")


def same_losses(a, b, what):
    ta, tb = loss_text(a), loss_text(b)
    if ta != tb:
        for la, lb in zip(ta.splitlines(), tb.splitlines()):
            if la != lb:
                log(f"    {la}  <->  {lb}")
        fail(f"{what}: loss.csv differs")
    log(f"    {what}: loss.csv identical ({len(ta.splitlines()) - 1} rows)")


# --- the cases ----------------------------------------------------------------------------------

def case_bitwise(w):
    steps = 24
    cmd = {}
    for name in ("bed", "one"):
        d = os.path.join(w, name)
        cmd[name] = moe_lm("2x2", d, steps, os.path.join(d, "ck"))
    _, out = run(bed(2, 2, cmd["bed"]), "2 hosts x 2 ranks, --mesh 2x2, 24 steps")
    if "2 host(s) x 2 slot(s)" not in out:
        fail("hosts.sh did not run the job on 2 hosts x 2 slots")
    run(one_host(4, cmd["one"]), "1 host, mpirun -n 4, --mesh 2x2, 24 steps")
    same_losses(os.path.join(w, "bed"), os.path.join(w, "one"), "2 hosts against 1 host")
    ck_bed, ck_one = os.path.join(w, "bed", "ck"), os.path.join(w, "one", "ck")
    names = checkpoints(ck_bed)
    if names != checkpoints(ck_one) or names != ["step_00000020.safetensors",
                                                 "step_00000024.safetensors"]:
        fail(f"checkpoints kept: {names} on the bed, {checkpoints(ck_one)} on one host")
    same_files(ck_bed, ck_one, names, "checkpoints, 2 hosts against 1 host")
    verify_checkpoint(os.path.join(ck_bed, names[-1]))


FAILURE_MESSAGE = re.compile(
    r"ORTE has lost communication with a remote daemon\.|"
    r"An MPI communication peer process has unexpectedly disconnected\.|"
    r"ORTE does not know how to route a message|"
    r"(?:orted|daemon)[^\n]*(?:died|failed|exited)|"
    r"mpirun noticed that process rank \d+ with PID \d+ on node \S+ exited on signal 9")


def case_host_killed(w):
    steps = 24
    ref = os.path.join(w, "reference")
    run(bed(2, 2, moe_lm("2x2", ref, steps)), "uninterrupted run, 2 hosts x 2 ranks")
    crashed = os.path.join(w, "crashed")
    ck = os.path.join(crashed, "ck")
    cmd = bed(2, 2, moe_lm("2x2", crashed, steps, ck))
    os.makedirs(crashed)
    logpath = os.path.join(w, "crashed.log")
    log("--- the run to kill host 2 in")
    with open(logpath, "wb") as logfile:
        job = start(cmd, logfile)
    deadline = time.time() + 100
    while time.time() < deadline and job.poll() is None and not checkpoints(ck):
        time.sleep(0.01)
    if job.poll() is not None:
        fail(f"the run ended (exit {job.returncode}) before host 2 could be killed:\n"
             + tail(open(logpath, errors="replace").read()))
    if not checkpoints(ck):
        fail("no checkpoint within 100 s")
    # What is on disk at the kill (a newer checkpoint may complete before the kill lands).
    before = {n: sha256(os.path.join(ck, n)) for n in checkpoints(ck)}
    victims = subprocess.run(["bash", args.hosts, "pids", "2"], stdout=subprocess.PIPE,
                             text=True).stdout.split()
    ranks_before = marked_ranks(crashed)
    killed_at = time.time()
    subprocess.run(["bash", args.hosts, "kill", "2", "KILL"], check=True)
    log(f"--- kill -9 of host 2's {len(victims)} processes (the job's ranks: {ranks_before}); "
        f"checkpoints then: {sorted(before)}")
    try:
        code = job.wait(timeout=60)
    except subprocess.TimeoutExpired:
        fail("the job did not end within 60 s of host 2's death:\n"
             + tail(open(logpath, errors="replace").read()))
    ended = time.time() - killed_at
    out = open(logpath, errors="replace").read()
    log(f"    the job ended {ended:.2f} s after the kill, exit {code}\n" + tail(out, 3000))
    if len(ranks_before) != 4:
        fail(f"expected 4 ranks running at the kill, found {ranks_before}")
    if code == 0:
        fail("the job exited 0 after host 2 died")
    m = FAILURE_MESSAGE.search(out)
    if not m:
        fail("no message names the failure (lost daemon / disconnected peer)")
    # The message block (up to Open MPI's closing rule) must name host 2.
    block = out[m.start():m.start() + 1200].split("-" * 20)[0]
    if not re.search(r"198\.18\.0\.2\b|gshard-h2\b", block):
        fail("the failure message does not name host 2 (198.18.0.2 / gshard-h2):\n" + block)
    log(f"    failure message: {block.strip()[:600]}")
    expect_no_ranks(crashed)
    if bed_namespaces():
        fail(f"the bed was left up: {bed_namespaces()}")

    after = checkpoints(ck)
    log(f"--- checkpoints after the crash: {after}; others: "
        f"{sorted(set(os.listdir(ck)) - set(after))}")
    if not after:
        fail("no complete checkpoint left")
    for n, digest in before.items():
        if n in after and sha256(os.path.join(ck, n)) != digest:
            fail(f"{n} changed after the kill")
    if after[-1] < max(before):
        fail(f"the newest checkpoint at the kill, {max(before)}, is gone")
    for n in after:
        verify_checkpoint(os.path.join(ck, n))
    newest = int(after[-1][5:13])

    _, out = run(cmd, "restart on 2 hosts x 2 ranks")
    expect_resumed(out, ck, newest)
    same_losses(ref, crashed, "restarted against uninterrupted")


def case_unwritable(w):
    steps = 16
    run_dir = os.path.join(w, "run")
    ck = os.path.join(run_dir, "ck")
    os.makedirs(ck)
    # The bed's per-host mounts: a directory read-only for host 2 alone, a tmpfs for host 1 alone.
    scratch = os.path.join(w, "scratch")
    os.makedirs(scratch)
    status, out = run(["bash", "-c",
                       'h="$0"; bash "$h" up 2 --readonly 2 "$1" --tmpfs 1 64k "$2" >/dev/null '
                       '|| exit; '
                       'bash "$h" exec 1 -- touch "$1/probe" && echo host1-writes; '
                       'bash "$h" exec 2 -- touch "$1/probe2" 2>&1 || echo host2-cannot; '
                       'echo "fs: $(bash "$h" exec 1 -- stat -f -c %T "$2") $(bash "$h" exec 2 -- '
                       'stat -f -c %T "$2")"; bash "$h" down', args.hosts, ck, scratch],
                      "the bed's --readonly 2 and --tmpfs 1", False, 60)
    if status == 77:
        sys.exit(77)
    if ("host1-writes" not in out or "host2-cannot" not in out or "Read-only file system" not in out
            or not re.search(r"^fs: tmpfs (?!tmpfs)\S+$", out, re.M)):
        fail("the bed's per-host mounts do not work")
    os.remove(os.path.join(ck, "probe"))

    ref = os.path.join(w, "reference")
    run(one_host(4, moe_lm("2x2", ref, steps)), "uninterrupted run, 1 host, mpirun -n 4")

    # The run whose checkpoint directory goes read-only on host 2 once its first checkpoint is
    # there (as when a node's file system remounts read-only after an error): the ranks are
    # paused meanwhile, so the next save is the first to meet it.
    # Each rank's output in a file of its own (DIR/1/rank.N/stderr), written by its host's orted:
    # mpirun interleaves the ranks' unbuffered std::cerr pieces.
    per_rank = os.path.join(w, "rank_output")
    cmd = bed(2, 2, moe_lm("2x2", run_dir, steps, ck), ["--timeout", "60"],
              ["--output-filename", per_rank])
    logpath = os.path.join(w, "run.log")
    log("--- 2 hosts x 2 ranks, 16 steps; the checkpoint directory read-only on host 2 after the "
        "first checkpoint")
    with open(logpath, "wb") as logfile:
        job = start(cmd, logfile)
    deadline = time.time() + 100
    while time.time() < deadline and job.poll() is None and not checkpoints(ck):
        time.sleep(0.005)
    ranks = marked_ranks(run_dir)
    for p in ranks:
        os.kill(p, signal.SIGSTOP)
    try:
        if job.poll() is not None or len(ranks) != 4:
            fail(f"the run ended or lost ranks ({ranks}) before its directory could be made "
                 "read-only:\n" + tail(open(logpath, errors="replace").read()))
        subprocess.run(["bash", args.hosts, "mount", "2", "ro", ck], check=True)
        before = {n: sha256(os.path.join(ck, n)) for n in checkpoints(ck)}
    finally:
        for p in ranks:
            os.kill(p, signal.SIGCONT)
    flipped_at = time.time()
    log(f"    read-only on host 2 with {sorted(before)} on disk")
    try:
        status = job.wait(timeout=90)
    except subprocess.TimeoutExpired:
        fail("the job did not end")
    out = open(logpath, errors="replace").read()
    log(f"    ({time.time() - flipped_at:.1f} s after, exit {status})\n" + tail(out, 2500))
    if "time limit for job execution has been reached" in out:
        fail("the job hung until its time limit instead of failing its save: MPI_File_open "
             "deadlocks when it fails on some ranks only (see docs/multihost.md)")
    if status == 0:
        fail("the run with an unwritable checkpoint directory exited 0")
    text = same_report(per_rank)
    m = re.match(r"gshard::write_safetensors: .*" + re.escape(ck)
                 + r"/step_(\d{8})\.safetensors\.tmp", text)
    if not m or int(m.group(1)) <= int(max(before)[5:13]):
        fail(f"the error does not name the save after {max(before)}: {text}")
    after = {n: sha256(os.path.join(ck, n)) for n in checkpoints(ck)}
    if after != before:
        fail(f"the checkpoints changed: {sorted(before)} -> {sorted(after)}")
    log(f"    {', '.join(sorted(after))} byte-identical; also in the directory: "
        f"{sorted(set(os.listdir(ck)) - set(after))}")
    for n in after:
        verify_checkpoint(os.path.join(ck, n))
    expect_no_ranks(run_dir)

    _, out = run(bed(2, 2, moe_lm("2x2", run_dir, steps, ck)), "the same, writable again")
    expect_resumed(out, ck, int(max(before)[5:13]))
    same_losses(ref, run_dir, "resumed against uninterrupted")


def case_full_disk(w):
    """The checkpoint directory on a file system with room for one checkpoint and a half (a tmpfs
    that every host sees, as a shared file system that fills up): the second save must fail on
    every rank with the same gshard::Error and leave the first checkpoint whole."""
    steps = 16
    ref = os.path.join(w, "reference")
    run(one_host(4, moe_lm("2x2", ref, steps, os.path.join(ref, "ck"))),
        "uninterrupted run, 1 host, mpirun -n 4 (for the size of a checkpoint)")
    size = os.path.getsize(os.path.join(ref, "ck", checkpoints(os.path.join(ref, "ck"))[-1]))
    room = (size * 3 // 2 + 4095) // 4096 * 4  # KiB
    run_dir = os.path.join(w, "run")
    ck = os.path.join(run_dir, "ck")
    kept = os.path.join(w, "kept")
    for d in (ck, kept):
        os.makedirs(d)
    per_rank = os.path.join(w, "rank_output")
    job = bed(2, 2, moe_lm("2x2", run_dir, steps, ck), ["--timeout", "60"],
              ["--output-filename", per_rank])
    # A mount namespace of the job's own, with the tmpfs over the checkpoint directory: the bed's
    # namespaces are made from it, so every host sees the tmpfs; the machine's is untouched. What
    # the tmpfs holds at the end is copied out before it goes with the namespace.
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
           'mount -t tmpfs -o "size=$0k" gshard-full "$1" || exit; d="$1" k="$2"; shift 2; "$@"; '
           's=$?; cp -p "$d"/step_* "$k"/ 2>/dev/null; exit $s', str(room), ck, kept] + job
    logpath = os.path.join(w, "run.log")
    log(f"--- 2 hosts x 2 ranks, 16 steps, the checkpoints on a tmpfs of {room} KiB "
        f"(a checkpoint is {size // 1024} KiB)")
    with open(logpath, "wb") as logfile:
        proc = start(cmd, logfile)
    # The first checkpoint as the job's namespace sees it, once complete.
    view = f"/proc/{proc.pid}/root{ck}"
    before = {}
    deadline = time.time() + 100
    while time.time() < deadline and proc.poll() is None and not before:
        try:
            names = checkpoints(view)
            before = {n: sha256(os.path.join(view, n)) for n in names}
        except OSError:
            pass
        time.sleep(0.005)
    try:
        status = proc.wait(timeout=JOB_LIMIT)
    except subprocess.TimeoutExpired:
        fail("the job did not end")
    out = open(logpath, errors="replace").read()
    log(f"    exit {status}; checkpoints seen first: {sorted(before)}\n" + tail(out, 2500))
    if status == 77:
        sys.exit(77)
    if "time limit for job execution has been reached" in out:
        fail("the job hung until its time limit instead of failing its save (Open MPI's OMPIO "
             "loses the write error and MPI_File_sync then waits on some ranks only: see "
             "docs/multihost.md)")
    if status == 0:
        fail("the job exited 0 with a full disk")
    text = same_report(per_rank)
    # The MPI error's text says what MPI-IO reports (ROMIO: "MPI_ERR_IO: input/output error").
    if not re.match(r"gshard::write_safetensors: .*" + re.escape(ck)
                    + r"/step_\d{8}\.safetensors\.tmp", text):
        fail(f"unexpected error: {text}")
    after = {n: sha256(os.path.join(kept, n)) for n in checkpoints(kept)}
    if not before or after != before:
        fail(f"the full disk holds {sorted(after)}, expected {sorted(before)} as it was")
    for n in after:
        verify_checkpoint(os.path.join(kept, n))
    expect_no_ranks(run_dir)


def rank_reports(per_rank, ranks):
    """Each rank's "moe_lm [rank R]: ..." line from its own stderr (mpirun --output-filename)."""
    reports = {}
    for rank in range(ranks):
        try:
            with open(os.path.join(per_rank, "1", f"rank.{rank}", "stderr"), errors="replace") as f:
                err = f.read()
        except OSError:
            continue
        found = re.findall(rf"^moe_lm \[rank {rank}\]: (.*)$", err, re.M)
        if len(found) > 1:
            fail(f"rank {rank} reported {len(found)} errors:\n{err}")
        if found:
            reports[str(rank)] = found[0]
    log("    reports:\n" + "\n".join(f"      rank {r}: {t}" for r, t in sorted(reports.items())))
    return reports


def same_report(per_rank):
    """The one error text that each of ranks 0-3 reported."""
    reports = rank_reports(per_rank, 4)
    texts = set(reports.values())
    if sorted(reports) != ["0", "1", "2", "3"] or len(texts) != 1:
        fail(f"expected the same report from each of ranks 0-3: {reports}")
    return texts.pop()


def case_readonly_resume(w):
    """A run resumed from a checkpoint directory that is read-only on host 2 from the start: it
    must resume (reading needs no writing) and fail its first save with the same gshard::Error
    on every rank, the checkpoints untouched."""
    run_dir = os.path.join(w, "run")
    ck = os.path.join(run_dir, "ck")
    run(bed(2, 2, moe_lm("2x2", run_dir, 8, ck)), "8 steps on 2 hosts x 2 ranks")
    before = {n: sha256(os.path.join(ck, n)) for n in checkpoints(ck)}
    per_rank = os.path.join(w, "rank_output")
    job = bed(2, 2, moe_lm("2x2", run_dir, 12, ck), ["--timeout", "60", "--readonly", "2", ck],
              ["--output-filename", per_rank])
    status, out = run(job, "resumed to 12 steps, the checkpoint directory read-only on host 2",
                      False)
    if "time limit for job execution has been reached" in out:
        fail("the job hung until its time limit (Open MPI's OMPIO: MPI_File_open of a file in a "
             "directory writable on some ranks only: see docs/multihost.md)")
    expect_resumed(out, ck, 8)
    if status == 0:
        fail("the run exited 0")
    text = same_report(per_rank)
    if not text.startswith(f"gshard::write_safetensors: cannot create {ck}/step_00000012"):
        fail("unexpected error")
    if {n: sha256(os.path.join(ck, n)) for n in checkpoints(ck)} != before:
        fail("the checkpoints changed")
    expect_no_ranks(run_dir)


def case_other_hosts(w):
    steps, at = 12, 8
    base = os.path.join(w, "2x2")
    run(bed(2, 2, moe_lm("2x2", base, steps, os.path.join(base, "ck"))),
        "2x2 on 2 hosts x 2 ranks, 12 steps")
    start_ck = f"step_{at:08d}.safetensors"
    verify_checkpoint(os.path.join(base, "ck", start_ck))
    reference = loss_rows(base)
    # 2x4: 2 of the 8 experts per rank (the expert axis has 4), each on 2 ranks; 1x8: one each.
    for hosts, slots, mesh in ((1, 2, "1x2"), (4, 2, "2x4"), (4, 2, "1x8")):
        dirs = {}
        for where in ("bed", "one"):
            d = dirs[where] = os.path.join(w, f"{mesh}_{where}")
            os.makedirs(os.path.join(d, "ck"))
            shutil.copy(os.path.join(base, "ck", start_ck), os.path.join(d, "ck", start_ck))
        ranks = hosts * slots
        cmd = moe_lm(mesh, dirs["bed"], steps, os.path.join(dirs["bed"], "ck"))
        _, out = run(bed(hosts, slots, cmd),
                     f"{mesh} on {hosts} host(s) x {slots} ranks from the 2x2 {start_ck}")
        expect_resumed(out, os.path.join(dirs["bed"], "ck"), at)
        cmd = moe_lm(mesh, dirs["one"], steps, os.path.join(dirs["one"], "ck"))
        _, out = run(one_host(ranks, cmd), f"{mesh} on 1 host, mpirun -n {ranks}, the same")
        expect_resumed(out, os.path.join(dirs["one"], "ck"), at)
        same_losses(dirs["bed"], dirs["one"], f"{mesh}: {hosts} host(s) against 1 host")
        final = f"step_{steps:08d}.safetensors"
        same_files(os.path.join(dirs["bed"], "ck"), os.path.join(dirs["one"], "ck"), [final],
                   f"{mesh}: final checkpoint, {hosts} host(s) against 1 host")
        got = loss_rows(dirs["bed"])
        if sorted(got) != sorted(reference):
            fail(f"{mesh}: steps {sorted(got)}, the 2x2 run has {sorted(reference)}")
        worst = 0.0
        for step in sorted(reference):
            if step <= at:  # the checkpoint's records, as the 2x2 run wrote them
                if got[step] != reference[step]:
                    fail(f"{mesh}: step {step} (from the checkpoint) differs: {got[step]} vs "
                         f"{reference[step]}")
                continue
            for x, y in zip(reference[step], got[step]):
                if (x == "") != (y == ""):
                    fail(f"{mesh}: step {step}: a loss in one run only")
                if x:
                    worst = max(worst, abs(float(x) - float(y)))
        log(f"    {mesh}: steps 0-{at} as the 2x2 run's, steps {at + 1}-{steps} within "
            f"{worst:.3g} of them (train loss at step {at + 1}: {reference[at + 1][0]} on 2x2, "
            f"{got[at + 1][0]} on {mesh})")
        if worst > 1e-4:
            fail(f"{mesh}: losses differ from the 2x2 run's by {worst} (limit 1e-4)")


CASES = {"bitwise": case_bitwise, "host_killed": case_host_killed,
         "unwritable": case_unwritable, "readonly_resume": case_readonly_resume,
         "full_disk": case_full_disk,
         "other_hosts": case_other_hosts}


def main():
    global args
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("--moe-lm", required=True)
    ap.add_argument("--hosts", required=True, help="scripts/hosts.sh")
    ap.add_argument("--mpirun", required=True,
                    help="the plain mpirun command for 4 ranks, '|'-separated, ending in -n 4")
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    args.moe_lm = os.path.abspath(args.moe_lm)
    args.hosts = os.path.abspath(args.hosts)
    args.mpirun = args.mpirun.split("|")
    if len(args.mpirun) < 3 or args.mpirun[-2] not in ("-n", "-np", "--np"):
        ap.error("--mpirun must end in -n COUNT")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    check = subprocess.run(["bash", args.hosts, "check"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    if check.returncode != 0:
        log(f"moe_lm_hosts_check: SKIP: {check.stdout.strip()}")
        sys.exit(77)
    w = os.path.abspath(os.path.join(args.work, args.case))
    shutil.rmtree(w, ignore_errors=True)
    os.makedirs(w)
    t = time.time()
    CASES[args.case](w)
    log(f"moe_lm_hosts_check ({args.case}): passed in {time.time() - t:.0f} s")


if __name__ == "__main__":
    main()
