"""``verl-gdro decide``: the stated rule that picks the ``robust`` default from study results.

The rule (stated in ``docs/benchmarks.md`` before the runs) reads only paired differences to GRPO,
so a default is chosen by a rule written before the runs, not by looking at the tables:

1. On the development task, an arm *qualifies* when its worst-level interval excludes 0 on the
   positive side (``lo > 0``) and its whole mean@8 interval lies above ``-0.005``
   (:data:`MEAN_FLOOR`). Intervals need at least :data:`~verl_gdro.demo.stats.MIN_SEEDS_FOR_INTERVALS`
   seeds; with fewer, nothing qualifies.
2. Qualified arms are ranked by their mean worst-level gain; with a saturating study
   (``--saturating``), by its mean@8 compute figure first (the median over seeds of the share of
   GRPO's rollouts at which the arm first reaches GRPO's final mean@8, a seed that never does
   counting as above 1; an arm not run there ranks last), ties by the worst-level gain. The goal
   line says whether the winner reaches GRPO's final mean@8 and hardest level with at most
   :data:`GOAL_SHARE` of its rollouts (median, every seed reaching).
3. Going down that ranking, an arm is *confirmed* when, on every confirmation task, its mean
   mean@8 difference to GRPO is no worse than ``-0.01`` (:data:`CONFIRM_MAX_LOSS`). The default is
   the first confirmed arm, provided every arm ranked above it was run on the confirmation tasks
   and failed there (an unconfirmed arm above it leaves the decision pending). No confirmed arm:
   the default stays.

``--baseline dapo`` reads the same rule against DAPO instead of GRPO, for a user who keeps DAPO's
dynamic sampling: the candidates are the arms run with the filter, their differences those of the
study's DAPO table (hardest level for the worst level; generated rollouts to DAPO's final for the
saturating compute figure).

Reads each study's ``results.json`` (``verl-gdro study --out DIR``); standard library only.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_gdro.errors import UsageError

#: the mean@8 interval of a qualifying arm lies above this on the development task
MEAN_FLOOR = -0.005
#: the most mean@8 (paired mean difference) the chosen arm may lose on a confirmation task
CONFIRM_MAX_LOSS = 0.01
#: the goal of the chosen default on the saturating configuration (share of GRPO's rollouts)
GOAL_SHARE = 0.75
#: the arms the rule can be read against (``--baseline``)
BASELINES = ("grpo", "dapo")


@dataclass
class ArmVerdict:
    """One arm's reading of the rule."""

    label: str
    spec: str
    worst_gain: float
    worst_ci: tuple[float | None, float | None]
    mean_gain: float
    mean_ci: tuple[float | None, float | None]
    qualifies: bool
    why: str
    #: confirmation task -> mean paired mean@8 difference (None: the arm was not run there)
    confirm: dict[str, float | None] = field(default_factory=dict)
    #: the saturating study's compute figures (None: no saturating study, or the arm was not run)
    saturating: dict[str, Any] | None = None

    @property
    def rank_value(self) -> float:
        """The saturating mean@8 compute figure (inf when absent or never reached)."""
        if self.saturating is None or self.saturating["mean@8"].get("rank_value") is None:
            return float("inf")
        return float(self.saturating["mean@8"]["rank_value"])

    @property
    def confirmed(self) -> bool | None:
        """True/False once every confirmation task ran the arm; None while one has not."""
        if not self.qualifies:
            return False
        if not self.confirm or any(v is None for v in self.confirm.values()):
            return None  # no confirmation task yet: the rule is not done
        return all(v >= -CONFIRM_MAX_LOSS - 1e-12 for v in self.confirm.values())


@dataclass
class Decision:
    """The arms in rule order and the outcome: ``chosen`` (a label) or None with ``status``."""

    task: str
    seeds: int
    arms: list[ArmVerdict]
    confirm_tasks: list[str]
    chosen: str | None
    status: str  # "chosen", "pending" (an arm awaits confirmation) or "default stays"
    saturating_task: str | None = None
    baseline: str = "grpo"


