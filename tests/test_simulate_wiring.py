"""`verl-gdro simulate` runs what the trainer runs: its controllers come from the step API's
``GDROController.from_config`` with the package config's defaults and the preset's choices
(docs/algorithm.md, "Presets"), never from a hand-built subset of them."""

from __future__ import annotations

from importlib import resources

import pytest
import yaml

from verl_gdro.demo.config import method_gdro_group as demo_method_group
from verl_gdro.presets import PRESETS
from verl_gdro.simulate import METHODS, SimConfig, build_controller, method_gdro_group
from verl_gdro.step.config import resolve_gdro


def _trainer_group(preset: str, prompt: bool, rollout: bool, seed: int) -> dict:
    """The trainer's ``gdro`` group: the packaged gdro_trainer.yaml with the mode's overrides."""
    text = resources.files("verl_gdro.config").joinpath("gdro_trainer.yaml").read_text(encoding="utf-8")
    group = yaml.safe_load(text)["gdro"]
    group["preset"] = preset
    group["prompt"]["enable"] = prompt
    group["rollout"]["enable"] = rollout
    group["rollout"]["seed"] = seed
    return group


@pytest.mark.parametrize("method", METHODS)
def test_simulate_builds_the_trainers_controller(method: str) -> None:
    cfg = SimConfig(seed=3)
    ctrl = build_controller(method, cfg)
    preset = "paper" if method.endswith("_paper") else "robust"
    prompt_on, rollout_on = method.startswith("prompt_gdro"), method.startswith("rollout_gdro")
    expected = resolve_gdro(_trainer_group(preset, prompt_on, rollout_on, cfg.seed))
    assert ctrl.settings == expected
    assert ctrl.rollout_n == cfg.n_mean
    assert (ctrl.prompt is not None) == prompt_on and (ctrl.rollout is not None) == rollout_on
    # every key the preset decides reaches the controller objects
    if ctrl.rollout is not None:
        for key in ("allocator", "arm_utility"):
            assert getattr(ctrl.rollout, key) == PRESETS[preset]["rollout"][key]
        assert ctrl.settings.rollout.rate_decay == PRESETS[preset]["rollout"]["rate_decay"]
    if ctrl.prompt is not None:
        assert ctrl.settings.prompt.loss_signal == PRESETS[preset]["prompt"]["loss_signal"]


@pytest.mark.parametrize("method", METHODS)
def test_simulate_and_demo_configure_a_method_alike(method: str) -> None:
    assert resolve_gdro(method_gdro_group(method, seed=5)) == resolve_gdro(demo_method_group(method, seed=5))


def test_unknown_method_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown method"):
        method_gdro_group("dapo")
