#!/usr/bin/env bash
# One command of the full gnn-graphs run with the torch peers, for a machine whose commands have a time limit:
#
#     OUT=folder bash benchmarks/gnn_full_run.sh [LIMIT_S [ARG ...]]   (from the repository root; LIMIT_S default 560)
#
# The run's JSON is benchmarks/results/gnn_full_run2_<gpu>.json (h100 or h200, from nvidia-smi). The command copies
# it into $OUT and continues it there (--resume: the cells it holds are kept), writing after every cell, so a command
# killed at the limit keeps what it measured; copy $OUT's file back into benchmarks/results/ after each command.
# A new run first runs the --small cells and refuses to start if any fails. Each command starts no cell that would
# end after LIMIT_S - 90 s (--stop-after-s) and is killed at LIMIT_S (timeout). Each part of a cell is logged in
# $OUT/progress.log (--log-parts); the ARGs go to the script (--skip PART: a peer's part not to run, as the log names it).
set -u
LIMIT=${1:-560}
shift $(( $# > 0 ? 1 : 0 ))
OUT=${OUT:?set OUT to the folder the JSON and logs go to}
export PYTHONPATH=${PYTHONPATH:-.}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$GPU" in
  *H100*) TAG=h100; MEM=45 ;;  # PyG's estimated memory limit (GiB) on an 80 GB card
  *H200*) TAG=h200; MEM=60 ;;
  *) echo "expected an H100 or an H200; got: $GPU" >&2; exit 2 ;;
esac
R=benchmarks/results/gnn_full_run2_$TAG.json
J="$OUT/$(basename "$R")"
mkdir -p "$OUT"
echo "GPU $GPU: $R (continued in $J)"
if [ -f "$R" ]; then
  cp "$R" "$J" && chmod u+w "$J"
else
  timeout 200 python benchmarks/bench_gnn_graphs.py --small --json "$OUT/small.json" > "$OUT/small.log" 2>&1
  rc=$?
  tail -5 "$OUT/small.log"
  if [ $rc -ne 0 ]; then echo "the small run failed (exit status $rc): not starting" >&2; exit 1; fi
  LIMIT=$((LIMIT - SECONDS))
fi
if [ "$LIMIT" -lt 150 ]; then echo "expected at least 150 s left for the run; got $LIMIT" >&2; exit 2; fi
timeout "$LIMIT" python benchmarks/bench_gnn_graphs.py --row-budget-s 5 --dtype float32 bfloat16 \
  --pyg-mem-gib "$MEM" --json "$J" --resume --log-parts --stop-after-s $((LIMIT - 90)) "$@" 2> "$OUT/progress.log" | tail -60
