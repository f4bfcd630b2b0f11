"""Profile tables: kernels ranked by their own time per phase, ranges kept apart as ranges
(bench-model's `bench.tools.model.profile`); a collective's share beside compute
(`bench.core.profiling`)."""

from types import SimpleNamespace

import pytest

from bench.core.profiling import collective_overlap
from bench.tools.model.profile import (
    AttentionShape,
    attention_flops,
    kernel_category,
    profile_rows,
)


def _range(name, start, end, *, device="CPU"):
    """A `record_function` range as the profiler reports it (CPU side, or its GPU copy)."""
    return SimpleNamespace(
        name=name,
        device_type=f"DeviceType.{device}",
        is_user_annotation=True,
        time_range=SimpleNamespace(start=start, end=end),
        kernels=[],
        self_cpu_time_total=0.0,
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


def _kernel_event(name, start, us):
    """The kernel itself, as a CUDA-side event (its time is already counted via its operator)."""
    return SimpleNamespace(
        name=name,
        device_type="DeviceType.CUDA",
        is_user_annotation=False,
        time_range=SimpleNamespace(start=start, end=start + us),
        kernels=[],
        self_cpu_time_total=0.0,
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
        ("void (anonymous namespace)::softmax_warp_backward<float>", "softmax"),
        ("void at::native::reduce_kernel<512, 1>", "elementwise"),
        ("some_custom_kernel", "other"),
    ],
)
def test_kernel_categories(name, category):
    assert kernel_category(name) == category
    assert kernel_category(name, phase="optimizer") == "optimizer"


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
