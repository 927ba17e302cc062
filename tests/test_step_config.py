"""Every config check of ``validate_gdro_config`` refuses its invalid configuration, naming the key.

Each case starts from a valid GDRO-trainer config and changes one thing. The message must start
with the offending key, and must appear verbatim in ``docs/configuration.md`` (the catalogue), so
the documentation cannot drift from the code. Runs without verl, Ray or torch.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl_gdro.step.config import GDROSettings, resolve_gdro, validate_gdro_config

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"

BASE = {
    "algorithm": {"adv_estimator": "gdro_grpo", "use_kl_in_reward": False, "filter_groups": {"enable": False}},
    "trainer": {"use_v1": True, "v1": {"trainer_mode": "gdro_sync", "sync": {}, "sampler": {}}},
    "data": {"dataloader_num_workers": 0, "train_batch_size": 8},
    "actor_rollout_ref": {"rollout": {"n": 4}, "actor": {"use_kl_loss": False}},
    "gdro": {},
}

# (case id, dotlist overrides on BASE, key the message must start with)
CASES: list[tuple[str, list[str], str]] = [
    # --- the gdro group itself ---
    ("unknown key", ["gdro.prompt.etaa=1.0"], "gdro.prompt.etaa"),
    ("unknown top-level key", ["gdro.rollouts={}"], "gdro.rollouts"),
    ("group given a scalar", ["gdro.prompt=3"], "gdro.prompt"),
    ("unknown preset", ["gdro.preset=fast"], "gdro.preset"),
    ("enable not a bool", ["gdro.enable=enabled"], "gdro.enable"),
    ("unknown uid key", ["gdro.uid_key=id"], "gdro.uid_key"),
    ("empty acc key", ["gdro.acc_key=''"], "gdro.acc_key"),
    ("advantage clip not positive", ["gdro.advantage_clip=0"], "gdro.advantage_clip"),
    ("num_bins < 1", ["gdro.classifier.num_bins=0"], "gdro.classifier.num_bins"),
    ("bins and edges disagree", ["gdro.classifier.num_bins=10", "gdro.classifier.bin_edges=[0.2,0.4,0.6,0.8,0.9]"],
     "gdro.classifier.num_bins"),
    ("edges not increasing", ["gdro.classifier.num_bins=null", "gdro.classifier.bin_edges=[0.5,0.3]"],
     "gdro.classifier.bin_edges"),
    ("edge outside (0, 1)", ["gdro.classifier.num_bins=null", "gdro.classifier.bin_edges=[0.5,1.0]"],
     "gdro.classifier.bin_edges[1]"),
    ("empty edges", ["gdro.classifier.bin_edges=[]"], "gdro.classifier.bin_edges"),
    ("window < 1", ["gdro.classifier.window=0"], "gdro.classifier.window"),
    ("k < 1", ["gdro.classifier.k=0"], "gdro.classifier.k"),
    ("hysteresis too large", ["gdro.classifier.hysteresis=0.1"], "gdro.classifier.hysteresis"),
    ("hysteresis too large for custom edges",
     ["gdro.classifier.num_bins=null", "gdro.classifier.bin_edges=[0.1,0.15,0.5]", "gdro.classifier.hysteresis=0.06"],
     "gdro.classifier.hysteresis"),
    ("negative hysteresis", ["gdro.classifier.hysteresis=-0.01"], "gdro.classifier.hysteresis"),
    ("unknown pass@k estimator", ["gdro.classifier.passk_estimator=mean"], "gdro.classifier.passk_estimator"),
    ("unseen bin out of range", ["gdro.classifier.unseen_bin=10"], "gdro.classifier.unseen_bin"),
    ("prompt enable not a bool", ["gdro.prompt.enable=1"], "gdro.prompt.enable"),
    ("unknown prompt mode", ["gdro.prompt.mode=reorder"], "gdro.prompt.mode"),
    ("ESS floor out of range", ["gdro.prompt.min_ess=1.0"], "gdro.prompt.min_ess"),
    ("ESS floor with raw weights", ["gdro.prompt.min_ess=0.5", "gdro.prompt.weight_normalization=raw"],
     "gdro.prompt.min_ess"),
    ("per-prompt allocator with a played-arm utility",
     ["gdro.rollout.allocator=per_prompt", "gdro.rollout.arm_utility=informative"], "gdro.rollout.arm_utility"),
    ("unknown loss signal", ["gdro.prompt.loss_signal=kl"], "gdro.prompt.loss_signal"),
    ("release multipliers with an ESS floor", ["gdro.preset=release", "gdro.prompt.min_ess=0.5"],
     "gdro.prompt.score_clip"),
    ("prompt eta <= 0", ["gdro.prompt.eta=0"], "gdro.prompt.eta"),
    ("eta * score_clip overflows", ["gdro.prompt.eta=100", "gdro.prompt.score_clip=10"], "gdro.prompt.eta"),
    ("beta out of (0, 1]", ["gdro.prompt.beta=1.5"], "gdro.prompt.beta"),
    ("prompt gamma out of [0, 1)", ["gdro.prompt.gamma=1.0"], "gdro.prompt.gamma"),
    ("max_weight <= 0", ["gdro.prompt.max_weight=0"], "gdro.prompt.max_weight"),
    ("score_clip <= 0", ["gdro.prompt.score_clip=-1"], "gdro.prompt.score_clip"),
    ("normalize_by_share not a bool", ["gdro.prompt.normalize_by_share=maybe"], "gdro.prompt.normalize_by_share"),
    ("share_floor out of (0, 1]", ["gdro.prompt.share_floor=0"], "gdro.prompt.share_floor"),
    ("unknown weight normalization", ["gdro.prompt.weight_normalization=sum_one"],
     "gdro.prompt.weight_normalization"),
    ("negative kl_coef", ["gdro.prompt.kl_coef=-0.1"], "gdro.prompt.kl_coef"),
    ("clip_ratio_low out of [0, 1)", ["gdro.prompt.clip_ratio_low=1.0"], "gdro.prompt.clip_ratio_low"),
    ("negative clip_ratio_high", ["gdro.prompt.clip_ratio_high=-0.2"], "gdro.prompt.clip_ratio_high"),
    ("threshold not a number", ["gdro.correct_threshold=high"], "gdro.correct_threshold"),
    ("rollout enable not a bool", ["gdro.rollout.enable=on_demand"], "gdro.rollout.enable"),
    ("n_min < 2", ["gdro.rollout.n_min=1"], "gdro.rollout.n_min"),
    ("n_max < n_min", ["gdro.rollout.n_min=6", "gdro.rollout.n_max=4"], "gdro.rollout.n_max"),
    ("n_min not an integer", ["gdro.rollout.n_min=2.5"], "gdro.rollout.n_min"),
    ("rollout eta <= 0", ["gdro.rollout.eta=-1"], "gdro.rollout.eta"),
    ("rollout gamma out of [0, 1)", ["gdro.rollout.gamma=-0.1"], "gdro.rollout.gamma"),
    ("score_ema out of (0, 1]", ["gdro.rollout.score_ema=0"], "gdro.rollout.score_ema"),
    ("negative dual_lr", ["gdro.rollout.dual_lr=-0.05"], "gdro.rollout.dual_lr"),
    ("unknown allocator", ["gdro.rollout.allocator=greedy"], "gdro.rollout.allocator"),
    ("unknown arm utility", ["gdro.rollout.arm_utility=reward"], "gdro.rollout.arm_utility"),
    ("unknown selection", ["gdro.rollout.selection=argmax"], "gdro.rollout.selection"),
    ("negative seed", ["gdro.rollout.seed=-1"], "gdro.rollout.seed"),
    # --- the gdro group against verl's keys ---
    ("estimator/trainer mismatch", ["algorithm.adv_estimator=grpo"], "algorithm.adv_estimator"),
    ("legacy trainer", ["trainer.use_v1=false"], "trainer.use_v1"),
    ("dataloader workers > 0", ["data.dataloader_num_workers=4"], "data.dataloader_num_workers"),
    ("several local updates per step", ["trainer.v1.sync.parameter_sync_step=2"],
     "trainer.v1.sync.parameter_sync_step"),
    ("rollout.n < 2", ["actor_rollout_ref.rollout.n=1"], "actor_rollout_ref.rollout.n"),
    ("rollout.n < 2 for the standalone estimator",
     ["trainer.v1.trainer_mode=sync", "~gdro", "actor_rollout_ref.rollout.n=1"],
     "actor_rollout_ref.rollout.n"),
    ("budget below n_min", ["gdro.rollout.enable=true", "gdro.rollout.n_min=6"], "actor_rollout_ref.rollout.n"),
    ("budget above n_max", ["gdro.rollout.enable=true", "gdro.rollout.n_max=3", "gdro.rollout.n_min=2"],
     "actor_rollout_ref.rollout.n"),
    ("Rollout-GDRO without the GDRO trainer",
     ["trainer.v1.trainer_mode=sync", "~gdro", "algorithm.gdro.rollout.enable=true"], "algorithm.gdro.rollout.enable"),
    ("several local updates per step, async", ["trainer.v1.trainer_mode=gdro_colocate_async",
                                                "trainer.v1.colocate_async.parameter_sync_step=2"],
     "trainer.v1.colocate_async.parameter_sync_step"),
    ("custom replay buffer", ["trainer.v1.sampler.custom_sampler.path=my.py",
                              "trainer.v1.sampler.custom_sampler.name=MyBuffer"],
     "trainer.v1.sampler.custom_sampler.path"),
    ("rollout skip", ["skip.rollout_tq.enable=true"], "skip.rollout_tq.enable"),
    ("estimator/trainer mismatch, async", ["trainer.v1.trainer_mode=gdro_separate_async", "algorithm.adv_estimator=grpo"],
     "algorithm.adv_estimator"),
    ("a sampling mode without the GDRO trainer",
     ["trainer.v1.trainer_mode=sync", "~gdro", "algorithm.gdro.prompt.mode=resample"], "algorithm.gdro.prompt.mode"),
    # --- one namespace per path (issue 32): the GDRO trainer reads gdro, the estimator alone algorithm.gdro ---
    ("a gdro group without the GDRO trainer", ["trainer.v1.trainer_mode=sync"], "gdro"),
    ("algorithm.gdro alone under the GDRO trainer", ["~gdro", "algorithm.gdro.prompt.eta=0.3"], "algorithm.gdro"),
    ("estimator key out of range", ["trainer.v1.trainer_mode=sync", "~gdro", "algorithm.gdro.prompt.eta=0"],
     "algorithm.gdro.prompt.eta"),
    ("surrogate_kl without a reference policy", ["gdro.preset=paper"], "gdro.prompt.loss_signal"),
    ("row_index ids without the GDRO dataset", ["gdro.uid_key=row_index"], "gdro.uid_key"),
    ("algorithm.gdro disagrees with gdro", ["algorithm.gdro.prompt.eta=0.3"], "algorithm.gdro"),
    ("loss signal clip disagrees with the actor", ["gdro.preset=paper", "actor_rollout_ref.actor.use_kl_loss=true",
                                                   "actor_rollout_ref.actor.clip_ratio_high=0.2",
                                                   "gdro.prompt.clip_ratio_high=0.28"],
     "gdro.prompt.clip_ratio_high"),
    # --- a key no active strategy reads (issue 37: derived from the strategies' declarations) ---
    ("a bandit key under the per-prompt allocator", ["gdro.rollout.dual_lr=0.1"], "gdro.rollout.dual_lr"),
    ("a sampling key under reweighting", ["gdro.prompt.mode=reweight", "gdro.prompt.explore=0.3"], "gdro.prompt.explore"),
]


def config(overrides: list[str]) -> object:
    """BASE with dotlist overrides; ``~gdro`` removes the top-level group (Hydra's delete syntax)."""
    base = {k: v for k, v in BASE.items() if not (k == "gdro" and "~gdro" in overrides)}
    return OmegaConf.merge(OmegaConf.create(base), OmegaConf.from_dotlist([o for o in overrides if o != "~gdro"]))


def refusal(overrides: list[str]) -> str:
    with pytest.raises(ValueError) as info:
        validate_gdro_config(config(overrides))
    return str(info.value)


def test_base_config_is_valid() -> None:
    settings = validate_gdro_config(config([]))
    assert isinstance(settings, GDROSettings) and settings.enable
    assert settings.prompt.loss_signal == "failure_rate"  # preset robust


def test_at_least_fifteen_invalid_configurations() -> None:
    assert len(CASES) >= 15


@pytest.mark.parametrize(("case", "overrides", "key"), CASES, ids=[c[0] for c in CASES])
def test_invalid_config_is_refused_naming_its_key(case: str, overrides: list[str], key: str) -> None:
    message = refusal(overrides)
    assert re.match(re.escape(key) + r"[= \[]", message), message
    assert message in DOC.read_text(encoding="utf-8"), f"docs/configuration.md lacks the message: {message}"


def test_valid_variations_pass() -> None:
    ok = [
        ["gdro.rollout.enable=true"],
        ["gdro.rollout.enable=true", "gdro.prompt.enable=false"],
        ["gdro.rollout.enable=true", "gdro.prompt.mode=resample"],  # joint mode with resampling
        ["gdro.classifier.num_bins=null", "gdro.classifier.bin_edges=[0.2,0.5,0.8]"],
        ["gdro.classifier.num_bins=4", "gdro.classifier.bin_edges=[0.2,0.5,0.8]"],
        ["gdro.preset=paper", "actor_rollout_ref.actor.use_kl_loss=true"],
        ["gdro.uid_key=row_index", "data.custom_cls.path=pkg://verl_gdro.integration.dataset",
         "data.custom_cls.name=GDRODataset"],
        ["trainer.v1.trainer_mode=sync", "~gdro"],  # the estimator alone
        ["trainer.v1.trainer_mode=sync", "~gdro", "algorithm.gdro.prompt.eta=0.3"],  # ... with its own keys
        # all off: nothing checked
        ["trainer.v1.trainer_mode=sync", "~gdro", "algorithm.gdro.enable=false", "algorithm.gdro.rollout.enable=true"],
        ["algorithm.gdro.prompt.eta=0.65"],  # equal to gdro: fine
        # issue 12: Rollout-GDRO with DAPO filtering / refilled failures (exact budget per generation call)
        ["gdro.rollout.enable=true", "algorithm.filter_groups.enable=true"],
        ["gdro.rollout.enable=true", "trainer.v1.sampler.sync_refill_failed_groups=true"],
        # the async GDRO trainers, with both adversaries and with resampling
        ["trainer.v1.trainer_mode=gdro_colocate_async", "gdro.rollout.enable=true"],
        ["trainer.v1.trainer_mode=gdro_separate_async", "gdro.rollout.enable=true", "gdro.prompt.mode=resample"],
        ["trainer.v1.trainer_mode=gdro_colocate_async", "trainer.v1.sync.parameter_sync_step=2"],  # other mode's key
    ]
    for overrides in ok:
        validate_gdro_config(config(overrides))


def test_presets_fill_only_null_keys() -> None:
    paper = resolve_gdro({"preset": "paper"})
    assert (paper.prompt.loss_signal, paper.rollout.arm_utility, paper.rollout.selection) == (
        "surrogate_kl", "loss", "map")
    mixed = resolve_gdro({"preset": "paper", "prompt": {"loss_signal": "failure_rate"}})
    assert mixed.prompt.loss_signal == "failure_rate" and mixed.rollout.arm_utility == "loss"


def test_robust_rollout_is_the_decided_per_prompt_arm_and_paper_keeps_the_bandit() -> None:
    """Issue 22's rule chose per-prompt failure-weighted allocation with decayed evidence for
    ``robust``; ``paper`` keeps the bandit. The decay belongs to the per-prompt allocator: a robust
    run switched to the bandit drops it instead of failing on it, while an explicit decay is kept."""
    r = resolve_gdro({}).rollout
    assert (r.allocator, r.arm_utility, r.selection, r.rate_decay) == ("per_prompt", "failure_weighted", "auto", 0.5)
    p = resolve_gdro({"preset": "paper"}).rollout
    assert (p.allocator, p.arm_utility, p.rate_decay) == ("bandit", "loss", None)
    b = resolve_gdro({"rollout": {"allocator": "bandit"}}).rollout
    assert (b.allocator, b.arm_utility, b.rate_decay) == ("bandit", "failure_weighted", None)
    w = resolve_gdro({"rollout": {"rate_decay": 1.0}}).rollout
    assert (w.allocator, w.rate_decay) == ("per_prompt", 1.0)  # 1.0: the classifier's whole window
    with pytest.raises(ValueError, match=r"^gdro\.rollout\.rate_decay=0\.5 is invalid with gdro\.rollout\.allocator='bandit'"):
        resolve_gdro({"rollout": {"allocator": "bandit", "rate_decay": 0.5}})


def test_num_bins_is_derived_from_edges() -> None:
    s = resolve_gdro({"classifier": {"num_bins": None, "bin_edges": [0.1, 0.2, 0.3, 0.5, 0.7]}})
    assert s.num_bins == 6  # the released patch's "6 bins" edges gave 7 bins (docs/algorithm.md, "Defects of the released patch")
    assert s.classifier.kwargs()["bin_edges"] == [0.1, 0.2, 0.3, 0.5, 0.7]


def test_settings_build_the_controllers() -> None:
    from verl_gdro.step.controller import GDROController

    s = resolve_gdro({"rollout": {"enable": True, "n_min": 3, "n_max": 8}, "prompt": {"eta": 0.4}})
    ctrl = GDROController(s, rollout_n=5)
    assert ctrl.prompt is not None and ctrl.prompt.eta == 0.4
    assert ctrl.rollout is not None and (ctrl.rollout.n_min, ctrl.rollout.n_max, ctrl.rollout.n_mean) == (3, 8, 5)


def test_importable_without_verl_ray_or_torch() -> None:
    code = (
        "import sys\n"
        "from verl_gdro.step.config import validate_gdro_config\n"
        "from verl_gdro.step.controller import GDROController\n"
        "from verl_gdro.step.context import gdro_step\n"
        "bad = [m for m in ('verl', 'ray', 'torch') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_loss_signals_follow_the_actor() -> None:
    """Unset, the signals' coefficients are the actor's (verl's clip_ratio fallback included); set,
    they must equal it, except where the signal does not read them (failure_rate)."""
    actor = ["actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.01",
             "actor_rollout_ref.actor.clip_ratio=0.25", "actor_rollout_ref.actor.clip_ratio_c=2.5"]
    p = validate_gdro_config(config(["gdro.preset=paper", *actor])).prompt
    assert (p.kl_coef, p.clip_ratio_low, p.clip_ratio_high, p.clip_ratio_c) == (0.01, 0.25, 0.25, 2.5)
    same = validate_gdro_config(config(["gdro.preset=paper", *actor, "gdro.prompt.clip_ratio_c=2.5"])).prompt
    assert same.clip_ratio_c == 2.5
    message = refusal(["gdro.preset=paper", *actor, "gdro.prompt.kl_coef=0.001"])
    assert "actor_rollout_ref.actor.kl_loss_coef=0.01" in message
    # the failure rate reads none of them: an explicit value is refused as unread, naming the key
    message = refusal([*actor, "gdro.prompt.clip_ratio_high=0.4"])
    assert message.startswith("gdro.prompt.clip_ratio_high=0.4 is set but nothing reads it"), message
    # no actor in the config (the step API): the paper's values
    bare = resolve_gdro({"preset": "paper"}).prompt
    assert (bare.kl_coef, bare.clip_ratio_low, bare.clip_ratio_high, bare.clip_ratio_c) == (0.001, 0.2, 0.28, 3.0)
