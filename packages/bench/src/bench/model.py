"""`python -m bench.model`: runs `bench.tools.model.main`."""

from bench.tools.model import main

if __name__ == "__main__":
    raise SystemExit(main())
