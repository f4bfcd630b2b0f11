"""The candidate kernels for Hopper GPUs against float64 oracles: the warp-specialised forward and
dK/dV loops, dQ on tiles with as many keys as queries, and the backward's L2-grouped launch
order, each forced through FA2_TILES and FA2_L2_GROUP as the GPU screen forces them.

On a machine without CUDA Triton's interpreter runs them: warp specialisation is a compile hint,
so the interpreter runs the same single masked loop, reading through the same TMA descriptors
(which it emulates). With CUDA the tiles are the 16-bit tables' candidates.
"""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import triton.testing
from oracle_checks import assert_within_twice_plain, grads

from fa2 import FlashAttention2Triton, attention_reference, varlen_attention_reference

# backward before the fixture patches launch.tma_capable: it imports that function by name, and
# must not keep the patched one (its TMA reductions do not run in the interpreter)
from fa2.triton import backward, configs, forward, launch  # noqa: F401
from fa2.triton.configs import Tile

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Forcing warp-specialised tiles is what these tests do; the warning it gives has tests below.
pytestmark = pytest.mark.filterwarnings("ignore:FA2_TILES forces the warp-specialised")


@pytest.fixture
def hopper(monkeypatch):
    """Plans built afresh, on a device taken to have a TMA unit where it is the CPU (Triton's
    interpreter runs the descriptors); set FA2_TILES and FA2_L2_GROUP with `monkeypatch`."""
    if DEVICE == "cpu":
        monkeypatch.setattr(launch, "tma_capable", lambda device: True)
    forward._plans.cache.clear()  # the backward plans hang on the forward plans
    yield monkeypatch
    forward._plans.cache.clear()


def _candidates(d: int, dtype: torch.dtype) -> str:
    """FA2_TILES forcing the warp-specialised forward and dK/dV tiles and the square dQ tile."""
    if configs.INTERPRET:
        return "forward=32x16/1w/1s+TMA+WS,dkdv=16x32/1w/1s+TMA+WS,dq=32x32/1w/1s"
    if dtype == torch.float32:
        pytest.skip("the tables list warp-specialised tiles for 16-bit inputs only")
    family = f"16bit_d{max(64, configs.block_d(d))}"  # head dims up to 32 share the d=64 lists
    rules = {"forward": lambda t: t.ws, "dkdv": lambda t: t.ws, "dq": lambda t: t.block_n == 128}
    tiles = {k: next(t for t in configs.KERNELS[k][family] if rule(t)) for k, rule in rules.items()}
    return ",".join(f"{kernel}={tile}" for kernel, tile in tiles.items())


def _attention(q, k, v, *, causal, window_size=(-1, -1), softcap=0.0, bottom_right=False,
               layout="bhsd", cu_seqlens=None, max_seqlen=None):  # fmt: skip
    """FlashAttention2Triton.apply with its options (positional there) by name."""
    return FlashAttention2Triton.apply(
        q, k, v, causal, None, False, None, True, window_size, softcap, layout, cu_seqlens,
        cu_seqlens, max_seqlen, max_seqlen, bottom_right,
    )  # fmt: skip


def _randn(*shape, dtype):
    return torch.randn(*shape, device=DEVICE).to(dtype).requires_grad_()


def _assert_candidates_ran(*, grouped=False):
    """The plans just used ran the candidates; dK/dV with grouped heads, whose loop over the
    heads the specialising pass fails on, its list's default tile and the plain kernel."""
    (fwd,) = forward._plans.cache.values()
    (bwd,) = fwd.backward_plans.values()
    assert fwd.launch.options["WS"] and bwd.launches["dkdv"].options["WS"] != grouped
    assert bwd.tiles["dkdv"].ws != grouped
    assert bwd.tiles["dq"].block_m == bwd.tiles["dq"].block_n


