"""Checks of a package whose `__init__` imports its heavy modules on first use (PEP 562): what
`import <package>` costs, and that every public name is still there."""

from __future__ import annotations

from types import ModuleType

from fresh_interpreter import run_fresh

__all__ = ["check_lazy_package"]


def check_lazy_package(package: ModuleType, *, light_use: str = "") -> None:
    """Assert that `import package` (then `light_use`, code using it) imports nothing heavy in a
    fresh interpreter; that every name of `__all__` is imported with the package or listed in
    its lazy table (`_MODULE_OF`), resolves, and shows in `dir()`; and that an unknown name is
    an `AttributeError` naming it."""
    name = package.__name__
    run = run_fresh(f"import {name}\n{light_use}")
    assert run.returncode == 0, run.stderr
    assert not run.loaded, f"import {name} imported {sorted(run.loaded)}"
    lazy = set(package._MODULE_OF)
    eager = set(package.__all__) - lazy
    assert eager <= set(vars(package)), (
        f"{sorted(eager - set(vars(package)))} neither imported nor lazy"
    )
    assert lazy <= set(package.__all__), f"{sorted(lazy - set(package.__all__))} not in __all__"
    for public in package.__all__:
        assert getattr(package, public) is not None, public
    assert set(package.__all__) <= set(dir(package))
    try:
        package.no_such_name  # noqa: B018
    except AttributeError as error:
        assert "no_such_name" in str(error)
    else:
        raise AssertionError(f"{name}.no_such_name did not raise AttributeError")
