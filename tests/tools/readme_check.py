#!/usr/bin/env python3
"""README.md keeps its two commands, CI runs command (2), and README.md and docs/*.md link only to what exists.

  readme_check.py ROOT        checks ROOT/README.md, ROOT/docs/*.md and ROOT/.ci/run; exit 1 naming what broke

(a) README.md's first code block holds the two commands, each as a line of its own, word for word;
(b) .ci/run runs command (2), as a line of its own;
(c) every relative Markdown link in README.md and docs/*.md points to a file or folder that exists, and
    its #anchor, if any, to a heading of the target Markdown file (GitHub's slugs: lowercase, everything
    but letters, digits, underscores, hyphens and spaces dropped, spaces turned into hyphens, a repeated
    heading's slug suffixed -1, -2, ...); http(s) and mailto links are not checked;
(d) every docs/*.md page is linked from README.md.
Links and headings inside fenced code blocks and inline code spans do not count.
"""
import glob
import os
import re
import sys

COMMANDS = [
    "scripts/setup.sh && build/tools/hprun/hprun --nproc-per-node 2 build/examples/qwen3/qwen3_train",
    "scripts/setup.sh && ctest --test-dir build --output-on-failure -j2",
]

FENCE = re.compile(r"^\s{0,3}(```|~~~)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target "title") and ![alt](target); the target may be wrapped in <...>.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]*)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(\S+)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def prose_lines(text):
    """(line number, line) outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif line.strip().startswith(fence):
                fence = None
            continue
        if fence is None:
            yield number, line


def first_code_block(text):
    lines, inside = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            if inside:
                return lines
            inside = True
            continue
        if inside:
            lines.append(line)
    return lines


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link counts as its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.lower()
    text = "".join(c for c in text if c.isalnum() or c in "_- ")
    return text.replace(" ", "-")


def anchors(text):
    seen, out = {}, set()
    for _, line in prose_lines(text):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else "%s-%d" % (base, n))
    return out


def links(text):
    """(line number, target) of every link outside code."""
    for number, line in prose_lines(text):
        m = REFERENCE_DEF.match(line)
        if m:
            yield number, m.group(1).strip("<>")
            continue
        line = CODE_SPAN.sub(lambda c: " " * len(c.group(0)), line)
        for m in INLINE_LINK.finditer(line):
            yield number, m.group(1).strip("<>")


def main(argv):
    if len(argv) != 2:
        print("usage: readme_check.py ROOT", file=sys.stderr)
        return 2
    root = os.path.abspath(argv[1])
    readme = os.path.join(root, "README.md")
    problems = []
    if not os.path.isfile(readme):
        print("readme_check: %s does not exist" % readme, file=sys.stderr)
        return 1
    readme_text = read(readme)

    # (a) the two commands, word for word, in README.md's first code block.
    first_block = [line.strip() for line in first_code_block(readme_text)]
    all_lines = [line.strip() for line in readme_text.split("\n")]
    for i, command in enumerate(COMMANDS, 1):
        if command not in all_lines:
            problems.append("README.md: no longer contains command (%d) word for word, as a line of its own: %s" % (i, command))
        elif command not in first_block:
            problems.append("README.md: command (%d) is no longer in the first code block (README starts with the two commands): %s" %
                            (i, command))

    # (b) CI runs command (2).
    ci = os.path.join(root, ".ci", "run")
    if not os.path.isfile(ci):
        problems.append(".ci/run: does not exist (it must run README command (2): %s)" % COMMANDS[1])
    elif COMMANDS[1] not in [line.strip() for line in read(ci).split("\n")]:
        problems.append(".ci/run: no longer runs README command (2) as a line of its own: %s" % COMMANDS[1])

    # (c) relative links and their anchors.
    pages = sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    anchor_cache = {}

    def anchors_of(path):
        if path not in anchor_cache:
            anchor_cache[path] = anchors(read(path))
        return anchor_cache[path]

    linked_from_readme = set()
    checked = 0
    for source in [readme] + pages:
        name = os.path.relpath(source, root)
        for number, target in links(read(source)):
            if re.match(r"^(https?|mailto):", target, re.I):
                continue
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                problems.append("%s:%d: link to %s: only relative links and http(s) are allowed" % (name, number, target))
                continue
            checked += 1
            path_part, _, anchor = target.partition("#")
            if path_part.startswith("/"):
                problems.append("%s:%d: link to %s: an absolute path; links are relative to the file" % (name, number, target))
                continue
            resolved = os.path.normpath(os.path.join(os.path.dirname(source), path_part)) if path_part else source
            if not os.path.exists(resolved):
                problems.append("%s:%d: link to %s: %s does not exist" % (name, number, target, os.path.relpath(resolved, root)))
                continue
            if source == readme:
                linked_from_readme.add(resolved)
            if anchor:
                if os.path.isfile(resolved) and resolved.endswith(".md"):
                    if anchor not in anchors_of(resolved):
                        problems.append("%s:%d: link to %s: %s has no heading with the anchor #%s" %
                                        (name, number, target, os.path.relpath(resolved, root), anchor))

    # (d) every docs page linked from README.md.
    for page in pages:
        if page not in linked_from_readme:
            problems.append("README.md: does not link to %s" % os.path.relpath(page, root))

    if problems:
        for p in problems:
            print("readme_check: " + p, file=sys.stderr)
        print("readme_check: %d problem(s)" % len(problems), file=sys.stderr)
        return 1
    print("readme_check: ok: README.md and %d docs pages, %d relative links, the two commands, .ci/run runs command (2)" %
          (len(pages), checked))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
