"""docs/integration.md, "Bring your own data and reward": the documented command on such data.

A training parquet without ``extra_info.index``, two validation files and the +-1 example reward
(``recipes/own_data_reward.py``): the dry run accepts the documented command on these files; the
GDRO trainer, built by its real ``__init__`` with the same keys on rows of the same layout, runs
its first step; the
example reward's floats, recorded by verl's reward manager under ``acc``, are correctness above
``gdro.correct_threshold``. Without the dataset class, the dry run refuses, naming the keys.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from integration_harness import FakeTQ, make_trainer, run_step

REPO = Path(__file__).resolve().parent.parent


def documented_command() -> list[str]:
    text = (REPO / "docs" / "integration.md").read_text()
    section = text[text.index("## Bring your own data and reward"):]
    block = section[section.index("```bash") + len("```bash"):]
    block = block[: block.index("```")]
    return shlex.split(block.replace("\\\n", " "))


def write_own_data(root: Path) -> None:
    (root / "mine").mkdir(parents=True)
    # at least one batch of verl's default data.train_batch_size (1024): a smaller set is refused
    for name, count in (("train", 1030), ("test_a", 5), ("test_b", 3)):
        rows = [{
            "data_source": "mine",
            "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"split": name},  # no index
        } for i in range(count)]
        pd.DataFrame(rows).to_parquet(root / "mine" / f"{name}.parquet")


def _args(root: Path) -> list[str]:
    words = documented_command()
    assert words[:2] == ["verl-gdro", "dry-run"]
    rest = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8"]
    out = []
    for w in words[2:]:
        if w == "...":
            out += rest
        else:
            out.append(w.replace("$DATA_DIR", str(root)))
    return out


@pytest.mark.slow
def test_the_documented_own_data_command_dry_runs_and_the_trainer_runs_it(tmp_path: Path, capsys,
                                                                        monkeypatch, fake_tq: FakeTQ) -> None:
    from verl_gdro import cli

    write_own_data(tmp_path)
    monkeypatch.chdir(REPO)  # the reward path is relative to the checkout, as in the docs
    args = _args(tmp_path)
    assert cli.main(["dry-run", "--require-data", "--quiet", *args]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "gdro.uid_key=row_index: data.custom_cls is GDRODataset" in out
    assert "train.parquet: 1030 rows" in out and "test_a.parquet: 5 rows" in out and "steps per epoch" in out
    # without the dataset class: refused, naming every key it needs
    bare = [a for a in args if not a.startswith("data.custom_cls")]
    assert cli.main(["dry-run", "--quiet", *bare]) == 2
    err = capsys.readouterr().err
    assert "gdro.uid_key=row_index" in err and "data.custom_cls.path=pkg://verl_gdro.integration.dataset" in err
    assert "data.custom_cls.name=GDRODataset" in err

    # the trainer on the same keys (its own small batch) and rows without ids of the same layout
    keys = [a for a in args if a.startswith(("data.custom_cls", "gdro."))]
    (tmp_path / "trainer").mkdir()
    trainer = make_trainer(tmp_path / "trainer", *keys, index="none")
    metrics = run_step(trainer, fake_tq, 1)["metrics"]
    assert metrics["gdro/num_prompts"] == 6.0


def test_the_example_reward_is_plus_minus_one_and_reads_as_correctness() -> None:
    import importlib.util

    from verl_gdro.integration.glue import correctness
    from verl_gdro.step.config import resolve_gdro

    spec = importlib.util.spec_from_file_location("own_data_reward", REPO / "recipes" / "own_data_reward.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    scores = np.array([mod.compute_score("mine", "so 4 + 4 = 8", "8"), mod.compute_score("mine", "it is 9", "8"),
                       mod.compute_score("mine", "no idea", "8")])
    assert scores.tolist() == [1.0, -1.0, -1.0]
    threshold = resolve_gdro({"correct_threshold": float(re.search(
        r"gdro.correct_threshold=([\d.]+)", " ".join(documented_command())).group(1))}).correct_threshold
    assert correctness(scores, threshold).tolist() == [1.0, 0.0, 0.0]
