"""bench-report's wing: the 2026 CS336 handout answered, one section per problem, from a folder
of results, rendered as Markdown, LaTeX or Typst.

Reading order:

- `tool`: `build_report(folder)` and `run_parsed`, what `bench-report` runs;
- `problems`: `PROBLEMS`, every problem of the handout in its order with the function that
  answers it, and `build_document`;
- `problem`: `Problem` and how a section cites its results (records, earlier runs, images);
- `results`: `Results`, the records of a folder and the helpers the answers read rows with;
- `claims`: the rules that choose the words of every sentence that compares or judges
  ("faster", "above", "rises"), fed the rows the sentence cites;
- the answers by part of the handout: `single_gpu` (model timing, profiles, mixed precision),
  `memory`, `checkpointing`, `kernels` (attention, compile, FlashAttention-2), `parallel`
  (all-reduce, sharding, FSDP, and what each distributed run trained), `data_parallel` (naive,
  flat and overlapped DDP, one world size at a time), `analysis` (§8's FFN calculations),
  `leaderboard`, and
  `appendix_2025` (the 2025 handout's problems the 2026 one dropped);
- `seeds`: what the seed projects had (two T4s in fp16, the kernel x mode matrix, fp16 against
  bf16), answered after the handout's problems (not in the write-up);
- `trace_timeline`: a profiler trace drawn as compute and communication lanes, where the
  handout asks for Nsight Systems screenshots;
- `runs`: the commands that make the results a section lacks, as the GPU scripts run them;
- `document`: `Heading`, `Paragraph`, `Table`, `Image` and `render` (Markdown, LaTeX), and
  `typst_render`, the Typst write-up whose tables fit the page.

The wing reads the tools' row keys (`KEYS`) and the trainer's results; nothing outside it
imports it (its command names `bench.report.tool:run_parsed` by string).
"""
