#!/usr/bin/env python3
"""The layering rule of docs/design.md: each folder under include/gshard/ includes only headers of
its own folder and of the folders above it in the "Layers" table, so no two folders include each
other. Fails naming each include that breaks it."""
import os
import re
import sys


def main():
    root = sys.argv[1]
    design = open(os.path.join(root, "docs", "design.md")).read()
    table = design.split("## Layers", 1)[1].split("\n## ", 1)[0]
    order = re.findall(r"^\| `(\w+)/` \|", table, re.M)
    inc = os.path.join(root, "include", "gshard")
    folders = sorted(d for d in os.listdir(inc) if os.path.isdir(os.path.join(inc, d)))
    unlisted = [f for f in folders if f not in order]
    if unlisted:
        sys.exit("check_layers: folders missing from the Layers table of docs/design.md: %s"
                 % unlisted)
    rank = {f: i for i, f in enumerate(order)}
    bad = []
    for d, _, files in os.walk(inc):
        for f in files:
            path = os.path.join(d, f)
            rel = os.path.relpath(path, inc)
            if "/" not in rel:
                continue  # gshard.hpp, version.hpp: the top
            mine = rel.split("/")[0]
            for m in re.finditer(r'^#include "([^"]+)"', open(path).read(), re.M):
                target = os.path.relpath(os.path.normpath(os.path.join(d, m.group(1))), inc)
                theirs = target.split("/")[0] if "/" in target else None
                if theirs is None or theirs == mine:
                    continue
                if rank[theirs] > rank[mine]:
                    bad.append("%s includes %s (%s/ is below %s/)" % (rel, target, mine, theirs))
    if bad:
        sys.exit("check_layers: includes against the layering:\n  " + "\n  ".join(sorted(bad)))
    print("check_layers: %d folders in order %s, every include points up" % (len(order),
                                                                            " > ".join(order)))


if __name__ == "__main__":
    main()
