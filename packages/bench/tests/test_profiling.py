"""Profile tables: kernels ranked by their own time per phase, ranges kept apart as ranges
(bench-model's `bench.tools.model.profile`); a collective's share beside compute, and a phase's
wall time split into compute, communication, exposed communication and idle
(`bench.core.profiling`)."""

import gzip
import importlib
import json
from types import SimpleNamespace

import pytest

from bench.core.profiling import (
    collective_overlap,
    device_kernels,
    device_time,
    shared_time,
)
from bench.tools.model.profile import (
    AttentionShape,
    attention_flops,
    kernel_category,
    profile_rows,
    trace_events,
)


def _range(name, start, end, *, device="CPU", kernels=()):
    """A `record_function` range as the profiler reports it (CPU side, or its GPU copy), with
    the kernels launched in it while no operator was open, `(name, duration µs)`."""
    return SimpleNamespace(
        name=name,
        device_type=f"DeviceType.{device}",
        is_user_annotation=True,
        time_range=SimpleNamespace(start=start, end=end),
        kernels=[SimpleNamespace(name=k, duration=us) for k, us in kernels],
        self_cpu_time_total=3.0,
    )


def _op(name, start, kernels=(), *, self_cpu=1.0):
    """An operator on the CPU with the CUDA kernels it launched, `(name, duration µs)`."""
    return SimpleNamespace(
        name=name,
        device_type="DeviceType.CPU",
        is_user_annotation=False,
        time_range=SimpleNamespace(start=start, end=start + 1),
        kernels=[SimpleNamespace(name=k, duration=us) for k, us in kernels],
        self_cpu_time_total=self_cpu,
    )


def _kernel_event(name, start, us, *, ident=0):
    """The kernel itself, as a CUDA-side event, with its launch's correlation id `ident` (its
    time is counted via its operator, if one launched it)."""
    return SimpleNamespace(
        id=ident,
        name=name,
        device_type="DeviceType.CUDA",
        is_user_annotation=False,
        time_range=SimpleNamespace(start=start, end=start + us),
        kernels=[],
        self_cpu_time_total=0.0,
    )


def _cuda_call(name, start, us, *, ident, kernels=()):
    """A CUDA runtime or driver call on the CPU with its correlation id `ident` (the profiler
    may hang on it the kernels of an operator whose id is `ident` too)."""
    return SimpleNamespace(
        id=ident,
        name=name,
        device_type="DeviceType.CPU",
        is_user_annotation=False,
        time_range=SimpleNamespace(start=start, end=start + us),
        kernels=[SimpleNamespace(name=k, duration=d) for k, d in kernels],
        self_cpu_time_total=us,
    )


GEMM = "sm90_xmma_gemm_f32f32_tn"
SOFTMAX = "softmax_warp_forward<float>"
MUL = "vectorized_elementwise_kernel<MulFunctor>"
ADAM = "multi_tensor_apply_kernel<Adam>"


def _events():
    # One step: forward 0–100 µs (with a softmax range inside), backward 100–300, optimizer
    # 300–350. The ranges' GPU copies span whole phases and outrank every kernel.
    return [
        _range("forward", 0, 100),
        _range("forward", 0, 100_000, device="CUDA"),
        _range("attention: softmax", 40, 50),
        _range("attention: softmax", 40, 9_000, device="CUDA"),
        _op("aten::mm", 10, [(GEMM, 30.0)]),
        _op("aten::_softmax", 45, [(SOFTMAX, 12.0)]),
        _op("aten::mul", 60, [(MUL, 6.0)]),
        _range("backward", 100, 300),
        _range("backward", 100, 50_000, device="CUDA"),
        _op("aten::mm", 150, [(GEMM, 50.0), (GEMM, 40.0)]),
        _op("aten::mul", 160, [(MUL, 10.0)]),
        _range("optimizer", 300, 350),
        _op("aten::_foreach_mul_", 310, [(ADAM, 8.0)]),
        _op("aten::mul", 320, [(MUL, 2.0)]),
        _kernel_event(GEMM, 12, 30.0),
    ]