def _names(baseline: str) -> tuple[str, str]:
    """(the baseline as the tables write it, the level its rule reads): GRPO's paired figures read the
    worst level, DAPO's table the hardest."""
    return ("GRPO", "worst-level") if baseline == "grpo" else (baseline.upper(), "hardest-level")


def _qualify(p: Mapping[str, Any], level: str = "worst-level") -> tuple[bool, str]:
    w_lo = p["worst_level_acc"]["ci95"][0]
    m_lo = p["mean@8"]["ci95"][0]
    if w_lo is None or m_lo is None:
        return False, "too few seeds for intervals"
    if w_lo <= 0:
        return False, f"{level} interval reaches 0"
    if m_lo <= MEAN_FLOOR:
        return False, f"mean@8 interval reaches {MEAN_FLOOR}"
    return True, "qualifies"


def decide(
    dev: Mapping[str, Any],
    confirm: Mapping[str, Mapping[str, Any]],
    arms_only: Sequence[str] | None = None,
    saturating: Mapping[str, Any] | None = None,
    baseline: str = "grpo",
) -> Decision:
    """Apply the rule to a development study summary and confirmation study summaries (by task).

    ``arms_only`` restricts the candidates (e.g. the Rollout-GDRO arms when the rollout default is
    being decided; a Prompt-GDRO arm in the same study is then reported by the study, not ranked).
    """
    paired = against(dev, baseline)
    if not paired:
        raise UsageError(f"the development study has no paired differences to {baseline}: run it with {baseline} and "
                         "at least one arm")
    if arms_only is not None:
        unknown = sorted(set(arms_only) - set(paired))
        if unknown:
            raise UsageError(f"--arms {unknown} are not arms of the development study; it has {sorted(paired)}")
        keep = set(arms_only)
        paired = {k: v for k, v in paired.items() if k in keep}
    confirm_paired = {task: against(summary, baseline) for task, summary in confirm.items()}
    sat_paired = None if saturating is None else against(saturating, baseline)
    arms = [_verdict(label, p, dev, confirm_paired, sat_paired, baseline) for label, p in paired.items()]
    if saturating is None:
        # qualified first, best worst-level gain first; the rest in the same order after them
        arms.sort(key=lambda a: (not a.qualifies, -a.worst_gain))
    else:
        # qualified first, least compute to GRPO's final mean@8 first, ties by worst-level gain
        arms.sort(key=lambda a: (not a.qualifies, a.rank_value, -a.worst_gain))
    chosen, status = _outcome(arms)
    return Decision(
        task=str(dev["task"]),
        seeds=int(dev["num_seeds"]),
        arms=arms,
        confirm_tasks=list(confirm),
        chosen=chosen,
        status=status,
        saturating_task=None if saturating is None else str(saturating["task"]),
        baseline=baseline,
    )


def against(summary: Mapping[str, Any], baseline: str) -> dict[str, Any]:
    """label -> the paired figures the rule reads (``worst_level_acc``, ``mean@8``,
    ``compute_to_grpo_final``): the study's differences to GRPO, or to DAPO from its table on
    generated rollouts (the arms run with the filter; hardest level; rollouts to DAPO's final)."""
    if baseline not in BASELINES:
        raise UsageError(f"--baseline {baseline!r} is not one of {list(BASELINES)}")
    if baseline == "grpo":
        return dict(summary.get("paired") or {})
    table = summary.get("dynamic_sampling") or {}
    if table.get("base") != baseline:
        raise UsageError(f"--baseline {baseline}: the `{summary['task']}` study has no `{baseline}` arm to compare "
                         f"with (run it with {baseline}=grpo:dynamic_sampling=true)")
    return {
        label: {
            "worst_level_acc": arm["paired"]["hardest_level_acc"],
            "mean@8": arm["paired"]["mean@8"],
            "compute_to_grpo_final": arm["to_dapo_final"],
        }
        for label, arm in table["arms"].items()
        if label != baseline and arm.get("filter") and arm.get("paired")
    }


