"""`python -m bench.train_results`: runs `bench.tools.train_results.main`."""

from bench.tools.train_results import main

if __name__ == "__main__":
    raise SystemExit(main())
