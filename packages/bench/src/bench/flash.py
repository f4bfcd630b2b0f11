"""`python -m bench.flash`: runs `bench.tools.flash.main`."""

from bench.tools.flash import main

if __name__ == "__main__":
    raise SystemExit(main())
