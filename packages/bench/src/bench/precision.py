"""`python -m bench.precision`: runs `bench.tools.precision.main`."""

from bench.tools.precision import main

if __name__ == "__main__":
    raise SystemExit(main())
