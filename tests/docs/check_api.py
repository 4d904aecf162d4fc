#!/usr/bin/env python3
"""docs/api.md describes every public header: its '### `gshard/<path>.hpp`' headings must be
exactly the headers under include/gshard/."""
import os
import re
import sys


def main():
    root = sys.argv[1]
    inc = os.path.join(root, "include")
    headers = set()
    for d, _, files in os.walk(os.path.join(inc, "gshard")):
        for f in files:
            if f.endswith(".hpp"):
                headers.add(os.path.relpath(os.path.join(d, f), inc))
    doc = open(os.path.join(root, "docs", "api.md")).read()
    headings = re.findall(r"^### `(gshard/[\w/]+\.hpp)`\s*$", doc, re.M)
    twice = {h for h in headings if headings.count(h) > 1}
    missing = headers - set(headings)
    extra = set(headings) - headers
    if missing or extra or twice:
        sys.exit("check_api: headers without a section in docs/api.md: %s; sections for files "
                 "that do not exist: %s; sections given twice: %s"
                 % (sorted(missing), sorted(extra), sorted(twice)))
    print("check_api: %d headers, each with its section" % len(headers))


if __name__ == "__main__":
    main()
