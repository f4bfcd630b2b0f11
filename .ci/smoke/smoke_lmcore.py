"""lmcore installed alone: a TransformerLM trains one step on a batch drawn from a numpy token
array, and lmcore's AdamW moves the weights exactly as torch's AdamW does."""

import copy

import numpy as np
import torch
from installed import check_installed, report

lmcore = check_installed("lmcore")

torch.manual_seed(0)
config = lmcore.ModelConfig(
    vocab_size=97, context_length=16, d_model=24, num_layers=2, num_heads=3, d_ff=40
)
model = lmcore.TransformerLM.from_config(config)
twin = copy.deepcopy(model)
tokens = np.random.default_rng(0).integers(0, config.vocab_size, size=500, dtype=np.uint16)
x, y = lmcore.get_batch(tokens, 4, config.context_length, "cpu", generator=np.random.default_rng(1))

ours = lmcore.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
theirs = torch.optim.AdamW(twin.parameters(), lr=1e-3, weight_decay=0.1)
for m, opt in ((model, ours), (twin, theirs)):
    logits = m(x)  # (batch, seq, vocab)
    loss = lmcore.cross_entropy(logits, y)
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
    torch.testing.assert_close(loss, expected)
    loss.backward()
    if any(p.grad is None or not p.grad.abs().sum() > 0 for p in m.parameters()):
        raise SystemExit("a parameter got no gradient")
    opt.step()
for p, q in zip(model.parameters(), twin.parameters(), strict=True):
    torch.testing.assert_close(p, q)

report("lmcore", "TransformerLM forward+backward; lmcore.AdamW step equals torch AdamW")
