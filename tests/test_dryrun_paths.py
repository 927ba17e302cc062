"""The dry run resolves and accepts exactly what the runtime does (issue 32).

1. Every ``gdro`` key, set on its path's namespace (``algorithm.gdro.*`` for the estimator in verl's
   own trainer, ``gdro.*`` for the GDRO trainer), gives the dry run the very settings the runtime
   resolves from the composed config.
2. A small matrix of datasets (ids present, missing, duplicated) and settings (estimator alone,
   trainer with ``uid_key=index``, trainer with ``uid_key=row_index`` with and without
   ``GDRODataset``): the dry run accepts a case if and only if the GDRO trainer's real ``__init__``
   and ``_init_dataloader`` accept it.
3. The dry run never invents a dataset size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from integration_harness import make_trainer, write_dataset

from verl_gdro.allocators import ALLOCATOR_REGISTRY
from verl_gdro.dryrun import DryRunError, compose_config, dry_run, gdro_checks, parse_hydra_argv
from verl_gdro.integration import estimator as est
from verl_gdro.integration.estimator_keys import ESTIMATOR_READS
from verl_gdro.prompt_modes import PROMPT_MODE_REGISTRY
from verl_gdro.signals import LOSS_SIGNAL_REGISTRY
from verl_gdro.step.config import ACTOR_SIGNAL_KEYS, default_gdro_group, keys_read, resolve_gdro

#: one valid, non-default value per key of the gdro group (every key must be here: a new key
#: without an entry fails test_every_key_has_a_value)
VALUES: dict[str, str] = {
    "enable": "false",
    "preset": "paper",
    "uid_key": "row_index",
    "acc_key": "score",
    "correct_threshold": "0.5",
    "advantage_clip": "5.0",
    "classifier.num_bins": "5",
    "classifier.bin_edges": "[0.3,0.6]",
    "classifier.window": "20",
    "classifier.hysteresis": "0.01",
    "classifier.k": "4",
    "classifier.passk_estimator": "any_of_n",
    "classifier.unseen_bin": "2",
    "prompt.enable": "false",
    "prompt.mode": "reweight",
    "prompt.loss_signal": "surrogate",
    "prompt.eta": "0.3",
    "prompt.beta": "0.5",
    "prompt.gamma": "0.1",
    "prompt.max_weight": "5.0",
    "prompt.score_clip": "5.0",
    "prompt.normalize_by_share": "false",
    "prompt.share_floor": "0.1",
    "prompt.weight_normalization": "raw",
    "prompt.min_ess": "0.5",
    "prompt.kl_coef": "0.01",
    "prompt.clip_ratio_low": "0.1",
    "prompt.clip_ratio_high": "0.2",
    "prompt.clip_ratio_c": "2.5",
    "prompt.mix_support": "present",
    "prompt.explore": "0.3",
    "prompt.rate_decay": "0.7",
    "prompt.revisit": "0.3",
    "prompt.band_width": "0.3",
    "rollout.enable": "false",
    "rollout.n_min": "3",
    "rollout.n_max": "8",
    "rollout.eta": "0.3",
    "rollout.gamma": "0.1",
    "rollout.score_ema": "0.5",
    "rollout.dual_lr": "0.1",
    "rollout.allocator": "bandit",
    "rollout.arm_utility": "variance",
    "rollout.rate_decay": "0.7",
    "rollout.selection": "sample",
    "rollout.seed": "3",
}

ESTIMATOR_ONLY = ["--config-path=pkg://verl.trainer.config", "--config-name=ppo_trainer",
                  "algorithm.adv_estimator=gdro_grpo", "actor_rollout_ref.rollout.n=4"]
GDRO_TRAINER = ["--config-path=pkg://verl_gdro.config", "--config-name=gdro_trainer",
                "actor_rollout_ref.actor.use_kl_loss=true"]


def _leaves(group: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, v in group.items():
        out += _leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"]
    return out


def test_every_key_has_a_value() -> None:
    assert sorted(VALUES) == sorted(_leaves(default_gdro_group()))


def _composed(argv: list[str]):
    return compose_config(parse_hydra_argv(argv))


# what a key's value needs beside it on the GDRO trainer's path
TRAINER_EXTRA = {
    "uid_key": ["data.custom_cls.path=pkg://verl_gdro.integration.dataset", "data.custom_cls.name=GDRODataset"],
    "rollout.allocator": ["gdro.rollout.arm_utility=variance"],
    "rollout.n_min": ["actor_rollout_ref.rollout.n=4"],
    "prompt.mix_support": ["gdro.prompt.min_ess=0"],
}


def reading_context(key: str) -> list[str]:
    """Overrides that make a strategy that reads ``key`` active (a key no active strategy reads is
    refused: docs/configuration.md, "Keys each strategy reads"), from the strategies' declarations."""
    if key in keys_read(resolve_gdro(None)):
        out = []
    elif key.startswith("rollout."):
        out = [f"gdro.rollout.allocator={next(n for n, c in ALLOCATOR_REGISTRY.items() if key in c.reads)}"]
    elif any(key in c.reads for c in PROMPT_MODE_REGISTRY.values()):
        out = [f"gdro.prompt.mode={next(n for n, c in PROMPT_MODE_REGISTRY.items() if key in c.reads)}"]
    else:
        out = [f"gdro.prompt.loss_signal={next(n for n, c in LOSS_SIGNAL_REGISTRY.items() if key in c.reads)}"]
    leaf = key.split(".")[-1]
    if leaf in ACTOR_SIGNAL_KEYS:  # the signal's coefficient must equal the actor's
        out.append(f"{ACTOR_SIGNAL_KEYS[leaf]}={VALUES[key]}")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(VALUES))
