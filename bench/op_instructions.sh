#!/usr/bin/env bash
# Instructions per op of dtensor_op_overhead's cases (plain and DTensor, rule-cache hit), counted
# by callgrind: stable across runs where timings on these VMs are not.
# Usage: bench/op_instructions.sh [build/bench/hp_bench] [N]
set -euo pipefail
bench=${1:-build/bench/hp_bench}
n=${2:-2000}
out=$(mktemp -d)
for op in add linear layer_norm; do
  valgrind --tool=callgrind --callgrind-out-file="$out/$op" "$bench" --instructions "$op" "$n" >/dev/null 2>&1
  callgrind_annotate --inclusive=yes --threshold=100 "$out/$op" 2>/dev/null |
    awk -v op="$op" -v n="$n" '/hp_bench_repeat_(plain|dtensor)\(.*\[/ {
      gsub(",", "", $1); kind = ($0 ~ /repeat_plain/) ? "plain" : "dtensor"; v[kind] = $1 / n }
      END { printf "{\"name\": \"dtensor_op_instructions\", \"op\": \"%s\", \"plain\": %.0f, \"dtensor\": %.0f, \"ratio\": %.2f}\n",
                   op, v["plain"], v["dtensor"], v["dtensor"] / v["plain"] }'
done
rm -rf "$out"
