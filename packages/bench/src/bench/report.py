"""`python -m bench.report`: runs `bench.tools.report.main`."""

from bench.tools.report import main

if __name__ == "__main__":
    raise SystemExit(main())