def test_dry_run_resolves_every_key_as_the_estimator_does(key: str) -> None:
    """The estimator in verl's own trainer: ``+algorithm.gdro.<key>`` on verl's ppo_trainer; a key
    that path does not read is refused by the dry run as by the estimator (tests/test_estimator_keys.py)."""
    extra = {"prompt.mix_support": ["+algorithm.gdro.prompt.min_ess=0"]}.get(key, [])
    cfg = _composed(ESTIMATOR_ONLY + [f"+algorithm.gdro.{key}={VALUES[key]}", *extra])
    if key not in ESTIMATOR_READS:
        # refused by the path's declaration, or first by the strategies' (a sampling mode's key under reweight)
        with pytest.raises(DryRunError, match=rf"algorithm\.gdro\.{key}(=\S+ is set but nothing reads it| is invalid for "
                           "the gdro_grpo estimator alone)"):
            gdro_checks(cfg)
        return
    dry = gdro_checks(cfg)
    est.reset_standalone()
    runtime = est._settings_from(cfg.algorithm, standalone=True)  # what gdro_grpo resolves at its first call
    assert dry == runtime
    assert dry != resolve_gdro(None, standalone=True) or key in ("rollout.enable", "prompt.mode")  # the key took effect


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(VALUES))
def test_dry_run_resolves_every_key_as_the_gdro_trainer_does(key: str) -> None:
    """The GDRO trainer: ``gdro.<key>`` on the package config; the trainer hands the estimator the
    group it resolved at init (``algorithm.gdro``), which must give the same settings back."""
    cfg = _composed(GDRO_TRAINER + [f"gdro.{key}={VALUES[key]}", *TRAINER_EXTRA.get(key, []), *reading_context(key)])
    dry = gdro_checks(cfg)
    assert resolve_gdro(dry.to_dict()) == dry  # the logged, resolved group is the same settings


# ------------------------------------------------------------------------------------------------
# the data matrix: the dry run accepts exactly what the trainer accepts
# ------------------------------------------------------------------------------------------------

BASE = [
    "data.train_batch_size=6",
    "data.filter_overlong_prompts=false",
    "data.seed=3",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=6",
    # verl's own checks (main_ppo runs them before the trainer): micro-batches set
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=6",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=6",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=6",
    "actor_rollout_ref.rollout.name=vllm",
    "gdro.prompt.mode=reweight",
    "gdro.rollout.enable=false",
]
ROW_INDEX = ["gdro.uid_key=row_index"]
GDRO_DATASET = ["data.custom_cls.path=pkg://verl_gdro.integration.dataset", "data.custom_cls.name=GDRODataset"]
DATASETS: dict[str, Any] = {
    "ids": "sparse",
    "no ids": "none",
    "duplicate ids": [5, 6, 7, 5] + list(range(100, 120)),
}
SETTINGS: dict[str, list[str]] = {
    "trainer, uid_key=index": [],
    "trainer, uid_key=row_index + GDRODataset": ROW_INDEX + GDRO_DATASET,
    "trainer, uid_key=row_index, no custom_cls": ROW_INDEX + ["data.custom_cls.path=null"],
    "trainer, uid_key=row_index, verl's class as custom_cls": ROW_INDEX + [
        "data.custom_cls.path=pkg://verl.utils.dataset.rl_dataset", "data.custom_cls.name=RLHFDataset"],
    "trainer, gdro off": ["gdro.enable=false"],
}