# (n_q, n_k, heads, kv_heads, d, dtype, options); each covers edges of the single masked loop
CASES = {
    # grouped heads: the forward specialised, dK/dV the plain kernel
    "causal-mqa-ragged-bf16": (45, 45, 2, 1, 64, torch.bfloat16, dict(causal=True)),
    "bottom-right-empty-rows-padded-d": (
        70, 37, 2, 2, 96, torch.float32, dict(causal=True, bottom_right=True),
    ),
    "window-both-sides-softcap-d128": (
        50, 50, 2, 2, 128, torch.float32,
        dict(causal=False, window_size=(9, 5), softcap=8.0),
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_candidates_match_the_oracle(hopper, case):
    n_q, n_k, heads, kv_heads, d, dtype, options = CASES[case]
    options = {"window_size": (-1, -1), "softcap": 0.0, "bottom_right": False} | options
    hopper.setenv("FA2_TILES", _candidates(d, dtype))
    q = _randn(1, heads, n_q, d, dtype=dtype)
    k, v = (_randn(1, kv_heads, n_k, d, dtype=dtype) for _ in range(2))
    do = torch.randn_like(q)
    ours = grads(_attention(q, k, v, **options), (q, k, v), do)
    _assert_candidates_ran(grouped=heads != kv_heads)
    reference = {name: options[name] for name in ("window_size", "softcap", "bottom_right")}

    def run(dtype):
        ins = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        ref, _ = attention_reference(*ins, causal=options["causal"], **reference)
        return grads(ref, ins, do.to(dtype))

    assert_within_twice_plain(ours, run(torch.float64), run(dtype), dtype)


def test_candidates_take_packed_sequences(hopper):
    lengths = [1, 17, 40]  # one token, odd, longer than a tile
    cu = torch.tensor([0, 1, 18, 58], dtype=torch.int32, device=DEVICE)
    hopper.setenv("FA2_TILES", _candidates(32, torch.bfloat16))
    q, k, v = (_randn(sum(lengths), 1, 32, dtype=torch.bfloat16) for _ in range(3))
    do = torch.randn_like(q)
    o = _attention(q, k, v, causal=True, layout="thd", cu_seqlens=cu, max_seqlen=40)
    ours = grads(o, (q, k, v), do)
    _assert_candidates_ran()

    def run(dtype):
        ins = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        ref, _ = varlen_attention_reference(*ins, cu.cpu(), cu.cpu(), causal=True)
        return grads(ref, ins, do.to(dtype))

    assert_within_twice_plain(ours, run(torch.float64), run(torch.bfloat16), torch.bfloat16)


def test_backward_is_bitwise_deterministic_in_any_launch_order(hopper):
    # Two runs give the same bits; so does the L2-grouped order, which only renames programs:
    # three (batch, head) rows in groups of two, the last group smaller.
    hopper.setenv("FA2_TILES", _candidates(32, torch.bfloat16))
    q, k, v = (_randn(1, 3, 33, 32, dtype=torch.bfloat16) for _ in range(3))
    do = torch.randn_like(q)
    o = _attention(q, k, v, causal=True)
    first = torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    again = torch.autograd.grad(o, (q, k, v), do)
    hopper.setenv("FA2_L2_GROUP", "2")  # read when the forward builds its plan
    grouped = torch.autograd.grad(_attention(q, k, v, causal=True), (q, k, v), do)
    plans = list(forward._plans.cache.values())
    assert len(plans) == 2  # a plan for each setting
    assert plans[1].backward_plans[(do.stride(), True)].l2_groups == dict(dq=2, dkdv=2)
    for a, b, c in zip(first, again, grouped, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_l2_group_sizes(monkeypatch):
    monkeypatch.delenv("FA2_L2_GROUP", raising=False)
    assert configs.l2_group(8 * 2**20) == 1  # unset: the grid's own order
    monkeypatch.setenv("FA2_L2_GROUP", "auto")
    mib = 2**20
    assert [configs.l2_group(n * mib) for n in (3, 8, 16, 20, 64)] == [8, 4, 2, 1, 1]
    monkeypatch.setenv("FA2_L2_GROUP", "3")
    assert configs.l2_group(mib) == 3
    monkeypatch.setenv("FA2_L2_GROUP", "many")
    with pytest.raises(ValueError, match="FA2_L2_GROUP"):
        configs.l2_group(mib)


def test_tiles_are_written_and_read_back():
    for table in configs.KERNELS.values():
        for tile in (t for tiles in table.values() for t in tiles):
            assert Tile.parse(str(tile)) == tile
    assert str(Tile(128, 64, 4, 2, tma=True, ws=True)) == "128x64/4w/2s+TMA+WS"
    assert Tile.parse(" 32x128/4w/3s+ws+tma ") == Tile(32, 128, 4, 3, tma=True, ws=True)
    for bad in ("128x64/4w", "128x64/4w/2s+FAST", "big"):
        with pytest.raises(ValueError, match="written like"):
            Tile.parse(bad)


def _default(kernel, d=64, dtype=torch.bfloat16):
    return configs.choose_tile(
        configs.KERNELS[kernel], head_dim_block=d, dtype=dtype, precision="tf32",
        seq_len=8192, key=lambda: (), run=None,
    )  # fmt: skip


def test_forced_tiles_must_be_listed_candidates(monkeypatch):
    monkeypatch.setattr(configs, "INTERPRET", False)  # the GPU tables
    listed = configs.DKDV["16bit_d128"][-1]
    monkeypatch.setenv("FA2_TILES", f"dkdv={listed}")
    assert _default("dkdv", 128) == listed
    assert _default("forward", 128) == configs.FORWARD["16bit_d128"][0]  # others untouched
    monkeypatch.setenv("FA2_TILES", "dkdv=48x48/4w/2s")
    with pytest.raises(ValueError, match=r"not a candidate.*candidates: "):
        _default("dkdv", 128)
    monkeypatch.setenv("FA2_TILES", "backward=32x64/4w/2s")
    with pytest.raises(ValueError, match="kernels forward, dq, dkdv, single-pass"):
        _default("dkdv", 128)


def test_no_list_defaults_to_a_warp_specialised_tile():
    for name, table in configs.KERNELS.items():
        for family, tiles in table.items():
            assert not tiles[0].ws, (name, family)


def test_forcing_a_warp_specialised_tile_warns_once_citing_the_gpu_diagnosis(monkeypatch):
    monkeypatch.setattr(configs, "INTERPRET", False)  # the GPU tables
    monkeypatch.setattr(configs, "_warned", set())
    ws = next(t for t in configs.FORWARD["16bit_d128"] if t.ws)
    monkeypatch.setenv("FA2_TILES", f"forward={ws}")
    with pytest.warns(UserWarning, match=r"forward tile .*fa2_ws_diagnose_h200_2026-11-28\.md"):
        assert _default("forward", 128) == ws
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _default("forward", 128) == ws  # said once


def test_autotuning_never_times_a_warp_specialised_tile(monkeypatch):
    monkeypatch.setattr(configs, "INTERPRET", False)  # the GPU tables, which list such tiles
    monkeypatch.setattr(configs, "_fastest", {})
    monkeypatch.setenv("FA2_AUTOTUNE", "1")
    monkeypatch.delenv("FA2_TILES", raising=False)
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **_: fn() or 1.0)
    for kernel in ("forward", "dkdv"):
        timed = []
        tile = configs.choose_tile(
            configs.KERNELS[kernel], head_dim_block=128, dtype=torch.bfloat16, precision="tf32",
            seq_len=8192, key=lambda: (), run=timed.append,
        )  # fmt: skip
        assert len(set(timed)) > 1 and not any(t.ws for t in timed) and not tile.ws


def test_naming_a_single_pass_tile_lets_16_bit_inputs_take_it(monkeypatch):
    monkeypatch.delenv("FA2_TILES", raising=False)
    assert not configs.single_pass_backward(torch.bfloat16)
    monkeypatch.setenv("FA2_TILES", f"single-pass={configs.DKDV_ATOMIC['interpreter'][0]}")
    assert configs.single_pass_backward(torch.bfloat16)


# Compiles fa2's specialised launches for sm_90 with Triton's own passes (no GPU); printed as JSON.
_IR_CHECK = """
import json, sys
sys.path.insert(0, {scripts!r})
import sm90_screen, ws_diagnose
fa2 = ws_diagnose.fa2_ir_rows([sm90_screen.Case("d128", (1, 2, 512, 128))], first_only=True)
shared = ws_diagnose._ir_row("stand-in", "shared", lambda: ws_diagnose._standin_ttgir(
    ws_diagnose.VARIANTS[1]))
print(json.dumps(dict(fa2=fa2, shared=shared)))
"""


def test_specialised_loops_number_each_consumers_rows_once():
    """Compiled for sm_90 up to TTGIR (Triton 3.6's passes, no GPU; in a process without the
    interpreter): fa2's warp-specialised forward and dK/dV loops are split, and no consumer
    warpgroup's row indices carry its offset twice, the defect `tiles.load_rows` works around.
    A stand-in loop that shares the coordinate still shows it, so the check can see it."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    scripts = Path(__file__).resolve().parents[1] / "scripts"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", _IR_CHECK.format(scripts=str(scripts))],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert {r["name"].split()[1] for r in result["fa2"]} == {"forward", "dkdv"}
    for row in result["fa2"]:
        assert row["ws"] and row["double_offsets"] == [], row
    assert result["shared"]["ws"] and result["shared"]["double_offsets"], result["shared"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the rehearsal is the CPU's (a GPU screens)")
def test_the_screen_rehearses_in_interleaved_rounds(tmp_path):
    """`scripts/hopper_screen.py --tiny` on the CPU (Triton's interpreter): fa2 beside SDPA at a
    tiny shape, each timed in every round (forwards, then backwards), its time the median of
    its rounds; fa2's error within twice SDPA's and its backward's bits repeated."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "hopper_screen.py"
    done = subprocess.run(
        [
            sys.executable, str(script), "--tiny", "--shape", "1,2,70,64", "--impls", "fa2",
            "--rounds", "3", "--rep-ms", "3", "--out", str(tmp_path),
        ],
        env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads((tmp_path / "hopper_screen.json").read_text())
    assert data["meta"]["rounds"] == 3
    rows = {r["impl"]: r for r in data["rows"]}
    assert set(rows) == {"sdpa-cpu", "fa2"}
    for row in rows.values():
        taken = [r["fwd_bwd_ms"] for r in row["rounds"]]
        assert len(taken) == 3 and row["fwd_bwd_ms"] == sorted(taken)[1]
    assert rows["fa2"]["error_vs_sdpa"] <= 2 and rows["fa2"]["deterministic"]
    assert all(row["host_ms"] is None for row in rows.values())  # on a CPU it is all host time


def test_the_screens_page_bolds_a_host_time_from_half_its_rows_time(tmp_path):
    """`--report`: each row's host time beside its device time, bold where it is at least half
    the row's fwd+bwd (there the row may time the host, not the kernels)."""
    pytest.importorskip("matplotlib")  # the page's plot; bench brings it
    script = Path(__file__).resolve().parents[1] / "scripts" / "hopper_screen.py"
    meta = dict(device="an H200", torch="2.11", triton="3.6", cudnn=91900, python="3.12",
                date="2026-11-29", git_revision="abc1234", command="hopper_screen.py",
                budget_s=60.0, rep_ms=300.0, rounds=2)  # fmt: skip
    timed = [("cudnn", 0.333, 0.246), ("fa2", 0.399, 0.150), ("fa2 gluon-bwd", 0.538, None)]
    rows = [dict(shape="(32, 16, 512, 64)", impl=impl, fwd_ms=0.1, bwd_ms=ms - 0.1,
                 fwd_bwd_ms=ms, host_ms=host) for impl, ms, host in timed]  # fmt: skip
    (tmp_path / "screen.json").write_text(json.dumps(dict(meta=meta, rows=rows)))
    report = [sys.executable, str(script), "--report", str(tmp_path / "screen.json")]
    subprocess.run(report, check=True, capture_output=True, timeout=120)
    page = (tmp_path / "screen.md").read_text().splitlines()
    cudnn, fa2, gluon = (next(line for line in page if f"| {i} |" in line) for i, _, _ in timed)
    assert "| **0.246** |" in cudnn  # 0.246 >= 0.333 / 2
    assert "| 0.150 |" in fa2 and "**" not in fa2  # 0.150 < 0.399 / 2
    assert "| 0.538 |  |" in gluon  # not measured: empty
