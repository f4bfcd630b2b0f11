"""bench-flash: FLOP counts, records, presets, graceful absence of fa2, the command line."""

import sys
from dataclasses import replace

import pytest
import torch

from bench.commands.flash import main
from bench.core.oom import OK
from bench.core.timing import elapsed_ms
from bench.tools.flash import (
    COLUMNS,
    PRESETS,
    attention_flops,
    host_calls,
    host_ms,
    plot_flash,
    run_flash,
)


def test_attention_flops_causal_and_not():
    causal = attention_flops(batch=3, seq=128, d=64, causal=True)
    full = attention_flops(batch=3, seq=128, d=64, causal=False)
    assert full["fwd"] == 3 * 4 * 128 * 128 * 64
    assert causal["fwd"] == full["fwd"] / 2
    assert causal["bwd"] == 2.5 * causal["fwd"]
    assert causal["fwd_bwd"] == causal["fwd"] + causal["bwd"]


@pytest.mark.parametrize(("seq", "seq_k"), [(7, 7), (5, 11), (11, 5), (1, 9), (9, 1)])
def test_causal_flops_count_the_visible_pairs_of_a_rectangle(seq, seq_k):
    # top-left alignment: query i sees keys 0..i; the count's continuous form, against the
    # exact pairs less half the diagonal's (each pair a unit square the diagonal halves)
    flops = attention_flops(batch=1, seq=seq, seq_k=seq_k, d=1, causal=True)["fwd"]
    exact = sum(min(i + 1, seq_k) for i in range(seq)) - min(seq, seq_k) / 2
    assert flops == 4 * exact
    full = attention_flops(batch=1, seq=seq, seq_k=seq_k, d=1, causal=False)["fwd"]
    assert full == 4 * seq * seq_k


def test_rectangular_cases_and_their_heatmaps(tiny_flash_case, tiny_budget_ms, tmp_path):
    case = replace(tiny_flash_case, seqs=(32, 64), seq_ks=(32, 64), impls=("fa2-pytorch", "sdpa"))
    run = run_flash([case], device="cpu", budget_ms=tiny_budget_ms, show_progress=False)
    assert {(r["seq"], r["seq_k"]) for r in run.rows} == {(32, 32), (32, 64), (64, 32), (64, 64)}
    for row in run.rows:
        flops = attention_flops(batch=1, seq=row["seq"], seq_k=row["seq_k"], d=16, causal=True)
        assert row["fwd_tflops"] == pytest.approx(flops["fwd"] / (row["fwd_ms"] * 1e-3) / 1e12)
    written = {p.name for p in plot_flash(run, tmp_path / "flash.png")}
    assert written == {
        "flash.png",
        "flash_tiny_fp32_ratio_nq_nk.png",
        "flash_tiny_fp32_ratio_seq_d.png",
    }


def test_rows_are_well_formed(tiny_flash_case, tiny_budget_ms):
    run = run_flash([tiny_flash_case], device="cpu", budget_ms=tiny_budget_ms, show_progress=False)
    assert run.tool == "flash" and run.group_by == "case"
    assert len(run.rows) == 2 * 3
    for row in run.rows:
        assert set(COLUMNS) <= set(row)
        assert row["status"] == OK
        assert row["fwd_ms"] > 0 and row["fwd_bwd_ms"] > 0
        assert row["fwd_bwd_host_ms"] is None  # on a CPU the times are the host's already
        flops = attention_flops(batch=1, seq=row["seq"], d=16, causal=True)["fwd"]
        assert row["fwd_tflops"] == pytest.approx(flops / (row["fwd_ms"] * 1e-3) / 1e12)
    assert {r["fwd_speedup"] for r in run.rows if r["impl"] == "sdpa"} == {1.0}


def test_backward_is_the_difference_of_medians(tiny_flash_case, tiny_budget_ms):
    run = run_flash([tiny_flash_case], device="cpu", budget_ms=tiny_budget_ms, show_progress=False)
    for row in run.rows:
        if row["bwd_ms"] is not None:
            assert row["bwd_ms"] == pytest.approx(row["fwd_bwd_ms"] - row["fwd_ms"])


def test_missing_fa2_marks_rows_skipped(tiny_flash_case, tiny_budget_ms, monkeypatch):
    monkeypatch.setitem(sys.modules, "fa2", None)
    case = replace(tiny_flash_case, seqs=(32,), impls=("fa2-pytorch", "sdpa"))
    run = run_flash([case], device="cpu", budget_ms=tiny_budget_ms, show_progress=False)
    status = {r["impl"]: r["status"] for r in run.rows}
    assert status["sdpa"] == OK
    assert status["fa2-pytorch"].startswith("skipped: the fa2 package is not importable")


def test_sdpa_backends_need_cuda(tiny_flash_case, tiny_budget_ms):
    case = replace(tiny_flash_case, seqs=(32,), impls=("sdpa-flash", "sdpa-cudnn"))
    run = run_flash([case], device="cpu", budget_ms=tiny_budget_ms, show_progress=False)
    assert all("needs CUDA" in r["status"] for r in run.rows)


