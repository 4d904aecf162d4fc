#!/usr/bin/env python3
"""docs/api.md describes every public header and only what users call:
1. its '### `gshard/<path>.hpp`' headings are exactly the headers under include/gshard/;
2. every function or template it names in backticks (`name(` or `name<`) is declared somewhere
   in the headers outside `namespace detail` and outside private sections, unless the doc writes
   it as `detail::name`, so internals cannot pass for public API."""
import os
import re
import sys

# Names api.md uses that are not gshard declarations, each with why.
NOT_DECLARATIONS = {
    "ceil": "arithmetic in prose: ceil(N/k)",
    "floor": "arithmetic in prose: floor(S * capacity_factor / E)",
    "mallopt": "glibc, what EnvironmentOptions::tune_malloc calls",
    "Opt": "placeholder for Sgd, Adam, AdamW, Adafactor",
    "load": "OptimizerBase (nn::detail, the CRTP base) reaches users through each optimizer",
}


def public_text(src):
    """The header without `namespace ...detail {` blocks and private/protected sections (the
    sources are clang-formatted: namespaces close with a comment, access labels indent by 1)."""
    out, in_detail, private_indent = [], 0, None
    for line in src.split("\n"):
        if re.match(r"^\s*namespace [\w:]*detail\s*\{", line):
            in_detail += 1
            continue
        if in_detail and re.match(r"^\s*\}\s*//\s*namespace [\w:]*detail\b", line):
            in_detail -= 1
            continue
        if in_detail:
            continue
        m = re.match(r"^(\s*)(private|protected|public):", line)
        if m:
            private_indent = len(m.group(1)) if m.group(2) != "public" else None
            continue
        if private_indent is not None:
            if re.match(r"^\s{%d}\};" % max(private_indent - 1, 0), line):
                private_indent = None
            else:
                continue
        out.append(re.sub(r"//.*", "", line))
    return "\n".join(out)


def main():
    root = sys.argv[1]
    inc = os.path.join(root, "include")
    headers, public = set(), set()
    for d, _, files in os.walk(os.path.join(inc, "gshard")):
        for f in files:
            if f.endswith(".hpp"):
                path = os.path.join(d, f)
                headers.add(os.path.relpath(path, inc))
                public |= set(re.findall(r"[A-Za-z_]\w*", public_text(open(path).read())))
    doc = open(os.path.join(root, "docs", "api.md")).read()
    headings = re.findall(r"^### `(gshard/[\w/]+\.hpp)`\s*$", doc, re.M)
    twice = {h for h in headings if headings.count(h) > 1}
    missing = headers - set(headings)
    extra = set(headings) - headers
    if missing or extra or twice:
        sys.exit("check_api: headers without a section in docs/api.md: %s; sections for files "
                 "that do not exist: %s; sections given twice: %s"
                 % (sorted(missing), sorted(extra), sorted(twice)))
    internal = {}
    for tok in re.findall(r"`([^`\n]+)`", doc):
        if "detail::" in tok or "std::" in tok or tok.startswith("gshard/"):
            continue
        for m in re.finditer(r"(?:^|[\s.:(,])([A-Za-z_]\w*)\s*(?=[(<])", tok):
            name = m.group(1)
            if name not in public and name not in NOT_DECLARATIONS:
                internal.setdefault(name, tok)
    if internal:
        sys.exit("check_api: docs/api.md presents internal names as public API (write them as "
                 "`detail::name`, or leave them out): %s"
                 % "; ".join("%s in `%s`" % kv for kv in sorted(internal.items())))
    print("check_api: %d headers, each with its section; every name it documents is public"
          % len(headers))


if __name__ == "__main__":
    main()
