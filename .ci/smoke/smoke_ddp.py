"""ddp installed alone: DDPBucketed on a one-rank gloo group trains exactly like the bare model."""

import torch
from installed import check_installed, one_rank_group, report, small_model_and_twin

ddp = check_installed("ddp")

with one_rank_group():
    model, bare = small_model_and_twin()
    wrapped = ddp.DDPBucketed(model, bucket_size_mb=0.0005)  # a few parameters per bucket
    x, y = torch.randn(5, 8), torch.randn(5, 4)
    for _ in range(2):
        wrapped.on_train_batch_start()
        torch.nn.functional.mse_loss(wrapped(x), y).backward()
        wrapped.finish_gradient_synchronization()
        torch.nn.functional.mse_loss(bare(x), y).backward()
    for (name, p), q in zip(model.named_parameters(), bare.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)

report("ddp", "DDPBucketed gradients equal the bare model's over two accumulated steps")
