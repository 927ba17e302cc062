"""``verl-gdro plot``: the same figures from the demo's metrics.jsonl and from verl's file logger."""

from __future__ import annotations

import json

import numpy as np
import pytest

from verl_gdro.metrics import metric_keys, step_keys, step_metrics
from verl_gdro.plots import HEATMAPS, draw_all, load_series, num_bins_of, series_matrix

B = 5


def _rows(steps: int = 6, seed: int = 0) -> list[dict]:
    """Real step_metrics output for a drifting synthetic curriculum (bin 4 absent at odd steps)."""
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(steps):
        bins = rng.integers(0, B, 16)
        if t % 2:
            bins[bins == 4] = 3
        n = np.full(16, 4)
        succ = rng.binomial(n, np.clip(0.15 * (bins + 1), 0, 1))
        m = step_metrics(B, bins, succ, n, n_mean=4.0, shadow_price=0.0, controller_time_s=0.001)
        rows.append(m)
    return rows


def _write_demo(path, methods=("grpo", "prompt_gdro"), seeds=(0,)):
    with path.open("w") as fh:
        for s in seeds:
            for m in methods:
                for t, r in enumerate(_rows(seed=hash((m, s)) % 1000)):
                    fh.write(json.dumps({"method": m, "seed": s, "step": t, **r, "train/reward": 0.1}) + "\n")


def _write_verl_file_logger(path, monkeypatch):
    """Write with verl 0.9.1's own FileLogger, so the format under test is the real one."""
    from verl.utils.tracking import FileLogger

    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    logger = FileLogger(project_name="p", experiment_name="e")
    for t, r in enumerate(_rows(seed=7), start=1):
        logger.log({**r, "actor/pg_loss": 0.5, "val-core/acc": 0.3}, step=t)
    logger.log({"val-core/acc": 0.4}, step=7)  # a validation-only row carries no gdro/ metric
    logger.finish()


def test_metric_names_are_those_of_the_trainer():
    rows = _rows()
    assert set(metric_keys(B)) <= set(rows[0])  # every bin present at step 0
    assert set(rows[1]) == set(step_keys([rows[1][f"gdro/count/bin_{b}"] for b in range(B)]))
    assert num_bins_of(rows) == B


def test_heatmap_matrix_masks_absent_bins():
    rows = _rows()
    mat = series_matrix(rows, "prompt_share", B)
    assert mat.shape == (B, len(rows))
    assert np.all(np.isnan(mat[4, 1::2]))  # bin 4 absent at odd steps
    np.testing.assert_allclose(np.nansum(mat, axis=0), 1.0)
    # Prompt-GDRO state is defined for every bin: never masked
    assert not np.isnan(series_matrix(rows, "q", B)).any()


def test_prompt_weight_of_absent_bins_is_masked_in_new_and_old_files():
    # issue 13: the weight of a bin absent from a step means nothing; new rows omit it, rows
    # logged before the change carry a placeholder that the plot must hide the same way
    rows = _rows()
    assert "gdro/prompt_weight/bin_4" not in rows[1]
    old = [{**r, **{f"gdro/{m}/bin_4": 1.0 for m in ("prompt_weight", "rollout_n", "acc", "loss")}} for r in rows]
    absent = series_matrix(rows, "count", B, mask_absent=False) == 0
    assert absent[4, 1::2].all()
    for rs in (rows, old):
        for metric in ("prompt_weight", "rollout_n", "acc", "loss"):
            np.testing.assert_array_equal(np.isnan(series_matrix(rs, metric, B)), absent, err_msg=metric)


def test_demo_jsonl_draws_every_figure(tmp_path):
    _write_demo(tmp_path / "metrics.jsonl")
    series = load_series(tmp_path)  # a run directory
    assert set(series) == {"grpo", "prompt_gdro"}
    assert [r["step"] for r in series["grpo"]] == list(range(6))
    paths = draw_all(series, tmp_path / "plots")
    names = {p.name for p in paths}
    for m in series:
        for stem in HEATMAPS:
            assert f"{m}_{stem}.png" in names
    assert {"lead_lag.png", "wse.png", "zero_adv_share.png"} <= names
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 2000


def test_several_seeds_are_separate_series(tmp_path):
    _write_demo(tmp_path / "metrics.jsonl", methods=("grpo",), seeds=(0, 1))
    assert set(load_series(tmp_path / "metrics.jsonl")) == {"grpo/seed0", "grpo/seed1"}


