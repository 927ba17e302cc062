"""What the dry run must refuse or report as the launch would (issue 36, items 1, 7, 8, 9, 14).

- a training set smaller than one batch: refused (not ``steps per epoch: 0 ... DRY RUN OK``);
- ``--require-data`` names scripts/prepare_data.sh only for the package's own data;
- ``VERL_USE_EXTERNAL_PLUGINS=none``: verl-gdro would not be registered, refused;
- the estimator alone under ``preset=paper`` reports the loss signal it runs;
- the resolved config prints the preset's values, not ``null``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from integration_harness import write_dataset
from test_dryrun_paths import BASE, ESTIMATOR_ONLY, GDRO_TRAINER

from verl_gdro.dryrun import dry_run

MICRO = BASE[5:9]


def _files(path: str) -> list[str]:
    return [f"data.train_files={path}", f"data.val_files={path}"]


@pytest.mark.slow
@pytest.mark.parametrize("rows", [5, 24])
def test_a_training_set_smaller_than_a_batch_is_refused(tmp_path: Path, capsys, rows: int) -> None:
    data = write_dataset(tmp_path, rows)
    argv = ESTIMATOR_ONLY + _files(data) + ["data.train_batch_size=6", "actor_rollout_ref.actor.ppo_mini_batch_size=6",
                                            *MICRO]
    status = dry_run(argv, print_config=False)
    captured = capsys.readouterr()
    if rows >= 6:
        assert status == 0, captured.err
        assert "steps per epoch: 4" in captured.out
        return
    assert status == 2
    assert captured.err.strip() == (
        "DRY RUN FAILED: data.train_files has 5 rows, fewer than data.train_batch_size=6: verl drops the incomplete "
        "last batch, so an epoch would have 0 steps; use more training rows or a smaller data.train_batch_size"
    )


@pytest.mark.slow
def test_require_data_names_prepare_data_only_for_the_package_data(tmp_path: Path, capsys) -> None:
    own = tmp_path / "mine.parquet"
    assert dry_run(GDRO_TRAINER + _files(str(own)) + MICRO, require_data=True, print_config=False) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"DRY RUN FAILED: data.train_files={own} does not exist", err
    from test_recipes import recipe_argv

    ours = recipe_argv(tmp_path, "prompt_gdro_qwen3_4b.sh", env={"DRY_RUN": "1"})[2:]  # DATA_DIR=tmp_path/data
    assert dry_run(ours, require_data=True, print_config=False) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"DRY RUN FAILED: data.train_files={tmp_path}/data/") and err.endswith(
        "does not exist (run scripts/prepare_data.sh)"), err


@pytest.mark.slow
def test_plugins_off_is_refused_with_the_registration_error(monkeypatch, capsys) -> None:
    """verl loads no plugin under ``VERL_USE_EXTERNAL_PLUGINS=none`` (or a list without ours): the
    launch would fail after Ray with verl's ``Unknown trainer 'gdro_sync'``."""
    for policy in ("none", "someone_else"):
        monkeypatch.setenv("VERL_USE_EXTERNAL_PLUGINS", policy)
        assert dry_run(GDRO_TRAINER + MICRO, print_config=False) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"DRY RUN FAILED: verl-gdro is not registered with verl (VERL_USE_EXTERNAL_PLUGINS={policy})"), err
    monkeypatch.setenv("VERL_USE_EXTERNAL_PLUGINS", "verl_gdro")
    assert dry_run(GDRO_TRAINER + MICRO, print_config=False) == 0, capsys.readouterr().err


@pytest.mark.slow
def test_estimator_alone_reports_what_it_runs_and_prints_resolved_values(capsys) -> None:
    argv = ESTIMATOR_ONLY + ["+algorithm.gdro.preset=paper", *MICRO]
    assert dry_run(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "Prompt-GDRO: on (reweight, loss_signal=failure_rate)" in out
    assert "surrogate_kl" not in out
    config = yaml.safe_load(out.split("=== resolved config ===")[1].split("=== checks passed ===")[0])
    group = config["algorithm"]["gdro"]
    assert group["classifier"]["num_bins"] == 10 and group["prompt"]["score_clip"] == 10.0
    assert "window" not in group["classifier"] and "loss_signal" not in group["prompt"]


@pytest.mark.slow
def test_gdro_trainer_resolved_config_has_no_preset_nulls(capsys) -> None:
    assert dry_run(GDRO_TRAINER + ["gdro.preset=release", *MICRO]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    config = yaml.safe_load(out.split("=== resolved config ===")[1].split("=== checks passed ===")[0])
    for group in (config["gdro"], config["algorithm"]["gdro"]):
        assert group["classifier"]["bin_edges"] == [0.4, 0.75] and group["classifier"]["num_bins"] == 3
        assert group["prompt"]["loss_signal"] == "update_surrogate" and group["rollout"]["allocator"] == "bandit"
        assert group["prompt"]["kl_coef"] is not None


@pytest.mark.slow
def test_reproduce_section_3_shows_what_the_command_prints(tmp_path: Path) -> None:
    """docs/reproduce.md, section 3: the shown output is the command's (the derived quantities, the
    last line up to its ``...``)."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    text = (repo / "docs" / "reproduce.md").read_text(encoding="utf-8")
    section = text.split("## 3. Check a run on any machine (no GPU)", 1)[1].split("## 4.", 1)[0]
    shown = section.split("```\n=== derived quantities ===", 1)[1].split("```", 1)[0].splitlines()
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "DATA_DIR": str(tmp_path / "data")}
    res = subprocess.run(["bash", str(repo / "recipes" / "prompt_gdro_qwen3_4b.sh"), "--quiet"], env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    printed = res.stdout.split("=== derived quantities ===", 1)[1].splitlines()
    assert printed[:-1] == shown[:-1]
    assert shown[-1].endswith(" ...") and printed[-1].startswith(shown[-1][: -len(" ...")])
