"""`python -m bench.attn`: runs `bench.tools.attn.main`."""

from bench.tools.attn import main

if __name__ == "__main__":
    raise SystemExit(main())
