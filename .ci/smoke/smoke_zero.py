"""zero installed alone: ShardedOptimizer(AdamW) on a one-rank gloo group equals plain AdamW,
and its consolidated state_dict round-trips."""

import torch
from installed import check_installed, one_rank_group, report, small_model_and_twin

zero = check_installed("zero")

with one_rank_group():
    model, plain_model = small_model_and_twin()
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

report("zero", "ShardedOptimizer(AdamW) equals torch AdamW over 3 steps; state_dict round-trips")
