"""fa2's kernels compile for GPUs before Hopper, with the tiles their tables choose, within the
shared memory those GPUs give a block: the forward, dQ and dK/dV kernels in fp16 for sm_75 (a T4,
which has no bf16) and in bf16 for sm_80 (an A100; the table keeps to the 99 KB of sm_86 and
sm_89, which read it too). Compiled on the CPU by Triton and its bundled ptxas, through
`packages/fa2/scripts/sm90_screen.py --target`, in two processes at once (about ten seconds each
on two cores); the whole tables' screen is `docs/results/fa2_pre_hopper_compile_cpu_*.md`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

from fa2.triton.configs import block_d  # noqa: E402
from fa2.triton.pre_hopper import SHARED_MEMORY, TABLES, architecture  # noqa: E402

SCREEN = Path(__file__).resolve().parents[1] / "scripts" / "sm90_screen.py"
# (target, case the screen names, the table family its head dim and dtype read)
TARGETS = {75: ("fp16 d64", "16bit_d64"), 80: ("bf16 d64", "16bit_d64")}
KERNELS = ("forward", "dq", "dkdv")


@pytest.fixture(scope="module")
def screens(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict]:
    """Each target's screen of its case's default tiles, compiled in a process of its own (the
    test process runs Triton's interpreter, which cannot compile)."""
    folder = tmp_path_factory.mktemp("pre_hopper")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(folder / "triton-cache")  # compile afresh, write nothing home
    running = {}
    for target, (case, _) in TARGETS.items():
        command = [
            sys.executable, str(SCREEN), "--target", str(target), "--tiles", "default",
            "--cases", case, "--kernels", *KERNELS, "--json", str(folder / f"{target}.json"),
        ]  # fmt: skip
        running[target] = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    for process in running.values():
        output = process.communicate(timeout=600)[0]
        assert process.returncode == 0, output
    return {t: json.loads((folder / f"{t}.json").read_text()) for t in TARGETS}


@pytest.mark.parametrize("target", TARGETS)
def test_the_default_tiles_compile_within_the_shared_memory(screens, target):
    family = TARGETS[target][1]
    arch = architecture(divmod(target, 10))
    rows = screens[target]["rows"]
    assert [r["kernel"] for r in rows] == list(KERNELS)
    for row in rows:
        assert "error" not in row, row
        assert row["tile"] == str(TABLES[arch][row["kernel"]][family][0])
        assert 0 < row["smem"] <= SHARED_MEMORY[arch] and row["fits"], row
    assert screens[target]["meta"]["target"] == f"sm_{target}"


def test_every_table_before_hopper_lists_each_family_the_kernels_ask_for():
    for table in TABLES.values():
        for kernel, lists in table.items():
            for width in ("16bit", "tf32", "32bit"):
                for d in (16, 64, 128, 256):
                    family = f"{width}_d{max(64, block_d(d))}"  # d <= 32 reads the d64 lists
                    tile = lists[family][0]
                    assert tile.block_m >= 16 and tile.block_n >= 16 and not tile.ws
                    if kernel in ("forward", "dq"):
                        assert tile.block_m % tile.block_n == 0, (kernel, family)
                    else:
                        assert tile.block_n % tile.block_m == 0, (kernel, family)


@pytest.mark.parametrize(
    ("capability", "arch"), [((7, 5), "sm75"), ((8, 0), "sm80"), ((8, 9), "sm80"), ((9, 0), None)]
)
def test_the_tile_is_chosen_by_the_devices_compute_capability(monkeypatch, capability, arch):
    import torch

    from fa2.triton import configs

    monkeypatch.setattr(configs, "INTERPRET", False)  # the interpreter has a table of its own
    monkeypatch.setattr(configs, "device_capability", lambda device: capability)
    for kernel, table in configs.KERNELS.items():
        tile = configs.choose_tile(
            table, head_dim_block=64, dtype=torch.float16, precision="tf32", seq_len=8192,
            key=tuple, run=None, device=torch.device("cuda", 0),
        )  # fmt: skip
        expected = (TABLES[arch][kernel] if arch else table)["16bit_d64"][0]
        assert tile == expected, kernel
