"""The default-decision rule: qualification, ranking, confirmation and the CLI's one-line errors."""

from __future__ import annotations

import json

import pytest

from verl_gdro.cli import main as cli_main
from verl_gdro.demo.decide import decide, markdown
from verl_gdro.errors import UsageError


def _p(mean: float, lo: float | None, hi: float | None) -> dict:
    return {"mean": mean, "ci95": [lo, hi]}


def _summary(task: str, arms: dict[str, tuple], seeds: int = 8) -> dict:
    """arms: label -> (worst mean, worst lo, worst hi, mean@8 mean, mean@8 lo, mean@8 hi)."""
    methods = {"grpo": {"spec": "grpo"}, **{a: {"spec": f"rollout_gdro:{a}"} for a in arms}}
    paired = {
        a: {"worst_level_acc": _p(w, wl, wh), "mean@8": _p(m, ml, mh)} for a, (w, wl, wh, m, ml, mh) in arms.items()
    }
    return {"task": task, "num_seeds": seeds, "methods": methods, "paired": paired}


DEV = _summary(
    "missing",
    {
        "a_big": (0.05, 0.01, 0.09, 0.00, -0.010, 0.01),  # worst gain largest but mean@8 interval reaches -0.01
        "b_good": (0.04, 0.01, 0.07, 0.01, -0.004, 0.02),  # qualifies, ranked first
        "c_ok": (0.02, 0.005, 0.04, 0.00, 0.000, 0.01),  # qualifies, second
        "d_zero": (0.03, -0.01, 0.07, 0.02, 0.010, 0.03),  # worst interval reaches 0
    },
)


def test_qualification_and_ranking():
    d = decide(DEV, {})
    assert [a.label for a in d.arms] == ["b_good", "c_ok", "a_big", "d_zero"]
    reasons = {a.label: a.why for a in d.arms}
    assert reasons["a_big"].startswith("mean@8 interval reaches")
    assert reasons["d_zero"] == "worst-level interval reaches 0"
    # no confirmation task given: the rule is not done
    assert d.chosen is None and d.status == "pending"
    assert "`b_good` qualifies but has not been run" in markdown(d)
    # the candidates can be restricted; an unknown label names --arms
    assert [a.label for a in decide(DEV, {}, ["c_ok", "d_zero"]).arms] == ["c_ok", "d_zero"]
    with pytest.raises(UsageError, match="--arms"):
        decide(DEV, {}, ["nope"])


def test_confirmation_loss_passes_to_the_next_arm():
    add = _summary("add", {"b_good": (0, 0, 0, -0.011, 0, 0), "c_ok": (0, 0, 0, -0.010, 0, 0)}, seeds=5)
    sort = _summary("sort", {"b_good": (0, 0, 0, 0.02, 0, 0), "c_ok": (0, 0, 0, 0.0, 0, 0)}, seeds=5)
    d = decide(DEV, {"add": add, "sort": sort})
    assert d.chosen == "c_ok"  # b_good lost 0.011 > 0.01 on add; c_ok lost exactly 0.01
    text = markdown(d)
    assert "**Chosen: `c_ok`**" in text and "-0.011" in text


def test_unconfirmed_best_arm_leaves_the_decision_pending():
    add = _summary("add", {"c_ok": (0, 0, 0, 0.0, 0, 0)}, seeds=5)
    d = decide(DEV, {"add": add})
    assert d.chosen is None and d.status == "pending"  # b_good ranks above c_ok and was not run on add


def test_no_qualifying_arm_keeps_the_default():
    few = _summary("missing", {"x": (0.05, None, None, 0.01, None, None)}, seeds=2)
    d = decide(few, {})
    assert d.chosen is None and d.status == "default stays"
    assert d.arms[0].why == "too few seeds for intervals"
    assert "the default stays" in markdown(d)


def test_cli_reads_run_directories_and_names_bad_paths(tmp_path, capsys):
    dev, add = tmp_path / "dev", tmp_path / "add"
    dev.mkdir()
    add.mkdir()
    (dev / "results.json").write_text(json.dumps(DEV))
    (add / "results.json").write_text(json.dumps(_summary("add", {"b_good": (0, 0, 0, 0.0, 0, 0)}, seeds=5)))
    assert cli_main(["decide", str(dev), "--confirm", str(add)]) == 0
    assert "**Chosen: `b_good`**" in capsys.readouterr().out
    assert cli_main(["decide", str(tmp_path / "nowhere")]) == 2
    assert "dev" in capsys.readouterr().err
    assert cli_main(["decide", str(dev), "--confirm", str(dev)]) == 2
    assert "--confirm" in capsys.readouterr().err


@pytest.mark.parametrize("lo", [0.0, -0.001])
def test_worst_interval_touching_zero_does_not_qualify(lo):
    d = decide(_summary("missing", {"x": (0.02, lo, 0.05, 0.01, 0.0, 0.02)}), {})
    assert not d.arms[0].qualifies and d.status == "default stays"


