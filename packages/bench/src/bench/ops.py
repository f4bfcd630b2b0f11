"""`python -m bench.ops`: runs `bench.tools.ops.main`."""

from bench.tools.ops import main

if __name__ == "__main__":
    raise SystemExit(main())
