"""ddp installed alone: DDPBucketed on a one-rank gloo group trains exactly like the bare model."""

import copy

import torch
import torch.distributed as dist
from installed import check_installed, report

ddp = check_installed("ddp")

# One rank, an in-memory store: no port, and every collective still runs (the construction-time
# all_gather_object included, which is what needs numpy).
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
try:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    bare = copy.deepcopy(model)
    wrapped = ddp.DDPBucketed(model, bucket_size_mb=0.0005)  # a few parameters per bucket
    x, y = torch.randn(5, 8), torch.randn(5, 4)
    for _ in range(2):
        wrapped.on_train_batch_start()
        torch.nn.functional.mse_loss(wrapped(x), y).backward()
        wrapped.finish_gradient_synchronization()
        torch.nn.functional.mse_loss(bare(x), y).backward()
    for (name, p), q in zip(model.named_parameters(), bare.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
finally:
    dist.destroy_process_group()

report("ddp", "DDPBucketed gradients equal the bare model's over two accumulated steps")
