"""`python -m bench.plan`: runs `bench.tools.plan.main`."""

from bench.tools.plan import main

if __name__ == "__main__":
    raise SystemExit(main())
