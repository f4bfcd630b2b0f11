"""The one vocabulary of layouts and precisions (`bench.core.layouts`): every command offers its
names, old names read as new ones (with a note where the meaning changed), results of the old
schema read renamed, and `bench.core.parallel.Parallel` runs each layout with its own class."""

from __future__ import annotations

import json
import re

import pytest
import torch
import torch.distributed as dist
from spawn_ranks import free_port
from torch import nn

import bench
import ddp
import zero
from bench.commands import data_parallel, model, plan, sharding, step, train
from bench.core.layouts import (
    ALIASES,
    CHANGED,
    LAYOUTS,
    PRECISIONS,
    check_combination,
    renamed_row,
    resolve,
)
from bench.core.parallel import Parallel
from bench.core.results import load_json
from bench.train import TrainConfig
from bench.train.choices import PARALLEL_MODES

SRC = bench.__path__[0]


def _choices(command, flag):
    """The choices `command`'s parser lists for `flag`."""
    parser = command.COMMAND.parser()
    (action,) = [a for a in parser._actions if flag in a.option_strings]
    return tuple(action.choices)


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        (train, "--parallel"),
        (train, "--precision"),
        (step, "--parallel"),
        (step, "--precision"),
        (plan, "--layout"),
        (plan, "--precision"),
        (data_parallel, "--variants"),
        (sharding, "--variants"),
        (model, "--precision"),
    ],
)
def test_every_command_offers_names_of_the_one_table(command, flag):
    offered = set(_choices(command, flag)) - {"all-reduce"}  # bench-ddp's row that is no layout
    assert offered and offered <= set(LAYOUTS) | set(PRECISIONS), offered


def test_every_old_name_reads_as_its_new_one_where_the_meaning_stayed():
    for old, new in ALIASES.items():
        assert resolve(old, command="bench-train", offered=tuple(LAYOUTS)) == (new, None)
    with pytest.raises(ValueError, match="not one of"):
        resolve("zero2", command="bench-train", offered=PARALLEL_MODES)


def test_a_name_whose_meaning_changed_runs_the_new_meaning_with_a_note(capsys):
    parser = sharding.COMMAND.parser()
    assert parser.parse_args(["--variants", "ddp", "sharded"]).variants == [
        "ddp",
        "zero1:torch-ddp",
    ]
    note = capsys.readouterr().err
    assert "bench-zero: 'ddp' now means ddp.DDPBucketed" in note and "'ddp:torch'" in note
    assert model.COMMAND.parser().parse_args(["--dtype", "bf16"]).dtypes == ["bf16-autocast"]
    assert "'bf16' is spelled 'bf16-autocast' now" in capsys.readouterr().err
    for command, name in CHANGED:
        assert name in LAYOUTS or name in PRECISIONS, (command, name)


def test_results_of_the_old_schema_read_in_the_new_names(tmp_path):
    rows = [
        {"variant": "ddp", "bucket_mb": None},
        {"variant": "sharded", "bucket_mb": 25.0},
        {"variant": "torch-fsdp", "compute_dtype": "bf16"},
    ]
    path = tmp_path / "zero.json"
    record = {"config": {}, "env": {}, "command": "bench-zero", "date": "2026-11-22"}
    path.write_text(
        json.dumps({"schema": "cs336sys-bench/1", "tool": "zero", "rows": rows, **record})
    )
    run = load_json(path)
    assert [r["variant"] for r in run.rows] == ["ddp:torch", "zero1:torch-ddp", "fsdp:torch"]
    assert run.schema == "cs336sys-bench/2"
    assert renamed_row("ddp", {"variant": "bucketed", "case": "bucketed 10 MB"}) == {
        "variant": "ddp",
        "case": "ddp 10 MB",
    }
    assert renamed_row("model", {"dtype": "bf16"}) == {"dtype": "bf16-autocast"}
    assert renamed_row("step", {"precision": "bf16"}) == {"precision": "bf16"}  # stored: as now


