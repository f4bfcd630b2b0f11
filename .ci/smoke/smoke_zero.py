"""zero installed alone: ShardedOptimizer(AdamW) on a one-rank gloo group equals plain AdamW,
and its consolidated state_dict round-trips."""

import copy

import torch
import torch.distributed as dist
from installed import check_installed, report

zero = check_installed("zero")

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
try:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    plain_model = copy.deepcopy(model)
    sharded = zero.ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-2)
    plain = torch.optim.AdamW(plain_model.parameters(), lr=1e-2)
    for _ in range(3):
        x, y = torch.randn(5, 8), torch.randn(5, 4)
        for m, opt in ((model, sharded), (plain_model, plain)):
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
    for p, q in zip(model.parameters(), plain_model.parameters(), strict=True):
        torch.testing.assert_close(p, q)
    state = sharded.state_dict()
    restored = zero.ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-2)
    restored.load_state_dict(state)
    torch.testing.assert_close(restored.state_dict()["state"], plain.state_dict()["state"])
finally:
    dist.destroy_process_group()

report("zero", "ShardedOptimizer(AdamW) equals torch AdamW over 3 steps; state_dict round-trips")
