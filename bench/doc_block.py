"""Shared by the bench table scripts: run notes, and rewriting a marked block of a document."""
import argparse
import csv
import sys


def read_meta(path):
    """The non-empty lines of a file describing the run (machine, load), or none."""
    if not path:
        return []
    with open(path) as f:
        return [line.rstrip() for line in f if line.strip()]


def write_block(doc, text, begin, end, tool):
    """Replaces the block from `begin` to `end` of `doc` by `text` (which holds both markers);
    prints `text` when no document is given."""
    if not doc:
        print(text)
        return 0
    with open(doc) as f:
        content = f.read()
    if begin not in content or end not in content:
        sys.exit(f"{tool}: {doc} has no {begin} ... {end} markers")
    head, rest = content.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(doc, "w") as f:
        f.write(head + text + tail)
    print(f"{tool}: updated {doc}")
    return 0


def per_rank_rows(begin):
    """The command line of a per-rank table script (run_ranks.sh): [--doc D] [--meta M] CSV...
    Returns the arguments, every CSV's rows, and the block's first lines (the marker, then one
    bullet per line of the run's record)."""
    p = argparse.ArgumentParser()
    p.add_argument("--doc")
    p.add_argument("--meta")
    p.add_argument("csvs", nargs="+")
    a = p.parse_args()
    rows = []
    for path in a.csvs:
        with open(path) as f:
            rows += list(csv.DictReader(f))
    return a, rows, [begin, ""] + ["- " + m for m in read_meta(a.meta)]
