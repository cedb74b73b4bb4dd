#!/bin/bash
# The stacked bf16 rescan of several query rows (scaled queries that the e4m3 fold cannot
# take) on a GPU, in one short run: its GPU tests, then its timing beside an older
# revision's per-row rescan, each case checked against the bound first.
#
#   OLD_SRC=../old/src LOG_DIR=out bash benchmarks/exp_scaled_rows_gpu.sh
#
# OLD_SRC: the src folder of the revision to compare (e.g. `git archive 30d1d13 src | tar
# -x -C ../old`); without it only this revision is timed. BUDGET: seconds for the whole
# run (default 235); the tests get what the timings leave. Compiles are CPU-bound, so the
# timing cases are compiled (and checked) in parallel while the tests run; the timed
# rounds then find them in Triton's cache. The last lines printed are the table.
set -o pipefail
export PYTHONUNBUFFERED=1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
NEW=$ROOT/src
OLD=${OLD_SRC:+$(cd "$OLD_SRC" && pwd)}
LOG_DIR=${LOG_DIR:-bench-out}
mkdir -p "$LOG_DIR"
END=$((SECONDS + ${BUDGET:-235}))
left() { local n=$((END - SECONDS)); [ $n -lt 5 ] && n=5; echo $n; }
LOG=$LOG_DIR/scaled-rows.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv 2>&1 | tee -a "$LOG"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
  2>&1 | tee -a "$LOG"

CASES=${CASES:-"fp8-mx:e4m3-mx:64x8192:4 mxfp4:e4m3-mx:64x8192:2 fp8-mx:bf16:64x8192:4"}
WARM=$(mktemp -d)
for c in $CASES; do
  PYTHONPATH=$NEW timeout $(( $(left) / 2 )) python3 benchmarks/scorer_cases.py --cases $c \
    > "$WARM/new-${c//:/_}.txt" 2>&1 &
  [ -n "$OLD" ] && PYTHONPATH=$OLD timeout $(( $(left) / 2 )) python3 benchmarks/scorer_cases.py \
    --cases $c > "$WARM/old-${c//:/_}.txt" 2>&1 &
done

XDIST=$(python3 -c "import xdist" 2>/dev/null && echo "-n 9")  # parallel compiles, if it is there
echo "== GPU tests: stacked rows, every fold, NaN query scales" | tee -a "$LOG"
PYTHONPATH=$NEW timeout $(( $(left) * 6 / 10 )) python3 -m pytest -q -p no:cacheprovider $XDIST -rfE \
  tests/test_logits.py -k "${TESTS:-every_fold or do_not_fold or poisoned_query_scale or stacked_rows_native}" \
  > "$LOG_DIR/scaled-rows-pytest.txt" 2>&1
echo "pytest exit $?" | tee -a "$LOG"
tail -15 "$LOG_DIR/scaled-rows-pytest.txt" | tee -a "$LOG"
wait
cat "$WARM"/*.txt > "$LOG_DIR/scaled-rows-compile.txt" 2>&1

echo "== timings (this revision, the older one, this one again)" | tee -a "$LOG"
for rev in new ${OLD:+old} new; do
  [ $rev = new ] && P=$NEW || P=$OLD
  PYTHONPATH=$P timeout $(left) python3 benchmarks/scorer_cases.py --cases $CASES 2>&1 \
    | grep -E " us |mismatch" | sed "s/^/$rev /" | tee -a "$LOG"
done
echo "== done in $SECONDS s" | tee -a "$LOG"
