"""`python -m bench.zero`: runs bench-zero (`bench.tools.sharding.main`)."""

from bench.tools.sharding import main

if __name__ == "__main__":
    raise SystemExit(main())