def test_ranges_that_outrank_kernels_never_enter_the_kernel_table():
    rows = profile_rows(_events(), cell="c", on_cuda=True)
    kernels = [r for r in rows if r["kind"] == "kernel"]
    assert {r["name"] for r in kernels} == {GEMM, SOFTMAX, MUL, ADAM}
    top = next(r for r in kernels if r["phase"] == "all")
    assert top["name"] == GEMM and top["total_ms"] == pytest.approx(0.120)
    ranges = {r["name"] for r in rows if r["kind"] == "range"}
    assert ranges == {"forward", "attention: softmax", "backward", "optimizer"}


def test_kernels_are_counted_once_in_the_phase_that_launched_them():
    rows = profile_rows(_events(), cell="c", on_cuda=True)
    kernel = {(r["phase"], r["name"]): r for r in rows if r["kind"] == "kernel"}
    assert kernel[("forward", GEMM)]["calls"] == 1
    assert kernel[("backward", GEMM)]["calls"] == 2
    assert kernel[("backward", GEMM)]["share"] == pytest.approx(90 / 100)
    assert kernel[("all", MUL)]["total_ms"] == pytest.approx(0.018)
    ranges = {r["name"]: r for r in rows if r["kind"] == "range"}
    assert ranges["forward"]["kernel_ms"] == pytest.approx(0.048)
    assert ranges["forward"]["total_ms"] == pytest.approx(0.1)  # the CPU range, not its GPU copy
    assert ranges["attention: softmax"]["kernel_ms"] == pytest.approx(0.012)


def test_category_shares_split_each_phase_and_the_optimizer_is_its_own():
    rows = profile_rows(_events(), cell="c", on_cuda=True)
    share = {(r["phase"], r["name"]): r["share"] for r in rows if r["kind"] == "category"}
    assert share[("forward", "matmul")] == pytest.approx(30 / 48)
    assert share[("forward", "softmax")] == pytest.approx(12 / 48)
    assert share[("forward", "elementwise")] == pytest.approx(6 / 48)
    assert share[("optimizer", "optimizer")] == pytest.approx(1.0)
    assert share[("all", "optimizer")] == pytest.approx(10 / 158)
    for phase in ("forward", "backward", "optimizer", "all"):
        assert sum(v for (p, _), v in share.items() if p == phase) == pytest.approx(1.0)


def test_cpu_profiles_rank_operators_by_their_own_time():
    events = [_range("forward", 0, 100), _op("aten::mm", 5, self_cpu=70.0)]
    events += [_op("aten::mul", 20, self_cpu=30.0), _range("attention: scores", 1, 2)]
    rows = profile_rows(events, cell="c", on_cuda=False)
    operators = [r for r in rows if r["kind"] == "operator" and r["phase"] == "forward"]
    assert [r["name"] for r in operators] == ["aten::mm", "aten::mul"]
    assert operators[0]["share"] == pytest.approx(0.7)


def test_attention_ranges_carry_their_flops():
    shape = AttentionShape(batch=2, heads=3, seq=5, head_dim=4)
    flops = attention_flops(shape)
    assert flops["attention: scores"] == 2 * 2 * 3 * 25 * 4
    assert flops["attention: softmax"] == 5 * 2 * 3 * 25
    events = [_range("attention: softmax", 0, 1), _range("attention: softmax", 2, 3)]
    rows = profile_rows(events, cell="c", on_cuda=True, attention=shape)
    assert rows[0]["flops"] == 2 * flops["attention: softmax"]