def _verdict(
    label: str, p: Mapping[str, Any], dev: Mapping[str, Any], confirm: Mapping[str, Mapping[str, Any]],
    saturating: Mapping[str, Any] | None, baseline: str,
) -> ArmVerdict:
    """One arm's reading: qualification on the development study, its confirmations and compute figures
    (``confirm``: task -> that study's paired figures; ``saturating``: the saturating study's)."""
    ok, why = _qualify(p, _names(baseline)[1])
    verdict = ArmVerdict(
        label=label,
        spec=str(dev["methods"][label]["spec"]).removeprefix(f"{label}="),
        worst_gain=float(p["worst_level_acc"]["mean"]),
        worst_ci=tuple(p["worst_level_acc"]["ci95"]),  # type: ignore[arg-type]
        mean_gain=float(p["mean@8"]["mean"]),
        mean_ci=tuple(p["mean@8"]["ci95"]),  # type: ignore[arg-type]
        qualifies=ok,
        why=why,
    )
    for task, figures in confirm.items():
        cp = figures.get(label)
        verdict.confirm[task] = None if cp is None else float(cp["mean@8"]["mean"])
    if saturating is not None:
        sp = saturating.get(label)
        verdict.saturating = None if sp is None else dict(sp["compute_to_grpo_final"])
    return verdict


def _outcome(arms: Sequence[ArmVerdict]) -> tuple[str | None, str]:
    """Rule 3 down the ranking: (the chosen label or None, the status)."""
    for a in arms:
        if not a.qualifies:
            break
        if a.confirmed is None:
            return None, "pending"
        if a.confirmed:
            return a.label, "chosen"
    return None, "default stays"


def _share(c: Mapping[str, Any] | None, key: str) -> str:
    """A compute figure as the rule reads it: the median, or the per-seed values."""
    if c is None:
        return "not run"
    f = c[key]
    if f.get("median") is not None:
        interp = f.get("median_interpolated")
        return f"{f['median']:.2f}" + ("" if interp is None else f" ({interp:.2f})")
    cells = ["-" if v == "excluded" else "never" if v in ("never", None) else f"{v:.2f}" for v in f["per_seed"]]
    return "/".join(cells) or "-"


def goal_met(c: Mapping[str, Any] | None) -> bool:
    """Both figures (hardest level, mean@8) reached by every counted seed, medians <= the goal."""
    if c is None:
        return False
    return all(c[k].get("median") is not None and c[k]["median"] <= GOAL_SHARE + 1e-12 for k in ("hardest_level_acc", "mean@8"))