def _sat(figures: dict[str, tuple[float | None, ...]]) -> dict:
    """A saturating study: label -> per-seed mean@8 shares (None: never) with hardest level 0.5."""
    paired = {}
    for label, shares in figures.items():
        counted = [float("inf") if x is None else x for x in shares]
        reached = [x for x in shares if x is not None]
        every = len(reached) == len(shares)
        fig = {
            "per_seed": ["never" if x is None else x for x in shares],
            "median": float(sorted(reached)[len(reached) // 2]) if every else None,
            "median_interpolated": None,
            "rank_value": float(sorted(counted)[len(counted) // 2]),
        }
        hard = {"per_seed": [0.5] * len(shares), "median": 0.5, "median_interpolated": None, "rank_value": 0.5}
        paired[label] = {"compute_to_grpo_final": {"mean@8": fig, "hardest_level_acc": hard}}
    return {"task": "missing_long", "paired": paired}


def test_saturating_compute_figure_ranks_the_qualified_arms():
    sat = _sat({"b_good": (0.9, 0.9, None), "c_ok": (0.7, 0.7, 0.7), "a_big": (0.1, 0.1, 0.1)})
    add = _summary("add", {"b_good": (0, 0, 0, 0.0, 0, 0), "c_ok": (0, 0, 0, 0.0, 0, 0)}, seeds=5)
    d = decide(DEV, {"add": add}, saturating=sat)
    # a_big is fastest but does not qualify; c_ok needs less compute than b_good (whose median is 0.9)
    assert [a.label for a in d.arms][:2] == ["c_ok", "b_good"]
    assert d.chosen == "c_ok"
    text = markdown(d)
    assert "ranked by the mean@8 compute figure on `missing_long`" in text
    assert "**met** (mean@8 0.70, hardest level 0.50)" in text


def test_never_reaching_ranks_above_one_and_ties_go_to_the_worst_level_gain():
    sat = _sat({"b_good": (None, None, 0.5), "c_ok": (None, None, 0.5)})
    d = decide(DEV, {}, saturating=sat)
    assert d.arms[0].rank_value == float("inf") and [a.label for a in d.arms][:2] == ["b_good", "c_ok"]
    sat = _sat({"b_good": (0.8, 0.8, 0.8), "c_ok": (0.8, 0.8, 0.8)})
    assert [a.label for a in decide(DEV, {}, saturating=sat).arms][:2] == ["b_good", "c_ok"]  # tie: worst gain


def _dapo_table(task: str, arms: dict[str, tuple], to_final: dict[str, list] | None = None, seeds: int = 8) -> dict:
    """A study with DAPO's table: label -> (filter, hardest mean, lo, hi, mean@8 mean, lo, hi)."""
    rows: dict = {"dapo": {"filter": True}}
    for label, (filt, h, hl, hh, m, ml, mh) in arms.items():
        shares = (to_final or {}).get(label, [1.0] * 3)
        rank = sorted(float("inf") if x is None else x for x in shares)[len(shares) // 2]  # 3 seeds: the middle
        fig = {"per_seed": shares, "median": None, "median_interpolated": None, "rank_value": rank}
        rows[label] = {
            "filter": filt,
            "paired": {"hardest_level_acc": _p(h, hl, hh), "mean@8": _p(m, ml, mh)},
            "to_dapo_final": {"mean@8": fig, "hardest_level_acc": fig},
        }
    methods = {"dapo": {"spec": "grpo:dynamic_sampling=true"}, **{a: {"spec": f"joint:{a}"} for a in arms}}
    return {"task": task, "num_seeds": seeds, "methods": methods, "paired": {},
            "dynamic_sampling": {"base": "dapo", "arms": rows}}


def test_the_rule_against_dapo_reads_the_filter_arms_of_dapos_table(tmp_path, capsys):
    dev = _dapo_table("missing", {
        "nofilter": (False, 0.2, 0.1, 0.3, 0.1, 0.05, 0.15),  # better still, but not a configuration under the filter
        "f_good": (True, 0.03, 0.02, 0.04, 0.012, 0.004, 0.019),
        "f_zero": (True, 0.03, 0.0, 0.06, 0.011, -0.001, 0.026),  # hardest-level interval reaches 0
    })
    sort = _dapo_table("sort", {"f_good": (True, 0, 0, 0, -0.004, 0, 0)}, seeds=5)
    d = decide(dev, {"sort": sort}, baseline="dapo")
    assert [a.label for a in d.arms] == ["f_good", "f_zero"] and d.chosen == "f_good"
    assert d.arms[1].why == "hardest-level interval reaches 0"
    text = markdown(d)
    assert "against DAPO" in text and "| arm | Δ hardest level |" in text and "**Chosen: `f_good`**" in text
    # against GRPO the same study has no paired differences; a study without DAPO's table names the flag
    with pytest.raises(UsageError, match="no paired differences to grpo"):
        decide(dev, {})
    with pytest.raises(UsageError, match="--baseline dapo: the `missing` study has no `dapo` arm"):
        decide(DEV, {}, baseline="dapo")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "results.json").write_text(json.dumps(dev))
    assert cli_main(["decide", str(tmp_path / "dev"), "--baseline", "dapo"]) == 0
    assert "`f_good` qualifies but has not been run" in capsys.readouterr().out


def test_against_dapo_the_saturating_figure_is_rollouts_to_dapos_final():
    arms = {"f_a": (True, 0.03, 0.02, 0.04, 0.01, 0.0, 0.02), "f_b": (True, 0.02, 0.01, 0.03, 0.01, 0.0, 0.02)}
    dev = _dapo_table("missing", arms)
    sat = _dapo_table("missing_long", arms, to_final={"f_a": [0.9, None, 0.9], "f_b": [0.7, 0.8, 0.7]})
    d = decide(dev, {}, saturating=sat, baseline="dapo")
    # f_a has the larger hardest-level gain, but f_b reaches DAPO's final with less (f_a's median 0.9 with a never)
    assert [a.label for a in d.arms] == ["f_b", "f_a"] and d.arms[0].rank_value == 0.7
    assert "compute to DAPO's final on missing_long" in markdown(d)