@pytest.mark.slow  # imports verl (its FileLogger writes the file under test)
def test_verl_file_logger_jsonl(tmp_path, monkeypatch):
    path = tmp_path / "run.jsonl"
    _write_verl_file_logger(path, monkeypatch)
    first = json.loads(path.read_text().splitlines()[0])
    assert set(first) == {"step", "data"}  # verl's layout: {"step": N, "data": {...}}
    series = load_series(path)
    assert list(series) == ["verl"]
    rows = series["verl"]
    assert [r["step"] for r in rows] == list(range(1, 7))  # the validation-only row is skipped
    expected = _rows(seed=7)
    for name in ("prompt_share", "acc", "rollout_n"):
        np.testing.assert_allclose(
            np.nan_to_num(series_matrix(rows, name, B), nan=-1), np.nan_to_num(series_matrix(expected, name, B), nan=-1)
        )
    assert load_series(path, name="mine").keys() == {"mine"}


@pytest.mark.slow
def test_cli_plot_from_verl_jsonl(tmp_path, monkeypatch):
    from verl_gdro.cli import main

    path = tmp_path / "run.jsonl"
    _write_verl_file_logger(path, monkeypatch)
    assert main(["plot", str(path), "--out", str(tmp_path / "figs")]) == 0
    assert (tmp_path / "figs" / "verl_bin_share.png").exists()
    assert (tmp_path / "figs" / "wse.png").exists()


def test_bad_inputs_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match="RUN_OR_JSONL"):
        load_series(tmp_path / "missing.jsonl")
    p = tmp_path / "x.jsonl"
    p.write_text('{"step": 1, "data": {"actor/pg_loss": 1.0}}\n')
    with pytest.raises(ValueError, match="no rows with gdro/"):
        load_series(p)
    p.write_text("not json\n")
    with pytest.raises(ValueError, match="not a JSON line"):
        load_series(p)


@pytest.mark.slow  # imports verl (its FileLogger writes the files under test)
def test_a_resumed_recipe_run_keeps_its_history(tmp_path, monkeypatch):
    """issue 32: verl's FileLogger truncates the file it opens, so the recipes give each start of a
    run its own file in one metrics/ folder (recipes/_common.sh); plot reads the folder as one
    series, steps 1-4 from the first start and 3-6 (re-logged 3 and 4 win) from the resumed one."""
    from verl.utils.tracking import FileLogger

    folder = tmp_path / "metrics"
    folder.mkdir()
    rows = _rows(steps=6, seed=3)
    for name, steps in (("20260101T000000Z-1.jsonl", range(1, 5)), ("20260101T010000Z-2.jsonl", range(3, 7))):
        monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(folder / name))
        logger = FileLogger(project_name="p", experiment_name="e")
        for t in steps:
            logger.log({**rows[t - 1], "gdro/resumed": float(name.endswith("2.jsonl"))}, step=t)
        logger.finish()
    (series,) = load_series(folder).values()
    assert [r["step"] for r in series] == [1, 2, 3, 4, 5, 6]
    assert [r["gdro/resumed"] for r in series] == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="neither metrics.jsonl nor any"):
        load_series(tmp_path / "empty")


def test_recipes_log_what_plot_reads_one_file_per_start(tmp_path):
    """The recipes' default logger includes verl's `file` and points it at a fresh file of the run's
    metrics folder (the one `verl-gdro plot` reads) each time they start."""
    import os
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    stub = tmp_path / "py"
    stub.write_text('#!/bin/sh\nprintf "%s\\n" "$VERL_FILE_LOGGER_PATH" "$@" > "$OUT"\n')
    stub.chmod(0o755)
    env = {**os.environ, "PYTHON": str(stub), "OUT": str(tmp_path / "argv"), "OUTPUT_DIR": str(tmp_path / "ckpt")}
    env.pop("VERL_FILE_LOGGER_PATH", None)
    subprocess.run(["bash", str(repo / "recipes" / "joint_qwen3_4b.sh")], check=True, env=env)
    path, *argv = (tmp_path / "argv").read_text().splitlines()
    assert "trainer.logger=[console,file]" in argv
    folder = tmp_path / "ckpt" / "verl_gdro" / "joint_qwen3_4b_robust_answer_seed0" / "metrics"
    assert Path(path).parent == folder and folder.is_dir() and path.endswith(".jsonl")