@pytest.mark.parametrize(
    ("name", "category"),
    [
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopB_NNT", "matmul"),
        ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nt_align1>", "matmul"),
        ("triton_tem_fused_mm_4", "matmul"),
        ("void (anonymous namespace)::softmax_warp_backward<float>", "softmax"),
        ("void at::native::reduce_kernel<512, 1>", "elementwise"),
        ("triton_poi_fused_0", "elementwise"),
        ("triton_red_fused__to_copy_mean_pow_1", "elementwise"),
        ("triton_per_fused_2", "elementwise"),
        # Inductor's fused kernels are memory-bound whatever ops their names list (the RoPE and
        # layout copy before SDPA, the loss's log-softmax reduction; an H200 trace's names)
        ("triton_poi_fused__scaled_dot_product_cudnn_attention__to_copy__unsafe_view_add_mul_"
         "select_stack_sub_transpose_view_1", "elementwise"),
        ("triton_poi_fused__to_copy__unsafe_view_add_gluon_forward_mul_select_stack_sub_"
         "transpose_view_1", "elementwise"),
        ("triton_red_fused__log_softmax__to_copy_prepare_softmax_online_0", "elementwise"),
        ("_cross_entropy_rows_kernel", "elementwise"),  # lmcore's fused loss: a row's logsumexp
        ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64>>", "attention"),
        ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Traits>", "attention"),
        ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::Params)", "attention"),
        ("fmha_cutlassB_bf16_aligned_128x64_k128_sm80(AttentionBackwardKernel)", "attention"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64", "attention"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
        ("some_custom_kernel", "other"),
    ],
)  # fmt: skip
def test_kernel_categories(name, category):
    assert kernel_category(name) == category
    assert kernel_category(name, phase="optimizer") == "optimizer"


@pytest.mark.parametrize(
    "name",
    [
        "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "ncclKernel_ReduceScatter_RING_LL_Sum_bfloat16(ncclWork)",
        "c10d::allgather_",
        "gloo:all_reduce",
        "record_param_comms",
    ],
)
def test_communication_is_its_own_category_in_every_phase(name):
    assert kernel_category(name) == "communication"
    assert kernel_category(name, phase="optimizer") == "communication"


@pytest.mark.parametrize(
    "module",
    [
        "fa2.triton.forward",
        "fa2.triton.backward",
        "fa2.triton.gluon_forward",
        "fa2.triton.gluon_backward",
    ],
)
def test_every_fa2_kernel_is_attention(module):
    """The kernels fa2 launches (its Triton and Gluon `*_kernel` functions) are named as the
    attention category expects: a kernel renamed or added in fa2 fails here."""
    found = vars(importlib.import_module(module))
    kernels = [
        getattr(fn, "fn", fn).__name__
        for name, fn in found.items()
        if name.endswith("_kernel") and hasattr(fn, "fn")  # Triton's and Gluon's jit wrappers
    ]
    assert kernels
    for name in kernels:
        assert kernel_category(name) == "attention", name


def test_a_kernel_launched_with_only_ranges_open_is_counted_at_its_launch():
    """Regression: lmcore's `_adamw_kernel` (44.5 ms) was missing from the optimizer phase.

    The structure of an H200 step trace (bench-step --profile, lmcore's fused AdamW; times in
    µs from the `optimizer` range's start): `optimizer` 0–48797, inside it
    `Optimizer.step#AdamW.step` 58–4162; `aten::copy_` at 3643 launches a 1.184 µs
    `Memcpy HtoD`; `cuLaunchKernelEx` at 4019 (correlation 33317, no external id: only ranges
    were open) launches `_adamw_kernel`, on the device at 4066 for 44547 µs, hung on no CPU
    event; `cudaDeviceSynchronize` at 4211 waits for it.
    """
    memcpy, adam = "Memcpy HtoD (Pinned -> Device)", "_adamw_kernel"
    copied = (3_700 + 1.184) - 3_700  # torch's duration of a hung kernel: its end less its start
    events = [
        _range("optimizer", 0, 48_797),
        _range("Optimizer.step#AdamW.step", 58, 4_162),
        _range("Optimizer.step#AdamW.step", 3_711, 48_612, device="CUDA"),
        _op("aten::copy_", 3_643, [(memcpy, copied)]),
        _kernel_event(memcpy, 3_700, 1.184, ident=33_302),
        _cuda_call("cuLaunchKernelEx", 4_019, 52.6, ident=33_317),
        _kernel_event(adam, 4_066, 44_546.771, ident=33_317),
        _cuda_call("cudaDeviceSynchronize", 4_211, 44_433.2, ident=33_319),
    ]
    rows = profile_rows(events, cell="c", on_cuda=True)
    kernel = {(r["phase"], r["name"]): r for r in rows if r["kind"] == "kernel"}
    for phase in ("optimizer", "all"):
        assert kernel[phase, adam]["total_ms"] == pytest.approx(44.546771)
        assert kernel[phase, memcpy]["calls"] == 1
    ranges = {r["name"]: r for r in rows if r["kind"] == "range"}
    assert ranges["Optimizer.step#AdamW.step"]["kernel_ms"] == pytest.approx(44.547955)
    category = {(r["phase"], r["name"]): r for r in rows if r["kind"] == "category"}
    assert category["optimizer", "optimizer"]["calls"] == 2


