"""`python -m bench.train`: runs `bench.tools.train.main`."""

from bench.tools.train import main

if __name__ == "__main__":
    raise SystemExit(main())
