"""`python -m bench.ddp`: runs bench-ddp (`bench.tools.data_parallel.main`)."""

from bench.tools.data_parallel import main

if __name__ == "__main__":
    raise SystemExit(main())