def test_a_kernel_hung_on_a_cuda_call_too_is_counted_once():
    """torch hangs an operator's kernels on every CPU event whose id is the operator's: a CUDA
    call whose correlation id equals it gets them too. In an H200 trace a `cudaEventQuery` in
    the forward (correlation 4325) got the kernels of a backward `aten::mm` (external id 4325):
    a 1.349 ms matmul and a memset were counted in both phases."""
    events = [
        _range("forward", 0, 100),
        _range("backward", 100, 300),
        _cuda_call("cudaEventQuery", 20, 1.0, ident=4_325, kernels=[(GEMM, 40.0), ("Memset", 1.0)]),
        _op("aten::mm", 150, [(GEMM, 40.0), ("Memset", 1.0)]),
        _kernel_event(GEMM, 160, 40.0, ident=9_000),
        _kernel_event("Memset", 155, 1.0, ident=9_001),
    ]
    rows = profile_rows(events, cell="c", on_cuda=True)
    kernel = {(r["phase"], r["name"]): r for r in rows if r["kind"] == "kernel"}
    assert ("forward", GEMM) not in kernel
    assert kernel["backward", GEMM]["calls"] == 1 and kernel["all", GEMM]["calls"] == 1


def test_category_rows_count_their_kernels():
    rows = profile_rows(_events(), cell="c", on_cuda=True)
    calls = {(r["phase"], r["name"]): r["calls"] for r in rows if r["kind"] == "category"}
    assert calls[("backward", "matmul")] == 2
    assert calls[("all", "elementwise")] == 2  # the optimizer phase's mul is the optimizer's


GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
REDUCE = "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def test_collective_overlap_is_the_share_of_its_kernel_time_beside_compute():
    events = [
        _kernel_event(GATHER, 0, 100.0),  # 0-100: compute 40-70 and 60-90 overlap: 40-90
        _kernel_event(GEMM, 40, 30.0),
        _kernel_event(MUL, 60, 30.0),
        _kernel_event(GATHER, 200, 50.0),  # 200-250 alone, beside a copy and another collective
        _kernel_event("Memcpy DtoD (Device -> Device)", 200, 50.0),
        _kernel_event(REDUCE, 210, 30.0),
        _range("forward", 0, 300, device="CUDA"),  # a range's GPU copy is no compute
        _op("aten::mm", 0, [(GEMM, 30.0)]),  # nor is the operator on the CPU
    ]
    assert collective_overlap(events, collective="AllGather") == pytest.approx(50 / 150)
    assert collective_overlap(events, collective="ReduceScatter") == 0.0


def test_collective_overlap_is_none_without_the_collective():
    assert collective_overlap([_kernel_event(GEMM, 0, 10.0)], collective="AllGather") is None


def test_shared_time_sweeps_both_lists_merged():
    a = [(0, 10), (5, 20), (30, 40)]  # merged: 0-20, 30-40
    b = [(15, 35), (38, 50), (60, 70)]
    assert shared_time(a, b) == pytest.approx(5 + 5 + 2)
    assert shared_time(b, a) == pytest.approx(12)
    assert shared_time(a, []) == 0.0


