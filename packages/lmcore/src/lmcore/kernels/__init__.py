"""Triton kernels behind lmcore's fused loss and fused AdamW.

Importing a module here imports Triton, so the public modules (`lmcore.linear_cross_entropy`,
`lmcore.optim`) import these lazily, on the first call that needs them: lmcore itself imports on
machines without Triton. On a CPU the kernels run under Triton's interpreter
(`TRITON_INTERPRET=1`), which is how the tests check them without a GPU.
"""