def _trainer_accepts(tmp_path: Path, overrides: list[str], index: Any) -> bool:
    try:
        make_trainer(tmp_path, *overrides, index=index)
    except ValueError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("dataset", sorted(DATASETS))
def test_dry_run_accepts_exactly_what_the_trainer_accepts(tmp_path: Path, dataset: str, setting: str, capsys) -> None:
    overrides = SETTINGS[setting]
    trainer_ok = _trainer_accepts(tmp_path, BASE[5:9] + overrides, DATASETS[dataset])
    data = tmp_path / "train.parquet"  # written by make_trainer
    argv = GDRO_TRAINER[:2] + [f"data.train_files={data}", f"data.val_files={data}", *BASE, *overrides]
    status = dry_run(argv, print_config=False)
    err = capsys.readouterr().err
    assert (status == 0) == trainer_ok, f"{dataset} / {setting}: dry run {status}, trainer {trainer_ok}: {err}"
    if not trainer_ok:
        assert "gdro.uid_key" in err, err


@pytest.mark.slow
def test_the_estimator_alone_needs_no_prompt_ids(tmp_path: Path, capsys) -> None:
    """verl's own trainer with the estimator: no stable ids are read, rows without extra_info.index
    are fine (train and validation)."""
    data = write_dataset(tmp_path, 24, "none")
    argv = ESTIMATOR_ONLY + [f"data.train_files={data}", f"data.val_files={data}", "data.train_batch_size=6",
                             "actor_rollout_ref.actor.ppo_mini_batch_size=6",
                             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=6",
                             "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=6",
                             "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=6",
                             "actor_rollout_ref.rollout.name=vllm"]
    assert dry_run(argv, print_config=False) == 0, capsys.readouterr().err
    assert "steps per epoch: 4" in capsys.readouterr().out


def test_no_training_file_no_invented_size(tmp_path: Path, capsys) -> None:
    argv = GDRO_TRAINER + [f"data.train_files={tmp_path}/absent.parquet", f"data.val_files={tmp_path}/absent.parquet",
                           *BASE[5:9]]
    assert dry_run(argv, print_config=False) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "steps per epoch: unknown (no training file here)" in out
    assert "epochs over the training set: unknown" in out


SEPARATE = ["trainer.v1.trainer_mode=gdro_separate_async", "trainer.v1.separate_async.parameter_sync_step=1"]
SEPARATE_OK = ["data.train_batch_size=128", "actor_rollout_ref.rollout.nnodes=1",
               "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("drop", "needle"),
    [
        ("data.train_batch_size=128", "train_batch_size must equal parameter_sync_step * ppo_mini_batch_size"),
        ("actor_rollout_ref.rollout.nnodes=1", "nnodes must be > 0"),
        ("actor_rollout_ref.rollout.checkpoint_engine.backend=nccl", "backend for separate async training"),
    ],
)
def test_separate_async_fails_in_the_dry_run_as_verl_would_after_ray(tmp_path: Path, capsys, drop: str,
                                                                      needle: str) -> None:
    """issue 32: the paper recipe in gdro_separate_async (256 prompts, mini-batch 128) passed the dry
    run and failed in verl's PPOTrainerSeparateAsync.__init__ after Ray started. The dry run runs
    verl's own checks; verl's real __init__ refuses the same config with the same assertion."""
    from test_recipes import recipe_argv
    from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync

    ok = recipe_argv(tmp_path, "prompt_gdro_qwen3_4b.sh", env={"DRY_RUN": "1"}, args=(*SEPARATE, *SEPARATE_OK))
    assert dry_run(ok[2:], print_config=False) == 0, capsys.readouterr().err
    assert "PPOTrainerSeparateAsync start-up checks" in capsys.readouterr().out
    argv = [a for a in ok[2:] if a != drop]
    assert dry_run(argv, print_config=False) == 2
    err = capsys.readouterr().err
    assert "trainer.v1.trainer_mode=gdro_separate_async" in err and needle in err, err
    with pytest.raises(AssertionError, match=needle.replace("*", r"\*")):
        PPOTrainerSeparateAsync(_composed(argv))  # fails at its first lines, before any worker
