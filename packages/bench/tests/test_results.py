"""Result records: Markdown tables and the JSON round trip."""

import csv
import json
import math

import pytest
import torch

from bench.core.oom import OK, OOM
from bench.core.results import (
    NOISY,
    SCHEMA,
    TABLE_WIDTH,
    Run,
    format_value,
    load_json,
    result_stem,
    save_csv,
    save_json,
    to_markdown,
)


def _rows():
    g = torch.Generator().manual_seed(0)
    ms = torch.rand(3, generator=g).add(0.1).tolist()
    return [
        {"impl": "naive", "seq": 128, "ms": ms[0], "status": OK},
        {"impl": "naive", "seq": 256, "ms": None, "status": OOM},
        {"impl": "sdpa", "seq": 128, "ms": ms[1], "status": OK},
    ]


def test_format_value_rules():
    assert format_value(None) == "—"
    assert format_value(float("nan")) == "—"
    assert format_value(True) == "yes"
    assert format_value(12345.6) == "12,346"
    assert format_value(0.0123456) == "0.01235"
    assert format_value(16384) == "16,384"
    assert format_value(512) == "512"


def test_to_markdown_shows_oom_in_empty_cells_of_oom_rows():
    lines = to_markdown(_rows(), columns=["impl", "seq", "ms"]).splitlines()
    assert lines[0].split("|")[1].strip() == "impl"
    assert len(lines) == 2 + 3
    assert lines[3].split("|")[3].strip() == "OOM"


def test_to_markdown_without_rows():
    assert to_markdown([]) == "(no rows)"


def test_run_create_collects_env_and_makes_config_json_safe():
    run = Run.create(
        "attn", _rows(), device="cpu", config={"dtype": torch.bfloat16, "seqs": (1, 2)}
    )
    assert run.env["device_type"] == "cpu"
    assert run.date == run.env["date"]
    assert run.command == run.env["command"]
    assert run.config == {"dtype": "torch.bfloat16", "seqs": [1, 2]}
    assert [r["seq"] for r in run.ok_rows] == [128, 128]


def test_json_round_trip(tmp_path):
    run = Run.create(
        "attn", _rows(), device="cpu", config={"b": 8}, command="bench-attn", notes=["n"]
    )
    path = save_json(run, tmp_path / "sub" / "r.json")
    data = json.loads(path.read_text())
    assert data["schema"] == SCHEMA
    back = load_json(path)
    assert back.rows == run.rows
    assert (back.tool, back.command, back.notes, back.config) == (
        "attn",
        "bench-attn",
        ["n"],
        {"b": 8},
    )


def test_json_round_trip_keeps_non_finite_floats(tmp_path):
    config = {"bucket_mbs": (0.0, math.inf), "floor": -math.inf}
    run = Run.create("zero", _rows(), device="cpu", config=config)
    run.rows[0]["ms"] = math.inf
    run.rows[1]["ms"] = math.nan
    path = save_json(run, tmp_path / "r.json")
    text = path.read_text()
    assert '"ms": Infinity' in text and '"ms": NaN' in text and '"floor": -Infinity' in text
    back = load_json(path)
    assert back.config == {"bucket_mbs": [0.0, math.inf], "floor": -math.inf}
    assert back.rows[0]["ms"] == math.inf
    assert math.isnan(back.rows[1]["ms"])
    assert back.rows[2] == run.rows[2]


def test_load_json_rejects_other_files(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"rows": []}')
    with pytest.raises(ValueError, match="not a bench result"):
        load_json(path)


def test_run_to_markdown_has_title_header_notes_and_table():
    run = Run.create("attn", _rows(), device="cpu", config={}, title="T", notes=["CPU default"])
    text = run.to_markdown()
    assert text.startswith("### T")
    assert "torch " + torch.__version__ in text
    assert "- CPU default" in text
    assert "| impl" in text


def _wide_run() -> Run:
    """A run whose full table is far wider than a terminal: 16 numeric columns, a long status,
    a noisy time."""
    g = torch.Generator().manual_seed(1)
    values = torch.rand(3, 16, generator=g).mul(1e4).tolist()
    rows = [
        {"impl": f"impl-{i}", **{f"metric_{j}": v for j, v in enumerate(vs)}, "status": OK}
        for i, vs in enumerate(values)
    ]
    rows[1]["status"] = "skipped: a reason of a whole sentence that no column should be as wide as"
    rows[2][NOISY] = ["metric_0"]
    columns = ["impl", *(f"metric_{j}" for j in range(16)), "status", NOISY]
    brief = {"impl": "impl", "status": "status", **{f"metric_{j}": f"m{j}" for j in range(16)}}
    return Run.create("x", rows, device="cpu", config={}, title="T", columns=columns,
                      notes=["a note " * 40], brief=brief)  # fmt: skip