def test_device_time_splits_a_phase_into_compute_exposed_communication_and_idle():
    """Hand-made intervals (µs) in a window of 0-1000: compute on two streams, communication
    partly beside it, a copy, a kernel of the next window."""
    kernels = [
        (GEMM, 0, 300),
        (MUL, 200, 400),  # a second stream: 200-300 overlaps the gemm
        (GATHER, 350, 600),  # beside compute 350-400, exposed 400-600
        (REDUCE, 550, 650),  # overlaps the gather: communication covers 350-650
        ("Memcpy DtoD (Device -> Device)", 700, 800),  # neither compute nor communication
        (GEMM, 900, 1200),  # cut at the window's end
        (GEMM, 1000, 1100),  # starts at the end: the next window's
    ]
    spent = device_time(kernels, window=(0, 1000))
    assert spent.wall_ms == pytest.approx(1.0)
    assert spent.kernel_ms == pytest.approx((300 + 200 + 100) / 1e3)
    assert spent.busy_ms == pytest.approx((400 + 100) / 1e3)
    assert spent.comm_ms == pytest.approx(300 / 1e3)
    assert spent.exposed_comm_ms == pytest.approx(250 / 1e3)
    assert spent.idle_ms == pytest.approx((1000 - 650 - 100 - 100) / 1e3)


def test_device_time_of_communication_hidden_entirely_and_of_none():
    hidden = device_time([(GEMM, 0, 100), (GATHER, 10, 90)], window=(0, 100))
    assert (hidden.comm_ms, hidden.exposed_comm_ms, hidden.idle_ms) == (0.08, 0.0, 0.0)
    quiet = device_time([], window=(0, 50))
    assert (quiet.busy_ms, quiet.comm_ms, quiet.idle_ms) == (0.0, 0.0, 0.05)


def test_a_recorded_trace_reads_back_as_the_profilers_events(tmp_path):
    """`trace_events`: a Chrome trace's operators carry the kernels of their external id, a
    kernel with none (launched with only a range open) stands alone beside its CUDA call of the
    same correlation id; the tables follow as from `prof.events()`."""
    trace = {
        "traceEvents": [
            {"cat": "user_annotation", "name": "optimizer", "ts": 0, "dur": 500,
             "args": {"External id": 5}},
            {"cat": "cpu_op", "name": "aten::copy_", "ts": 10, "dur": 5,
             "args": {"External id": 6}},
            {"cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 20, "dur": 1.5,
             "args": {"External id": 6, "correlation": 40}},
            {"cat": "cuda_driver", "name": "cuLaunchKernelEx", "ts": 30, "dur": 2,
             "args": {"correlation": 41}},
            {"cat": "kernel", "name": "_adamw_kernel", "ts": 40, "dur": 400,
             "args": {"correlation": 41}},
            {"cat": "gpu_user_annotation", "name": "optimizer", "ts": 19, "dur": 430,
             "args": {"External id": 5}},
            {"ph": "M", "name": "process_name", "args": {"name": "python"}},
        ]
    }  # fmt: skip
    path = tmp_path / "t.pt.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps(trace).encode()))
    events = trace_events(path)
    (copy,) = [e for e in events if e.name == "aten::copy_"]
    assert [(k.name, k.duration) for k in copy.kernels] == [("Memcpy HtoD", 1.5)]
    assert [k[0] for k in device_kernels(events)] == ["Memcpy HtoD", "_adamw_kernel"]
    rows = profile_rows(events, cell="c", on_cuda=True)
    (optimizer,) = [r for r in rows if r["kind"] == "category" and r["phase"] == "optimizer"]
    assert optimizer["calls"] == 2 and optimizer["total_ms"] == pytest.approx(0.4015)


