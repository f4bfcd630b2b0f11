"""Import a script (a file under `packages/*/scripts/`, not a package module) for its tests.

Example::

    @pytest.fixture(scope="module")
    def script():
        with script_module(SCRIPTS / "ddp_host_time.py") as module:
            yield module
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

__all__ = ["script_module"]


@contextlib.contextmanager
def script_module(path: Path) -> Iterator[ModuleType]:
    """The script at `path` imported as a module named after its file, registered in
    `sys.modules` while the context lasts (dataclasses look their module up as it executes)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]