def test_the_printed_table_fits_120_characters_and_names_what_it_leaves_out():
    run = _wide_run()
    text = run.to_markdown(wide=False)
    lines = text.splitlines()
    assert all(len(line) <= TABLE_WIDTH for line in lines if not line.startswith("Command:"))
    table = [line for line in lines if line.startswith("| ")]
    assert len(table) == 2 + len(run.rows) and "| impl" in table[0] and "m0" in table[0]
    assert "[1]" in table[3] and f"[1] {run.rows[1]['status']}" in text  # a note, not a cell
    assert "| noisy" in table[4]  # row 2's metric_0: noisy, not a number
    assert format_value(run.rows[2]["metric_0"]) not in table[4]
    shown = table[0].count("|") - 1
    assert 3 <= shown < 18
    left_out = next(line for line in lines if line.startswith("Not shown:"))
    assert "metric_15" in left_out and "--wide" in left_out  # the last of brief go first
    assert "status" in table[0]  # second in brief: kept


def test_the_wide_table_and_a_run_without_brief_show_every_column():
    run = _wide_run()
    wide = run.to_markdown()
    assert "metric_15" in wide and run.rows[1]["status"] in wide and "Not shown" not in wide
    assert format_value(run.rows[2]["metric_0"]) in wide
    run.brief = None
    assert run.to_markdown(wide=False).count("metric_15") == 1


def test_result_stem_slugs_device_and_date():
    env = {"device_type": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "date": "2025-05-01T1"}
    assert result_stem("attn", env) == "attn_h100_2025-05-01"
    env["device_name"] = "NVIDIA GeForce RTX 4090"
    assert result_stem("attn", env) == "attn_nvidia-geforce-rtx-4090_2025-05-01"
    assert result_stem("attn", {**env, "device_type": "cpu"}) == "attn_cpu_2025-05-01"


def test_result_stem_names_the_gpu_count_of_a_multi_gpu_run():
    env = {"device_type": "cuda", "device_name": "NVIDIA H200", "date": "2025-05-01T1"}
    assert result_stem("zero", env, num_devices=2) == "zero_2xh200_2025-05-01"
    assert (
        result_stem("zero", {**env, "device_type": "cpu"}, num_devices=2) == "zero_cpu_2025-05-01"
    )


def test_keys_name_themselves_and_refuse_unknown_names():
    from bench.core.results import Keys

    keys = Keys("impl", "fwd_ms", "impl")
    assert keys.fwd_ms == "fwd_ms" and list(keys) == ["impl", "fwd_ms"]
    with pytest.raises(AttributeError, match=r"no row key 'bwd_ms'.*impl, fwd_ms"):
        _ = keys.bwd_ms
    with pytest.raises(AttributeError):
        keys.impl = "other"
    with pytest.raises(ValueError, match="identifiers"):
        Keys("fwd-ms")


def test_csv_rows_read_back_with_their_types_and_provenance(tmp_path):
    rows = [
        {"impl": "sdpa", "ms": 0.125, "ok": True, "mem": None, "speed": math.inf},
        {"impl": "fa2", "ms": 1 / 3, "ok": False, "extra": [1, 2]},
    ]
    run = Run.create("attn", rows, device="cpu", config={}, columns=["impl", "ms"])
    with save_csv(run, tmp_path / "sub" / "r.csv").open(newline="") as f:
        read = list(csv.DictReader(f))
    assert list(read[0])[:6] == ["impl", "ms", "ok", "mem", "speed", "extra"]
    assert read[0]["tool"] == "attn" and read[0]["date"] == run.date
    assert read[0]["device_name"] == run.env["device_name"]
    assert float(read[1]["ms"]) == 1 / 3 and float(read[0]["speed"]) == math.inf
    assert (read[0]["ok"], read[1]["ok"], read[0]["mem"], read[1]["extra"]) == (
        "true",
        "false",
        "",
        "[1, 2]",
    )