def _phase_trace(adamw_us: float) -> dict:
    """A CUDA step's trace as torch writes it: the three phase ranges (CPU and device side), a
    matmul in forward, fa2's backward kernel launched with only the backward range open, and
    lmcore's AdamW launched with only the optimizer range open."""

    def phase(name, ident, start, dur):
        return [{"cat": "user_annotation", "name": name, "ts": start, "dur": dur,
                 "args": {"External id": ident}},
                {"cat": "gpu_user_annotation", "name": name, "ts": start + 1, "dur": dur,
                 "args": {"External id": ident}}]  # fmt: skip

    return {
        "traceEvents": [
            *phase("forward", 1, 0, 100), *phase("backward", 2, 100, 300),
            *phase("optimizer", 3, 400, 100),
            {"cat": "cpu_op", "name": "aten::mm", "ts": 10, "dur": 5, "args": {"External id": 4}},
            {"cat": "kernel", "name": "nvjet_sm90_tst_192x192", "ts": 20, "dur": 60,
             "args": {"External id": 4, "correlation": 40}},
            {"cat": "cuda_driver", "name": "cuLaunchKernelEx", "ts": 110, "dur": 2,
             "args": {"correlation": 41}},
            {"cat": "kernel", "name": "_gluon_bwd_kernel", "ts": 120, "dur": 250,
             "args": {"correlation": 41}},
            {"cat": "cuda_driver", "name": "cuLaunchKernelEx", "ts": 410, "dur": 2,
             "args": {"correlation": 42}},
            {"cat": "kernel", "name": "_adamw_kernel", "ts": 420, "dur": adamw_us,
             "args": {"correlation": 42}},
        ]
    }  # fmt: skip


def test_a_gpu_runs_tables_are_rebuilt_from_its_traces_keeping_its_run(tmp_path, base_env):
    """`rebuild_step_profile`: the tables of a CUDA run come back from its traces as the code
    reads them now, the run's device, date and command kept, a note saying so; a CPU run, or a
    missing trace, says why not."""
    import torch

    from bench.core.results import load_json
    from bench.tools.step.profile import rebuild_step_profile, save_step_profile

    directory = tmp_path / "step_profile_h200"
    directory.mkdir()
    trace = directory / "ours_rank0.pt.trace.json.gz"
    trace.write_bytes(gzip.compress(json.dumps(_phase_trace(80.0)).encode()))
    env = {**base_env, "device_type": "cuda", "device_name": "NVIDIA H200", "date": "2026-11-28"}
    stale = [{"row": "ours", "rank": 0, "phase": "forward", "kind": "phase", "trace": trace.name}]
    save_step_profile(directory, stale, device=torch.device("cpu"), command="bench-step x",
                      config={"profile_dir": "OUT"}, env=env)  # fmt: skip
    run = load_json(rebuild_step_profile(directory))
    assert (run.env["device_name"], run.date, run.command) == (
        "NVIDIA H200",
        "2026-11-28",
        "bench-step x",
    )
    assert "rebuilt from these traces" in run.notes[-1] and "H200" in run.title
    ms = {(r["phase"], r["category"]): r["total_ms"] for r in run.rows if r["kind"] == "category"}
    assert ms[("forward", "matmul")] == pytest.approx(0.060)
    assert ms[("backward", "attention")] == pytest.approx(0.250)
    assert ms[("optimizer", "optimizer")] == pytest.approx(0.080)
    assert (directory / "ours_rank0_kernels.md").exists()
    trace.unlink()
    with pytest.raises(FileNotFoundError, match="trace of row ours, rank 0"):
        rebuild_step_profile(directory)
    save_step_profile(directory, stale, device=torch.device("cpu"), command="x", config={},
                      env={**env, "device_type": "cpu"})  # fmt: skip
    with pytest.raises(ValueError, match="only a CUDA run"):
        rebuild_step_profile(directory)


def test_the_rebuild_script_has_help(capsys):
    import runpy
    from pathlib import Path

    script = Path(__file__).parents[1] / "scripts" / "rebuild_step_profile.py"
    main = runpy.run_path(str(script))["main"]
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0 and "bench-step --profile DIR" in capsys.readouterr().out
