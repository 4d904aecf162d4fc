#!/usr/bin/env python3
"""docs/tutorial.md shows the tutorial programs' own code: each ```cpp block follows a marker
<!-- snippet: examples/tutorial/NAME.cpp TAG --> and must equal (after dedent) the lines between
the two `// [TAG]` comments of that file. A marker <!-- program: examples/tutorial/NAME.cpp -->
says the document shows that program whole: its snippets, in the document's order, are in the
file's order, and every line of the file outside them is blank, a comment or a marker. Every
program under examples/tutorial/ must be one of the steps the build runs (the arguments), and
every step must appear in the document."""
import os
import re
import sys
import textwrap


def block(path, tag):
    """The text between the two `// [TAG]` lines of the file, and their line numbers."""
    lines = open(path).read().split("\n")
    marks = [i for i, l in enumerate(lines) if l.strip() == "// [%s]" % tag]
    if len(marks) != 2:
        sys.exit("check_tutorial: %s has %d '// [%s]' markers, not 2" % (path, len(marks), tag))
    text = textwrap.dedent("\n".join(lines[marks[0] + 1:marks[1]])).strip("\n")
    return text, marks[0], marks[1]


def check_whole(root, path, shown):
    """`shown`: the (start, end) marker lines of the file's snippets, in document order."""
    if not shown:
        sys.exit("check_tutorial: %s is marked as shown whole but has no snippet" % path)
    if shown != sorted(shown):
        sys.exit("check_tutorial: the snippets of %s are not in the file's order" % path)
    lines = open(os.path.join(root, path)).read().split("\n")
    covered = set()
    for start, end in shown:
        covered.update(range(start, end + 1))
    for i, line in enumerate(lines):
        text = line.strip()
        if i in covered or not text or text.startswith("//"):
            continue
        sys.exit("check_tutorial: %s is marked as shown whole, but its line %d is in no snippet:"
                 "\n%s" % (path, i + 1, line))


def main():
    root, steps = sys.argv[1], set(sys.argv[2:])
    doc = open(os.path.join(root, "docs", "tutorial.md")).read()
    pattern = re.compile(r"<!-- snippet: (examples/tutorial/([\w]+)\.cpp) (\w+) -->\n```cpp\n(.*?)```",
                         re.S)
    seen = set()
    shown = {}
    count = 0
    for m in pattern.finditer(doc):
        path, name, tag, text = m.group(1), m.group(2), m.group(3), m.group(4)
        if name not in steps:
            sys.exit("check_tutorial: %s is not a step the test suite builds and runs" % path)
        want, start, end = block(os.path.join(root, path), tag)
        got = textwrap.dedent(text).strip("\n")
        if got != want:
            sys.exit("check_tutorial: the block %s [%s] differs from the program:\n--- doc\n%s\n"
                     "--- program\n%s" % (path, tag, got, want))
        seen.add(name)
        shown.setdefault(path, []).append((start, end))
        count += 1
    blocks = doc.count("```cpp")
    if blocks != count:
        sys.exit("check_tutorial: %d cpp blocks, %d of them with a snippet marker" % (blocks, count))
    whole = re.findall(r"<!-- program: (examples/tutorial/[\w]+\.cpp) -->", doc)
    for path in whole:
        check_whole(root, path, shown.get(path, []))
    files = {f[:-4] for f in os.listdir(os.path.join(root, "examples", "tutorial"))
             if f.endswith(".cpp")}
    if files != steps:
        sys.exit("check_tutorial: programs %s, steps built %s" % (sorted(files), sorted(steps)))
    if seen != steps:
        sys.exit("check_tutorial: steps not shown in docs/tutorial.md: %s" % sorted(steps - seen))
    print("check_tutorial: %d blocks from %d programs match; %d shown whole"
          % (count, len(seen), len(whole)))


if __name__ == "__main__":
    main()
