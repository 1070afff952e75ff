#!/usr/bin/env python3
"""Every error the library raises starts with "hyper_parallel::<qualified function>: ".

  error_style_check.py ROOT        scans ROOT/src, ROOT/include and ROOT/python/csrc; exit 1 listing the violations

A raising site is HP_CHECK_T(type, cond, message...) or TORCH_CHECK(cond, message...). Its message
must begin with a string literal "hyper_parallel::<name>[::<name>...]: ", or with a call that builds
such a message (a function whose name ends in _message, _report or _error, or `what` / `where`
parameters that the site's own literal prefixes, or a parameter named qualified... that callers pass
as "hyper_parallel::<function>"). TORCH_INTERNAL_ASSERT is an internal invariant,
not an error a user gets, and is not checked.
"""
import os
import re
import sys

MACROS = {"HP_CHECK_T": 2, "TORCH_CHECK": 1}
PREFIX = re.compile(r'^"hyper_parallel::[A-Za-z_][A-Za-z0-9_]*(::([A-Za-z_~][A-Za-z0-9_]*|operator\(\)|operator\[\]))*(: |")')
# A message made elsewhere and already prefixed there (its maker is checked as a raising site or
# named for what it returns).
BUILT = re.compile(r"^([A-Za-z_][A-Za-z0-9_:.>-]*(_message|_report|_error|message_of|what_without_backtrace)\b|qualified\w*$)")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: " " * len(m.group(0)), text, flags=re.S)
    return re.sub(r"//[^\n]*", lambda m: " " * len(m.group(0)), text)


def arguments(text, start):
    """Top-level arguments of the call whose '(' is at text[start]."""
    depth, args, cur, i, in_str = 0, [], [], start, None
    while i < len(text):
        c = text[i]
        if in_str:
            cur.append(c)
            if c == "\\":
                cur.append(text[i + 1])
                i += 1
            elif c == in_str:
                in_str = None
        elif c in "\"'":
            in_str = c
            cur.append(c)
        elif c in "([{":
            depth += 1
            if depth > 1:
                cur.append(c)
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                args.append("".join(cur).strip())
                return args
            cur.append(c)
        elif c == "," and depth == 1:
            args.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    return args


def violations(root):
    out = []
    for top in ("src", "include", "python/csrc"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith((".cpp", ".h")):
                    continue
                path = os.path.join(dirpath, f)
                text = strip_comments(open(path, encoding="utf-8").read())
                for m in re.finditer(r"\b(HP_CHECK_T|TORCH_CHECK)\s*\(", text):
                    if text[max(0, m.start() - 8):m.start()].endswith("define "):
                        continue
                    args = arguments(text, m.end() - 1)
                    k = MACROS[m.group(1)]
                    line = text.count("\n", 0, m.start()) + 1
                    msg = args[k] if len(args) > k else ""
                    if PREFIX.match(msg) or BUILT.match(msg):
                        continue
                    # "hyper_parallel::", fn, ": ..." with the function's name in a variable.
                    if re.match(r'^"hyper_parallel::([A-Za-z_]\w*::)*"$', msg) and len(args) > k + 1 and re.match(r"^[A-Za-z_][A-Za-z0-9_.]*(\(\))?$", args[k + 1]):
                        continue
                    out.append(f"{os.path.relpath(path, root)}:{line}: {' '.join(msg.split())[:90]}")
    return out


if __name__ == "__main__":
    found = violations(sys.argv[1] if len(sys.argv) > 1 else ".")
    for v in found:
        print(v)
    print(f"{len(found)} error message(s) do not start with \"hyper_parallel::<function>: \"")
    sys.exit(1 if found else 0)
