"""A path refuses every ``gdro`` key it does not read (issue 36, item 1).

Every key of the package YAML's ``gdro`` group x {the estimator alone, the GDRO trainer}: the key
is read (its value reaches what the path runs: for the estimator alone, its advantages over a few
steps change), or the path refuses it with a one-line error naming it. What the estimator alone
reads is one declaration, :data:`verl_gdro.integration.estimator_keys.ESTIMATOR_READS`, used by
the estimator, the driver check and the dry run alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from test_dryrun_paths import VALUES, _leaves

from verl_gdro.integration import estimator as est
from verl_gdro.integration.estimator_keys import ESTIMATOR_READS, estimator_path_settings, honoured_group
from verl_gdro.step.config import default_gdro_group, nest, resolve_gdro, validate_gdro_config

ALL_KEYS = sorted(_leaves(default_gdro_group()))

#: keys whose only valid value on the estimator's path is the default (anything else is refused
#: with its own message): read as a constraint, not as a setting
CONSTRAINED = {"prompt.mode": ("resample", "prompt.mode=resample is invalid"),
               "rollout.enable": (True, "rollout.enable=True is invalid")}

#: a value that changes the estimator's advantages on the rewards below (VALUES' value otherwise)
BINDING: dict[str, Any] = {
    "preset": "release",
    "correct_threshold": 0.5,
    "advantage_clip": 0.5,
    "prompt.max_weight": 1.2,
    "prompt.score_clip": 0.05,
    "prompt.share_floor": 0.3,
    "prompt.eta": 3.0,
    "prompt.gamma": 0.5,
}
#: what a key needs beside it on the estimator's path
BESIDE: dict[str, dict[str, Any]] = {"prompt.mix_support": {"prompt.min_ess": 0.0},
                                     "prompt.weight_normalization": {"prompt.min_ess": 0.0}}


def _value(key: str) -> Any:
    import yaml

    return BINDING.get(key, yaml.safe_load(VALUES[key]))


def _estimator_config(group: dict[str, Any]) -> dict[str, Any]:
    return {
        "algorithm": {"adv_estimator": "gdro_grpo", "gdro": group},
        "actor_rollout_ref": {"rollout": {"n": 4}},
        "trainer": {"v1": {"trainer_mode": "sync"}},
    }


def _advantages(group: dict[str, Any], steps: int = 4) -> list[torch.Tensor]:
    """The standalone estimator's advantages over ``steps`` steps of fixed random rewards."""
    est.reset_standalone()
    rng = np.random.default_rng(0)
    out = []
    for _ in range(steps):
        groups, n, length = 16, 4, 3
        rewards = torch.zeros(groups * n, length, dtype=torch.float64)
        difficulty = rng.uniform(0, 1, size=groups).repeat(n)
        rewards[:, -1] = torch.as_tensor(rng.uniform(0, 1, size=groups * n) < difficulty, dtype=torch.float64)
        rewards[:, -1] += torch.as_tensor(rng.uniform(-0.45, 0.45, size=groups * n))
        index = np.array([f"u{i}" for i in range(groups)]).repeat(n)
        adv, _ = est.compute_gdro_grpo_advantage(
            token_level_rewards=rewards, response_mask=torch.ones_like(rewards), index=index, config={"gdro": group}
        )
        out.append(adv)
    return out


def test_the_declaration_covers_known_keys_only() -> None:
    assert set(ESTIMATOR_READS) <= set(ALL_KEYS)
    assert {"classifier.window", "prompt.loss_signal", "acc_key", "uid_key"}.isdisjoint(ESTIMATOR_READS)


@pytest.mark.parametrize("key", ALL_KEYS)
def test_estimator_alone_reads_or_refuses(key: str) -> None:
    """The estimator alone: a key it reads changes its advantages; any other is refused by the
    driver/dry-run check (validate + estimator_path_settings) and by the estimator itself."""
    if key in CONSTRAINED:
        value, message = CONSTRAINED[key]
        with pytest.raises(ValueError, match=f"algorithm.gdro.{message}"):
            validate_gdro_config(_estimator_config(nest({key: value})))  # the driver and the dry run
        with pytest.raises(ValueError, match=f"algorithm.gdro.{message}"):
            _advantages(nest({key: value}), steps=1)  # the estimator at its first step
        return
    group = nest({key: _value(key), **BESIDE.get(key, {})})
    if key in ESTIMATOR_READS:
        validate_gdro_config(_estimator_config(group))
        base = _advantages(nest(BESIDE.get(key, {})))
        changed = _advantages(group)
        assert any(not torch.equal(a, b) for a, b in zip(base, changed)), f"{key} is declared read but changes nothing"
        return
    message = f"algorithm.gdro.{key} is invalid for the gdro_grpo estimator alone: it does not read it"
    with pytest.raises(ValueError, match=message):
        estimator_path_settings(_estimator_config(group)["algorithm"])
    with pytest.raises(ValueError, match=message):
        est._settings_from({"gdro": group}, standalone=True)


@pytest.mark.parametrize("key", ALL_KEYS)
def test_gdro_trainer_reads_or_refuses(key: str) -> None:
    """The GDRO trainer: a key's value reaches the settings it runs with, or is refused naming it."""
    value = _value(key)
    cfg = {
        "algorithm": {"adv_estimator": "gdro_grpo"},
        "actor_rollout_ref": {"rollout": {"n": 4}, "actor": {"use_kl_loss": True}},
        "trainer": {"v1": {"trainer_mode": "gdro_sync"}},
        "data": {"dataloader_num_workers": 0, "custom_cls": {"path": "pkg://verl_gdro.integration.dataset"}},
        "gdro": nest({key: value, **BESIDE.get(key, {})}),
    }
    try:
        settings = validate_gdro_config(cfg)
    except ValueError as e:
        assert f"gdro.{key}" in str(e), str(e)
        return
    assert settings != validate_gdro_config({**cfg, "gdro": nest(BESIDE.get(key, {}))}) or key == "prompt.mode"


def test_paper_preset_on_the_estimator_alone_reports_the_signal_it_runs() -> None:
    """``preset=paper`` names surrogate_kl, which needs the GDRO trainer: the estimator alone runs
    (and reports) the failure rate."""
    settings = estimator_path_settings({"gdro": {"preset": "paper"}})
    assert settings.prompt.loss_signal == "failure_rate"
    assert resolve_gdro({"preset": "paper"}).prompt.loss_signal == "surrogate_kl"


def test_the_logged_group_resolves_to_the_same_settings() -> None:
    """The driver replaces ``algorithm.gdro`` with the keys the path reads; the estimator resolves
    that group at run time to the very settings the driver checked (no refusal, no drift)."""
    for preset in ("robust", "paper", "release"):
        settings = estimator_path_settings({"gdro": {"preset": preset, "prompt": {"eta": 0.3}}})
        logged = honoured_group(settings)
        assert sorted(_leaves(logged)) == sorted(ESTIMATOR_READS)
        assert estimator_path_settings({"gdro": logged}) == settings
