"""bench-plan's wing: the memory and communication of training `lmcore.TransformerLM`, predicted
without a GPU, and checked against what the tools measured.

What is modelled: per device, the bytes alive at each moment of a training step that can be its
peak (parameters, gradients, optimizer state, activations, the loss's logits, communication
buffers, temporaries), the bytes each device sends per step and their time beside the step's
compute time, under one device, DDP, ZeRO-1, FSDP, tensor parallelism and FSDP × TP. Every
number carries the formula that gives it. Nothing here needs torch but `params`, which builds a
model on the meta device to list its parameters.

Reading order, each module building on the ones before:

- `params`: every parameter of a model, with its block and tensor-parallel role;
- `activations`: what lmcore's eager code saves for backward, tensor by tensor, as formulas;
- `memory`: `TrainingPlan` (model, batch, precision, layout, checkpointing, loss, optimizer) and
  `estimate_memory(plan) -> MemoryEstimate`, the peak and the phases around it;
- `fit`: the largest batch, context or depth a memory holds, the cheapest checkpointing;
- `collectives`: ring costs of all-reduce, all-gather, reduce-scatter and broadcast;
- `traffic`: the collectives of one step of a plan and their time beside its compute;
- `ffn`: the handout's §8 analysis of one FFN layer under DP, FSDP, TP and FSDP + TP;
- `check`: the predictions beside the measurements of a results folder.

The wing imports `bench.core` (the vocabularies, results, memory units) and the measured
packages' light parts, never a tool, the trainer or the report; `bench-plan` (`bench.tools.plan`)
and `bench-step` (`--num-layers fit`) call it.
"""
