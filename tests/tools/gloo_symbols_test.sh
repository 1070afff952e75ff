#!/usr/bin/env bash
# Our library must export nothing of Gloo's own types (namespace gloo): the Gloo headers we compile
# against (Debian's, 2022) are older than the Gloo inside the 2.x wheel's libtorch (2025), and an
# exported inline function or template instantiation of theirs could be bound in place of
# libtorch's own at load time. (c10d's ProcessGroupGloo comes from libtorch's own headers; UBSan's
# vptr check makes a sanitized build emit its typeinfo, which is harmless.)
set -eu
LIB=$1
exported=$(nm -DC --defined-only "$LIB" | grep "gloo::" || true)
if [ -n "$exported" ]; then
  echo "gloo_symbols: $LIB exports Gloo code (keep Gloo types in src/runtime/transport/c10d_backends.cpp):"
  echo "$exported"
  exit 1
fi
echo "gloo_symbols: $LIB exports no Gloo symbol; it uses libtorch's: $(nm -DC --undefined-only "$LIB" | grep -ci "gloo")"