def test_what_does_not_run_together_is_refused():
    check_combination("fsdp", "bf16")  # zero.FSDP keeps bf16 shards of a bf16 model
    check_combination("fsdp:no-prefetch", "bf16-autocast")
    with pytest.raises(ValueError, match="predicted by bench-plan only"):
        check_combination("ddp", "bf16-master")
    with pytest.raises(ValueError, match="unknown layout"):
        check_combination("zero3", "bf16")
    check_combination("fsdp:torch", "bf16")


_CLASSES = {
    "single": nn.Linear,
    "ddp": ddp.DDPBucketed,
    "ddp:naive": ddp.NaiveDDP,
    "ddp:flat": ddp.FlatDDP,
    "ddp:individual": ddp.DDPIndividualParameters,
    "ddp:torch": nn.parallel.DistributedDataParallel,
    "zero1": ddp.DDPBucketed,
    "zero1:torch-ddp": nn.parallel.DistributedDataParallel,
    "fsdp": zero.FSDP,
    "fsdp:no-prefetch": zero.FSDP,
}
# (zero1:torch, torch's ZeroRedundancyOptimizer, runs in bench-zero's session run: importing it
# takes seconds of TorchScript)
_OPTIMIZERS = {"zero1": zero.ShardedOptimizer, "zero1:torch-ddp": zero.ShardedOptimizer}


@pytest.fixture
def one_rank():
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


def test_parallel_wraps_each_layout_with_its_own_class_and_optimizer(one_rank):
    cpu = torch.device("cpu")
    for name, cls in _CLASSES.items():
        parallel = Parallel(name, device=cpu, precision="fp32")
        wrapped = parallel.wrap(nn.Linear(4, 3))
        assert isinstance(wrapped, cls), name
        optimizer = parallel.build_optimizer(wrapped.parameters(), torch.optim.AdamW, {})
        assert isinstance(optimizer, _OPTIMIZERS.get(name, torch.optim.AdamW)), name
        assert parallel.local_state(optimizer) is not None
    stored = Parallel("ddp", device=cpu, precision="bf16").wrap(nn.Linear(4, 3))
    assert {p.dtype for p in stored.parameters()} == {torch.bfloat16}
    with pytest.raises(ValueError, match="does not run"):
        Parallel("tp", device=cpu)


def test_bench_train_bf16_stores_the_model_in_bf16(train_text, tmp_path, capsys):
    """`--precision bf16` is the model stored in bf16 (its old meaning, autocast, is
    `bf16-autocast`, with a note)."""
    from bench.train import Trainer

    parser = train.COMMAND.parser()
    args = parser.parse_args(["--data", "x", "--out", "y", "--precision", "bf16"])
    assert args.precision == "bf16"
    assert "what it ran here before is 'bf16-autocast'" in capsys.readouterr().err
    (tmp_path / "run").mkdir()
    config = TrainConfig.create(
        data=str(train_text), out=str(tmp_path / "run"), cache_dir=str(tmp_path / "cache"),
        device="cpu", tokenizer="bytes", size="tiny", context_length=16, batch_size=2,
        precision="bf16", progress=False,
    )  # fmt: skip
    trainer = Trainer(config)
    assert {p.dtype for p in trainer.model.parameters()} == {torch.bfloat16}
    trainer.recorder.close()


def test_each_wrapper_is_built_in_one_module_and_old_names_live_in_the_table():
    """The done-when of one owner: `grep` finds each wrapper constructed in core/parallel.py
    only, and the old layout names in core/layouts.py only."""
    built = re.compile(r"(DDPBucketed|ShardedOptimizer|[^_.\w]FSDP|ZeroRedundancyOptimizer)\(")
    old = re.compile(r'"(zero|sharded|bucketed-sharded|torch-zero|bucketed|torch-ddp)"')
    for path in sorted(__import__("pathlib").Path(SRC).rglob("*.py")):
        text = path.read_text()
        code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
        if path.name != "parallel.py" or path.parent.name != "core":
            assert not [m for m in built.finditer(code) if _in_code(code, m.start())], path
        if path.name != "layouts.py":
            names = {m[1] for m in old.finditer(code)} - {"zero"}  # also bench-zero's tool key
            assert not names, (path, names)


def _in_code(text: str, index: int) -> bool:
    """Whether `index` lies outside a docstring (an odd count of triple quotes before it)."""
    return text[:index].count('"""') % 2 == 0
