"""The strategies (allocators, prompt modes, loss signals) are registered classes that declare the
keys they read, and nothing outside them names one (issue 37).

- the glue names no strategy: no ``isinstance`` on a strategy class and no comparison with a
  strategy's name in the controller, ``verl_gdro/integration/`` and the dry run;
- docs/configuration.md's table of the keys each strategy reads is the strategies' declarations;
- ``keys_read`` and the refusal of an unread key follow from those declarations.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from verl_gdro.allocators import ALLOCATOR_REGISTRY, RolloutGDRO, get_allocator
from verl_gdro.prompt_modes import PROMPT_MODE_REGISTRY, get_prompt_mode
from verl_gdro.signals import LOSS_SIGNAL_REGISTRY, get_loss_signal
from verl_gdro.step.config import default_gdro_group, keys_read, resolve_gdro

ROOT = Path(__file__).resolve().parents[1]
#: where no strategy may be named (the strategies' own modules and the registries may)
GLUE = [ROOT / "verl_gdro/step/controller.py", ROOT / "verl_gdro/dryrun.py",
        *sorted((ROOT / "verl_gdro/integration").glob("*.py"))]
_STRATEGY_CLASSES = "|".join(
    sorted({c.__name__ for reg in (ALLOCATOR_REGISTRY, PROMPT_MODE_REGISTRY, LOSS_SIGNAL_REGISTRY) for c in reg.values()}
           | {"RolloutGDRO", "ReleaseAsRunAllocator", "PromptMode", "LossSignal"})
)
#: the settings fields that hold a strategy's name
_NAME_FIELDS = {"allocator", "arm_utility", "loss_signal", "selection"}


def _names_strategy(node: ast.expr) -> bool:
    """``x.allocator`` / ``loss_signal`` / ``x.prompt.mode`` (a field holding a strategy's name)."""
    if isinstance(node, ast.Attribute):
        if node.attr in _NAME_FIELDS:
            return True
        return node.attr == "mode" and isinstance(node.value, ast.Attribute) and node.value.attr == "prompt"
    return isinstance(node, ast.Name) and node.id in _NAME_FIELDS


def strategy_namings(text: str) -> list[str]:
    """The source of every comparison of a strategy's name and every ``isinstance`` on a strategy class in ``text``."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Compare) and any(_names_strategy(x) for x in (node.left, *node.comparators)):
            found.append(ast.unparse(node))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
              and len(node.args) == 2 and re.search(rf"\b({_STRATEGY_CLASSES})\b", ast.unparse(node.args[1]))):
            found.append(ast.unparse(node))
    return found


@pytest.mark.parametrize("path", GLUE, ids=[str(p.relative_to(ROOT)) for p in GLUE])
def test_the_glue_names_no_strategy(path: Path) -> None:
    found = strategy_namings(path.read_text(encoding="utf-8"))
    assert not found, f"{path.relative_to(ROOT)} names a strategy (use a capability it declares): {found}"


def test_the_check_catches_what_it_must() -> None:
    bad = ["r.allocator == 'per_prompt'", "settings.prompt.mode != 'reweight'",
           "loss_signal not in ('failure_rate',)", "isinstance(self.rollout, ReleaseAsRunAllocator)"]
    assert [strategy_namings(line) for line in bad] == [[line] for line in bad]
    assert not strategy_namings("ok = self.rollout is not None and self.rollout.prices_at_plan")
    assert not strategy_namings('raise ValueError(f"needs gdro.prompt.loss_signal in {names} (got {x!r})")')


def _documented_reads() -> dict[tuple[str, str], tuple[str, ...]]:
    text = (ROOT / "docs/configuration.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (prompt mode|loss signal|allocator) \| `gdro\.[a-z_.]+=(\w+)` \| (.*) \|$", text, re.M)
    return {(kind, name): tuple(re.findall(r"`([a-z_.]+)`", reads)) for kind, name, reads in rows}


def test_the_documented_reads_are_the_declarations() -> None:
    declared = {("prompt mode", n): c.reads for n, c in PROMPT_MODE_REGISTRY.items()}
    declared |= {("loss signal", n): c.reads for n, c in LOSS_SIGNAL_REGISTRY.items()}
    declared |= {("allocator", n): c.reads for n, c in ALLOCATOR_REGISTRY.items()}
    assert _documented_reads() == declared


def test_every_declared_key_exists() -> None:
    group = default_gdro_group()
    for reg in (ALLOCATOR_REGISTRY, PROMPT_MODE_REGISTRY, LOSS_SIGNAL_REGISTRY):
        for name, cls in reg.items():
            for key in cls.reads:
                section, leaf = key.split(".")
                assert leaf in group[section], f"{name} declares {key}, which is no gdro key"


def test_keys_read_follow_the_active_strategies() -> None:
    robust = keys_read(resolve_gdro({}))  # failure_weighted sampling, failure rate, per_prompt
    assert {"prompt.explore", "rollout.rate_decay", "rollout.arm_utility", "prompt.loss_signal"} <= robust
    assert not {"rollout.dual_lr", "rollout.eta", "rollout.selection", "prompt.min_ess", "prompt.kl_coef"} & robust
    paper = keys_read(resolve_gdro({"preset": "paper"}))  # reweight, surrogate_kl, bandit
    assert {"rollout.dual_lr", "rollout.selection", "prompt.kl_coef", "prompt.min_ess"} <= paper
    assert not {"prompt.explore", "rollout.rate_decay"} & paper
    assert keys_read(resolve_gdro({"enable": False})) == {"enable"}
    prompt_only = keys_read(resolve_gdro({"rollout": {"enable": False}}))
    assert not any(k.startswith("rollout.") and k != "rollout.enable" for k in prompt_only)


@pytest.mark.parametrize(("group", "key"), [
    ({"rollout": {"dual_lr": 0.1}}, "gdro.rollout.dual_lr"),
    ({"rollout": {"allocator": "neyman", "selection": "sample"}}, "gdro.rollout.selection"),
    ({"rollout": {"allocator": "release_as_run", "eta": 1.0}}, "gdro.rollout.eta"),
    ({"prompt": {"mode": "reweight", "revisit": 0.3}}, "gdro.prompt.revisit"),
    ({"prompt": {"mode": "greso", "band_width": 0.3}}, "gdro.prompt.band_width"),
    ({"prompt": {"mode": "resample", "weight_normalization": "raw"}}, "gdro.prompt.weight_normalization"),
])
def test_an_unread_key_is_refused_naming_it(group: dict, key: str) -> None:
    with pytest.raises(ValueError, match=rf"^{re.escape(key)}=\S+ is set but nothing reads it"):
        resolve_gdro(group)


def test_switched_off_sections_and_default_values_are_not_refused() -> None:
    resolve_gdro({"rollout": {"enable": False, "dual_lr": 0.1, "eta": 2.0}})
    resolve_gdro({"prompt": {"enable": False, "explore": 0.3}})
    resolve_gdro({"enable": False, "rollout": {"dual_lr": 0.1}})
    resolve_gdro({"rollout": {"dual_lr": 0.05, "selection": "auto"}})  # the default / the preset's value
    resolve_gdro({"rollout": {"allocator": "bandit", "dual_lr": 0.1}})  # read by the bandit
    resolved = resolve_gdro({"preset": "paper", "prompt": {"loss_signal": "failure_rate"}})
    assert resolve_gdro(resolved.to_dict()) == resolved  # a resolved group (every key given) resolves again


def test_registries_refuse_an_unknown_name_naming_the_key() -> None:
    for get, key in ((get_allocator, "gdro.rollout.allocator"), (get_prompt_mode, "gdro.prompt.mode"),
                     (get_loss_signal, "gdro.prompt.loss_signal")):
        with pytest.raises(ValueError, match=rf"^{re.escape(key)}='nope' is invalid: allowed values are"):
            get("nope")


def test_rollout_gdro_builds_the_registered_class() -> None:
    for name in ("bandit", "neyman", "per_prompt"):
        alloc = RolloutGDRO(4, allocator=name, arm_utility="failure_weighted")
        assert type(alloc) is get_allocator(name) and alloc.allocator == name
