"""What every smoke script checks first: the package came from an install, not from the source
tree, and it ships what its metadata promises (version, license, type marker)."""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.metadata
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any


def check_installed(module_name: str) -> ModuleType:
    """Import `module_name` from site-packages and check `cs336sys-<name>`'s distribution."""
    module = importlib.import_module(module_name)
    location = Path(module.__file__).resolve()
    if "site-packages" not in location.parts:
        raise SystemExit(f"{module_name} was imported from {location}, not from an installed copy")
    dist = importlib.metadata.distribution(f"cs336sys-{module_name}")
    if module.__version__ != dist.version:
        raise SystemExit(f"{module_name}.__version__ {module.__version__} != {dist.version}")
    shipped = {Path(str(f)).name for f in dist.files or ()}
    for name in ("LICENSE", "py.typed"):
        if name not in shipped:
            raise SystemExit(f"cs336sys-{module_name} does not ship {name}")
    license_expression = dist.metadata["License-Expression"]
    if license_expression != "MIT":
        raise SystemExit(f"cs336sys-{module_name} declares license {license_expression!r}")
    return module


def report(module_name: str, what: str) -> None:
    """One line that says what was checked, with the versions it ran on."""
    import torch

    version = importlib.metadata.version(f"cs336sys-{module_name}")
    print(f"smoke cs336sys-{module_name} {version} (torch {torch.__version__}): {what}")


@contextlib.contextmanager
def one_rank_group() -> Iterator[None]:
    """A one-rank gloo process group on an in-memory store: no port, and every collective still
    runs (`all_gather_object` included, which is what needs numpy)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def small_model_and_twin() -> tuple[Any, Any]:
    """A seeded two-layer MLP (8 → 16 → 4) and an identical copy to compare against."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    return model, copy.deepcopy(model)