def test_presets_match_the_issue():
    lb = PRESETS["leaderboard"]
    assert (lb.batch, lb.seqs, lb.d_values, lb.dtypes, lb.causal) == (
        16,
        (16384,),
        (64,),
        ("bf16",),
        True,
    )
    assert lb.grad == "sum" and lb.baseline == "sdpa-flash"
    assert "fa2-triton-compiled" in lb.impls and "sdpa-cudnn" in lb.impls
    assert PRESETS["noncausal"].causal is False and PRESETS["noncausal"].seqs == (4096,)
    assert PRESETS["d128"].d_values == (128,)
    sweep = PRESETS["sweep"]
    assert sweep.seqs[0] == 128 and sweep.seqs[-1] == 65536 and len(sweep.seqs) == 10
    assert sweep.batch == 1 and set(sweep.dtypes) == {"bf16", "fp32"}


@pytest.mark.parametrize(
    "bad", [{"impls": ("nope",)}, {"dtypes": ("fp8",)}, {"grad": "ones"}, {"seqs": ()}]
)
def test_case_rejects_bad_values(tiny_flash_case, bad):
    with pytest.raises(ValueError):
        replace(tiny_flash_case, **bad)


def test_each_shape_times_its_implementations_in_interleaved_rounds(tiny_flash_case, monkeypatch):
    """Every implementation is called once, then timed `rounds` times, forwards then backwards;
    a row's times are the medians of its rounds'."""
    import bench.tools.flash as flash

    order = []
    times = iter([(1.0, 3.0), (2.0, 4.0), (9.0, 9.5)] * 10)  # each impl: one of each
    monkeypatch.setattr(flash, "_passes", lambda case, impl, inputs, device: (impl, lambda: None))

    def timed(passes, *args, **kwargs):
        order.append(passes[0])  # the impl's name, which the patched _passes put first
        return next(times)

    monkeypatch.setattr(flash, "_time", timed)
    case = replace(tiny_flash_case, seqs=(32,), impls=("naive", "sdpa", "fa2-pytorch"))
    run = run_flash([case], device="cpu", rounds=3, show_progress=False)
    assert order == ["naive", "sdpa", "fa2-pytorch", "fa2-pytorch", "sdpa", "naive",
                     "naive", "sdpa", "fa2-pytorch"]  # fmt: skip
    by_impl = {r["impl"]: r for r in run.rows}
    # naive drew (1, 3), (9, 9.5), (1, 3): medians 1 and 3
    assert by_impl["naive"]["fwd_ms"] == 1.0 and by_impl["naive"]["fwd_bwd_ms"] == 3.0
    assert by_impl["naive"]["bwd_ms"] == 2.0 and run.config["rounds"] == 3
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        run_flash([case], device="cpu", rounds=0, show_progress=False)
    with pytest.raises(SystemExit):
        main(["--device", "cpu", "--rounds", "0"])


def test_main_help_exits_zero(help_text):
    assert "--preset" in help_text(main)


def test_main_overrides_and_writes(tmp_path):
    argv = ["--device", "cpu", "--seq", "32", "--d", "16", "--impls", "naive", "sdpa"]
    argv += ["--budget-ms", "1", "2", "--no-progress", "--json", str(tmp_path / "f.json")]
    assert main([*argv, "--plot", str(tmp_path / "f.png")]) == 0
    assert (tmp_path / "f.json").is_file() and (tmp_path / "f.png").is_file()


@pytest.mark.gpu
def test_leaderboard_implementations_run_on_cuda():
    case = replace(PRESETS["leaderboard"], batch=2, seqs=(1024,))
    run = run_flash([case], device="cuda", budget_ms=(5.0, 10.0), show_progress=False)
    assert {r["impl"]: r["status"] for r in run.rows} == dict.fromkeys(case.impls, OK)


@pytest.mark.gpu
def test_sweep_cell_on_cuda_reports_tflops():
    case = replace(PRESETS["sweep"], seqs=(1024,), d_values=(64,), dtypes=("bf16",))
    run = run_flash([case], device="cuda", budget_ms=(5.0, 10.0), show_progress=False)
    fa2 = next(r for r in run.rows if r["impl"] == "fa2-triton")
    assert fa2["status"] == OK and fa2["fwd_bwd_tflops"] > 0
    # Issuing a forward+backward costs the host some time, and no more than a second.
    assert all(0 < r["fwd_bwd_host_ms"] < 1000 for r in run.rows if r["status"] == OK)


def test_host_ms_is_none_off_cuda_and_refuses_no_calls():
    assert host_ms(lambda: None, device="cpu") is None
    # as many calls as take about 200 ms on the device, 3 to 20
    assert [host_calls(ms) for ms in (0.33, 20.0, 120.0)] == [20, 10, 3]
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="at least 1"):
            host_ms(lambda: None, device="cuda", calls=0)


@pytest.mark.gpu
def test_host_ms_times_the_issue_not_the_kernels_and_shows_a_synchronising_call():
    cycles = 20_000_000  # about 10 ms of GPU time a call
    _, device_ms = elapsed_ms(lambda: torch.cuda._sleep(cycles), device="cuda")
    issued = host_ms(lambda: torch.cuda._sleep(cycles), device="cuda", calls=5)
    assert issued < device_ms / 10
    waiting = host_ms(lambda: torch.cuda.synchronize(), device="cuda", calls=2)
    assert waiting > 10  # the first call waits out the hold
    x = torch.ones(4, device="cuda", requires_grad=True)
    host_ms(lambda: (x * 2).sum().backward(), device="cuda", calls=3, grad_to_none=[x])
    assert torch.equal(x.grad, torch.full_like(x, 2))  # reset before each call: no accumulation