def _ci(mean: float, ci: Sequence[float | None]) -> str:
    lo, hi = ci
    return f"{mean:+.3f}" if lo is None else f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def markdown(d: Decision) -> str:
    """The rule's table: every arm, why it qualifies or not, its confirmations and the outcome."""
    sat = d.saturating_task
    base, level = _names(d.baseline)
    ranked = (
        f"ranked by the mean@8 compute figure on `{sat}` (median share of {base}'s rollouts, never = above 1), ties "
        f"by {level} gain"
        if sat
        else f"ranked by {level} gain"
    )
    sat_head = f" | compute to {base}'s final on {sat}: mean@8 | hardest level" if sat else ""
    lines = [
        f"# Default decision on `{d.task}` ({d.seeds} paired seeds)" + ("" if base == "GRPO" else f", against {base}"),
        "",
        f"Qualifies: {level} interval above 0 and mean@8 interval above {MEAN_FLOOR}; {ranked}; "
        f"confirmed: mean@8 loss no more than {CONFIRM_MAX_LOSS} on "
        + (", ".join(f"`{t}`" for t in d.confirm_tasks) or "(no confirmation task given)")
        + ".",
        "",
        f"| arm | Δ {level.replace('-', ' ')} | Δ mean@8 | reading"
        + sat_head
        + " | "
        + " | ".join(f"Δ mean@8 on {t}" for t in d.confirm_tasks)
        + (" | " if d.confirm_tasks else "")
        + "confirmed |",
        "|---|---|---|---|" + ("---|---|" if sat else "") + "---|" * len(d.confirm_tasks) + "---|",
    ]
    for a in d.arms:
        conf = " | ".join("not run" if a.confirm[t] is None else f"{a.confirm[t]:+.3f}" for t in d.confirm_tasks)
        state = {True: "yes", False: "no", None: "not yet"}[a.confirmed] if a.qualifies else "-"
        sat_cells = f" | {_share(a.saturating, 'mean@8')} | {_share(a.saturating, 'hardest_level_acc')}" if sat else ""
        lines.append(
            f"| {a.label} | {_ci(a.worst_gain, a.worst_ci)} | {_ci(a.mean_gain, a.mean_ci)} | {a.why}{sat_cells} | "
            + (conf + " | " if d.confirm_tasks else "")
            + f"{state} |"
        )
    lines.append("")
    if d.status == "chosen":
        winner = next(a for a in d.arms if a.label == d.chosen)
        lines.append(f"**Chosen: `{d.chosen}`** (`{winner.spec}`).")
        if sat:
            verdict = "met" if goal_met(winner.saturating) else "not met"
            lines.append(
                f"Goal on `{sat}` ({base}'s final mean@8 and hardest level each with at most {GOAL_SHARE} of its "
                f"rollouts, median, every seed reaching): **{verdict}** (mean@8 {_share(winner.saturating, 'mean@8')}, "
                f"hardest level {_share(winner.saturating, 'hardest_level_acc')})."
            )
    elif d.status == "pending":
        best = next(a.label for a in d.arms if a.confirmed is None)
        lines.append(f"**Pending**: `{best}` qualifies but has not been run on every confirmation task yet.")
    else:
        lines.append("**No arm qualifies and is confirmed: the default stays.**")
    lines.append("")
    return "\n".join(lines)


def _load(path: str, flag: str) -> dict[str, Any]:
    p = Path(path)
    f = p / "results.json" if p.is_dir() else p
    if not f.is_file():
        raise UsageError(f"{flag} {path!r}: no results.json there (run `verl-gdro study --out DIR` first)")
    return json.loads(f.read_text())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dev", help="the development study's run directory (or its results.json)")
    parser.add_argument(
        "--confirm", nargs="*", default=[], metavar="DIR", help="confirmation studies' run directories, one per task"
    )
    parser.add_argument(
        "--arms", nargs="*", default=None, metavar="LABEL", help="the candidate arms (default: every arm of the study)"
    )
    parser.add_argument(
        "--saturating",
        default=None,
        metavar="DIR",
        help="a saturating study of the same arms: rank qualified arms by its mean@8 compute figure",
    )
    parser.add_argument(
        "--baseline",
        default="grpo",
        choices=BASELINES,
        help="read the rule against this arm: grpo, or dapo (the arms run with DAPO's dynamic sampling, "
        "against the study's dapo arm on generated rollouts)",
    )


def main(args: argparse.Namespace) -> int:
    dev = _load(args.dev, "dev")
    confirm: dict[str, dict[str, Any]] = {}
    for path in args.confirm:
        summary = _load(path, "--confirm")
        if summary["task"] == dev["task"]:
            raise UsageError(f"--confirm {path!r} is a study of the development task {dev['task']!r}")
        confirm[str(summary["task"])] = summary
    saturating = None if args.saturating is None else _load(args.saturating, "--saturating")
    print(markdown(decide(dev, confirm, args.arms, saturating, args.baseline)))
    return 0
