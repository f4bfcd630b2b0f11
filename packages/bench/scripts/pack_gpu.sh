#!/usr/bin/env bash
# bench-train --pack against plain rows on one GPU: tokens/s and loss, in about two minutes.
#
#   packages/bench/scripts/pack_gpu.sh TEXT_FILE OUT_DIR
#
# TEXT_FILE's paragraphs (runs of lines between blank lines: a play's speeches) become documents,
# joined by GPT-2's <|endoftext|>, which the BPE tokenizer keeps as one token. Both runs train
# `small` on them at context 1024 (tens of documents a row), batch 32, bf16 autocast,
# fa2-triton, STEPS steps, eager (--no-compile: two compilations would take the two minutes;
# the default's compile of the varlen kernels is left for a longer run): `plain`, rows drawn
# from the stream whose attention crosses documents, and `packed` (--pack), the same rows with
# attention kept inside each document and positions restarting in each. The speed table, plain
# the baseline, with both runs' final train and validation losses:
# OUT_DIR/train_pack_<device>_<date>.{md,json,png}.
# Runs from the repository root without installing (PYTHONPATH = every package's src/).
# SIZE, CONTEXT, BATCH and STEPS change the runs (a CPU rehearsal: SIZE=tiny CONTEXT=64 BATCH=4
# STEPS=4).
set -euo pipefail

TEXT=${1:?usage: pack_gpu.sh TEXT_FILE OUT_DIR}
OUT=${2:?usage: pack_gpu.sh TEXT_FILE OUT_DIR}
STEPS=${STEPS:-150}
SIZE=${SIZE:-small}
CONTEXT=${CONTEXT:-1024}
BATCH=${BATCH:-32}
RUNS=${RUNS:-$(mktemp -d)}
PYTHONPATH=$(ls -d "$PWD"/packages/*/src | paste -sd:)${PYTHONPATH:+:$PYTHONPATH}
export PYTHONPATH
mkdir -p "$OUT" "$RUNS"
DOCS="$RUNS/documents.txt"
python3 - "$TEXT" "$DOCS" <<'PY'
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
paragraphs = [p.strip("\n") for p in re.split(r"\n\s*\n", text) if p.strip()]
open(sys.argv[2], "w", encoding="utf-8").write("<|endoftext|>".join(paragraphs))
print(f"{len(paragraphs)} documents", file=sys.stderr)
PY
COMMON=(--data "$DOCS" --cache-dir "$RUNS/cache" --no-progress --size "$SIZE"
  --context-length "$CONTEXT" --batch-size "$BATCH" --steps "$STEPS" --log-every 10
  --eval-every 0 --eval-batches 10 --generate 0 --no-compile)
python3 -m bench train "${COMMON[@]}" --out "$RUNS/plain"
python3 -m bench train "${COMMON[@]}" --pack --out "$RUNS/packed"
python3 -m bench train-results --out "$OUT" --speed plain="$RUNS/plain" packed="$RUNS/packed" \
  --baseline plain --speed-topic train_pack \
  --note "Documents: TEXT_FILE's paragraphs joined by <|endoftext|>; plain rows attend across them, packed (--pack) rows only within each (fa2's varlen kernels), positions restarting. The losses are of the same targets; the packed model never sees the document before."
