"""bench-matrix: short bench-train runs over attention kernels x parallel modes x model sizes, on
the same text, seed and global batch, side by side (seed 002's LM benchmark matrix).

Each cell is one bench-train run in a folder of its own under --out (`cells/<size>_<attention>_
<parallel>`); the row of a cell is its summary: tokens/s and the step time they imply, the
busiest rank's peak memory (CUDA), the final training and validation losses, the first step's
time, MFU. The same seed, data and global batch make every parallel mode train on the same
sequences, so a cell's final loss must agree with the one-rank cell of its size and attention
(or the first mode listed) within --loss-tolerance: a disagreement is flagged in the row
(`loss_agrees`) and in the notes, and the command ends with status 1. Cells are compared eager
(--no-compile, the default: a compiled cell's first step, compilation included, would weigh
differently).

The matrix resumes: run the same command again and each finished cell (a summary of the same
configuration) is read back, not trained again; a cell killed after a checkpoint continues from
it (bench-train --resume); a cell that failed (out of memory, say) is tried again. The matrix's
files are written to --out each time: matrix.json, matrix.csv, matrix.md, and the plots
matrix_time.png, matrix_memory.png (CUDA) and matrix_throughput.png (a bar per parallel mode, a
group per attention kernel, a panel per size).

Examples:
  bench-matrix --data input.txt --out runs/matrix                          # a GPU's default
  bench-matrix --data input.txt --out runs/m2 --nproc 2 --attention sdpa fa2-triton naive \\
      --parallel single ddp ddp:naive ddp:torch zero1 fsdp fsdp:torch --size small medium
  bench-matrix --data input.txt --out runs/cpu --device cpu                # 2 gloo ranks
"""

from __future__ import annotations

from bench.core.cli import Command
from bench.train.matrix_config import MatrixConfig

__all__ = ["COMMAND", "main"]

COMMAND = Command("bench-matrix", __doc__, config=MatrixConfig, run="bench.train.matrix:run_parsed")
main = COMMAND.main
