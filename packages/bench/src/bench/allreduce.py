"""`python -m bench.allreduce`: runs `bench.tools.allreduce.main`."""

from bench.tools.allreduce import main

if __name__ == "__main__":
    raise SystemExit(main())
