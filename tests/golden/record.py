"""Golden traces of the step API: every decision, multiplier, metric and state, step by step.

Issue 37: the controller's strategies (allocators, prompt modes, loss signals) were moved behind
registries without changing a single decision. These traces were recorded on main e627010, before
that redesign, and ``tests/test_golden_traces.py`` recomputes them and names the first step and
field that differ. Re-record only for an intended change, saying why in the commit message::

    PYTHONPATH=$PWD python tests/golden/record.py            # rewrite tests/golden/traces.json
    PYTHONPATH=$PWD python tests/golden/record.py --check    # compare, print the first difference
    PYTHONPATH=$PWD python tests/golden/record.py --only NAME --reason "..."  # an intended change

Each scenario drives :class:`~verl_gdro.step.controller.GDROController` through ``from_config``,
``before_generation`` (or ``decide`` + ``adopt``: staged, with part of the decided prompts
consumed later and some filtered, never adopted), ``advantage_multipliers``, ``after_advantage``
(with synthetic per-token arrays for the surrogate signals), ``after_update`` when the signal is
measured during the update, and ``state_dict``; the sampling modes draw through
:class:`~verl_gdro.step.sampler.PromptSampler`. Outcomes come from a generator seeded per
(scenario, step), so a run resumed from a saved state at any step continues the same trace.
Values are hashed through a canonical text form (``repr`` of numbers, raw bytes of arrays), as in
``benchmarks/trainer_path_digest.py``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
TRACES = HERE / "traces.json"
STEPS = 32
POOL = 160
BATCH = 12
WIDTH = 6
#: the scenarios whose state at CHECKPOINT_STEP is kept (tests/golden/state_<name>.pkl)
CHECKPOINT_STEP = 16
CHECKPOINTED = ("preset_robust", "preset_paper", "preset_release", "release_as_run", "mode_band", "bandit_sample_informative")


def _scenarios() -> dict[str, dict[str, Any]]:
    """name -> {gdro: the group, rollout_n, staged, fail, filter}."""
    s: dict[str, dict[str, Any]] = {}
    for preset in ("robust", "paper", "release"):
        s[f"preset_{preset}"] = {"gdro": {"preset": preset}}
    for mode in ("reweight", "failure_weighted", "greso", "band", "resample"):
        s[f"mode_{mode}"] = {"gdro": {"preset": "robust", "prompt": {"mode": mode}}}
    bandit = {"allocator": "bandit"}
    s["bandit_map_expected_informative"] = {"gdro": {"preset": "paper", "prompt": {"loss_signal": "failure_rate"},
                                                     "rollout": {**bandit, "arm_utility": "expected_informative",
                                                                 "selection": "map"}}}
    s["bandit_auto_expected_informative"] = {"gdro": {"preset": "paper", "prompt": {"loss_signal": "failure_rate"},
                                                      "rollout": {**bandit, "arm_utility": "expected_informative",
                                                                  "selection": "auto"}}}
    s["bandit_sample_informative"] = {"gdro": {"preset": "paper", "prompt": {"loss_signal": "failure_rate"},
                                               "rollout": {**bandit, "arm_utility": "informative", "selection": "sample"}}}
    s["bandit_sample_loss"] = {"gdro": {"preset": "paper", "prompt": {"loss_signal": "surrogate"},
                                        "rollout": {**bandit, "arm_utility": "loss", "selection": "sample"}}}
    s["bandit_map_variance"] = {"gdro": {"preset": "paper", "prompt": {"loss_signal": "failure_rate"},
                                         "rollout": {**bandit, "arm_utility": "variance", "selection": "map"}}}
    s["per_prompt_window"] = {"gdro": {"preset": "robust", "rollout": {"allocator": "per_prompt",
                                                                       "arm_utility": "expected_informative"}}}
    s["per_prompt_hit"] = {"gdro": {"preset": "robust", "rollout": {"arm_utility": "hit", "rate_decay": 0.7}}}
    s["neyman"] = {"gdro": {"preset": "paper", "prompt": {"loss_signal": "failure_rate"}, "rollout": {"allocator": "neyman"}}}
    # a small pool: prompts come back often enough to leave the release's ``excl`` class
    s["release_as_run"] = {"gdro": {"preset": "release", "rollout": {"allocator": "release_as_run"}}, "pool": 20}
    s["update_surrogate_paper"] = {"gdro": {"preset": "paper", "prompt": {"loss_signal": "update_surrogate"}}}
    s["update_surrogate_rollout_only"] = {"gdro": {"preset": "paper", "prompt": {"enable": False,
                                                                                "loss_signal": "update_surrogate"}}}
    s["surrogate_kl_prompt_only"] = {"gdro": {"preset": "paper", "rollout": {"enable": False}}}
    s["grpo_metrics_only"] = {"gdro": {"prompt": {"enable": False}, "rollout": {"enable": False}}}
    # partial consumption (decide at dispatch, adopt part of the call later), failed and filtered groups
    for preset in ("robust", "paper", "release"):
        s[f"staged_{preset}"] = {"gdro": {"preset": preset}, "staged": True, "fail": True, "filter": True}
    s["staged_release_as_run"] = {"gdro": {"preset": "release", "rollout": {"allocator": "release_as_run"}},
                                  "staged": True, "fail": True, "filter": True, "pool": 20}
    s["staged_bandit_sample_informative"] = {**s["bandit_sample_informative"], "staged": True, "fail": True, "filter": True}
    s["failed_groups_per_prompt"] = {"gdro": {"preset": "robust"}, "fail": True}
    return s


SCENARIOS = _scenarios()


def canonical(x: Any) -> Any:
    """A value-only form of nested dicts / lists / arrays / numbers (object identity plays no part)."""
    if isinstance(x, dict):
        return {str(k): canonical(v) for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))}
    if isinstance(x, (list, tuple)):
        return [canonical(v) for v in x]
    if isinstance(x, np.ndarray):
        return (str(x.dtype), list(x.shape), x.tobytes().hex())
    if isinstance(x, np.generic):
        return repr(x.item())
    return repr(x)


def sha(x: Any) -> str:
    return hashlib.sha256(repr(canonical(x)).encode()).hexdigest()[:24]


class Run:
    """One scenario's controller, its driver state and its per-step record."""

    def __init__(self, name: str) -> None:
        from verl_gdro.step.controller import GDROController
        from verl_gdro.step.sampler import PromptSampler

        self.name = name
        self.spec = SCENARIOS[name]
        self.seed = sum(map(ord, name))
        self.ctrl = GDROController.from_config(self.spec["gdro"], rollout_n=4)
        world = np.random.default_rng([self.seed, 0])
        pool = int(self.spec.get("pool", POOL))
        self.true_p = world.beta(0.4, 0.5, size=pool)
        self.uids = (np.arange(pool, dtype=np.int64) * 7 + 3)
        self.sampler = PromptSampler(self.ctrl, self.uids, seed=self.seed) if self.ctrl.resamples else None
        self.carry: list[tuple[int, int, int]] = []  # staged: (uid, bin, n) decided, not yet consumed

    # -- one step --------------------------------------------------------------------------------

    def _draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        if self.sampler is not None:
            return self.uids[self.sampler.draw(size)]
        return rng.choice(self.uids, size=size, replace=False)

    def _plan(self, rng: np.random.Generator, rec: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(positions, uids, n) of the step's consumed prompts."""
        if not self.spec.get("staged"):
            plan = self.ctrl.before_generation(self._draw(rng, BATCH))
            rec.update(bins=plan.bins, n=plan.rollout_n, positions=plan.positions)
            return plan.positions, plan.uids, plan.rollout_n
        # two calls decided this step; the carried part of the last step's and part of these are consumed
        first = self.ctrl.decide(self._draw(rng, BATCH // 2))
        second = self.ctrl.decide(self._draw(rng, BATCH // 2))
        rec.update(decided_bins=[first.bins, second.bins], decided_n=[first.rollout_n, second.rollout_n])
        decided = [(int(u), int(b), int(n)) for p in (first, second) for u, b, n in zip(p.uids, p.bins, p.rollout_n)]
        queue = self.carry + decided
        take = BATCH - 2
        consumed, self.carry = queue[:take], queue[take:]
        if self.spec.get("filter") and len(consumed) > 3:
            consumed = [c for i, c in enumerate(consumed) if i != 2]  # filtered before the advantage stage
        u = np.array([c[0] for c in consumed], dtype=np.int64)
        b = np.array([c[1] for c in consumed], dtype=np.int64)
        n = np.array([c[2] for c in consumed], dtype=np.int64)
        positions = self.ctrl.adopt(u, b, n)
        rec.update(bins=b, n=n, positions=positions)
        return positions, u, n

    def step(self, t: int) -> dict[str, Any]:
        rng = np.random.default_rng([self.seed, t])
        rec: dict[str, Any] = {}
        if self.sampler is not None:
            rec["draw_probs"] = np.asarray(self.sampler.current_probabilities()).copy()
        positions, uids, n = self._plan(rng, rec)
        rows_n = n.copy()
        if self.spec.get("fail") and t % 4 == 1 and rows_n.size > 1:
            rows_n[1] = max(0, rows_n[1] - 1)  # a failed generation: one trajectory missing
        if self.spec.get("fail") and t % 4 == 3 and rows_n.size > 2:
            rows_n[2] = 0  # a whole group missing
        g = np.repeat(positions, rows_n)
        rows = int(g.size)
        p_rows = self.true_p[np.searchsorted(self.uids, np.repeat(uids, rows_n))]
        acc = (rng.random(rows) < p_rows).astype(np.float64)
        mult = self.ctrl.advantage_multipliers(g)
        rec["mult"] = mult
        mask = (rng.random((rows, WIDTH)) < 0.8).astype(np.float64)
        mask[:, 0] = 1.0
        arrays = {
            "response_mask": mask,
            "old_log_probs": -rng.random((rows, WIDTH)),
            "ref_log_probs": -rng.random((rows, WIDTH)),
            "advantages": np.repeat((acc - acc.mean())[:, None], WIDTH, axis=1) * mult[:, None],
        }
        metrics = self.ctrl.after_advantage(g, acc, **arrays)
        metrics.pop("gdro/controller_time_s", None)
        rec["metrics"] = metrics
        if self.ctrl.wants_update_losses:
            keep = rng.random(rows) < 0.9  # some responses unmeasured
            losses = rng.normal(0.0, 0.3, size=rows) + (1.0 - acc) * 0.2
            if rows:
                losses[0] = np.nan
            upd = self.ctrl.after_update(g[keep], losses[keep])
            rec["update_metrics"] = upd
        rec["state"] = self.ctrl.state_dict()
        if self.sampler is not None:
            rec["draw_metrics"] = self.sampler.draw_metrics()
            rec["sampler_state"] = self.sampler.state_dict()
        return rec

    # -- checkpoints -----------------------------------------------------------------------------

    def save(self) -> dict[str, Any]:
        return {"controller": self.ctrl.state_dict(), "carry": list(self.carry),
                "sampler": None if self.sampler is None else self.sampler.state_dict()}

    def load(self, saved: dict[str, Any]) -> None:
        self.ctrl.load_state_dict(saved["controller"])
        self.carry = [tuple(c) for c in saved["carry"]]
        if self.sampler is not None:
            self.sampler.load_state_dict(saved["sampler"])


def digest_step(rec: dict[str, Any]) -> dict[str, str]:
    return {field: sha(value) for field, value in sorted(rec.items())}


def readable(rec: dict[str, Any]) -> dict[str, Any]:
    """A few values a reader can check by eye next to the digests."""
    m = rec["metrics"]
    out: dict[str, Any] = {"n": [int(x) for x in rec["n"]], "bins": [int(x) for x in rec["bins"]]}
    for key in ("gdro/shadow_price", "gdro/mean_n", "gdro/rollout_update_skipped", "gdro/incomplete_groups"):
        if key in m:
            out[key] = float(m[key])
    return out


def trace(name: str, start: int = 1, run: Run | None = None, save_at: int | None = None) -> tuple[list[dict[str, str]], list[dict[str, Any]], dict[str, Any] | None]:
    """Digests and readable values of steps ``start..STEPS`` (and the state after ``save_at``)."""
    run = run or Run(name)
    digests, values, saved = [], [], None
    for t in range(start, STEPS + 1):
        rec = run.step(t)
        digests.append(digest_step(rec))
        values.append(readable(rec))
        if save_at == t:
            saved = run.save()
    return digests, values, saved


def first_difference(name: str, golden: list[dict[str, str]], got: list[dict[str, str]], start: int = 1) -> str | None:
    """'<scenario> step <t> field <f>' of the first difference, or None."""
    for i, (a, b) in enumerate(zip(golden, got)):
        for field in sorted(set(a) | set(b)):
            if a.get(field) != b.get(field):
                return f"{name}: step {start + i} field {field!r} differs (golden {a.get(field)}, now {b.get(field)})"
    if len(golden) != len(got):
        return f"{name}: {len(golden)} golden steps, {len(got)} now"
    return None


def record(only: list[str] | None = None, reason: str | None = None) -> None:
    """Record every scenario (and the e627010 states), or re-record ``only`` these, with ``reason``.

    A re-recorded scenario's saved state is rewritten too (an intended change makes the old state
    continue another trace); every other state is what e627010 wrote. A rewritten state's
    predecessor is kept by its test where it still has to load (``state_release_as_run_e627010.pkl``,
    tests/test_release_as_run.py)."""
    if only:
        out = json.loads(TRACES.read_text())
        for name in only:
            digests, values, saved = trace(name, save_at=CHECKPOINT_STEP if name in CHECKPOINTED else None)
            out["scenarios"][name] = {"config": SCENARIOS[name], "digests": digests, "values": values,
                                      "re_recorded": reason}
            if saved is not None:
                with open(HERE / f"state_{name}.pkl", "wb") as f:
                    pickle.dump(saved, f, protocol=4)
        TRACES.write_text(json.dumps(out, indent=None, separators=(",", ":")) + "\n")
        return
    out = {"recorded_on": "e627010", "steps": STEPS, "scenarios": {}}
    for name in SCENARIOS:
        digests, values, saved = trace(name, save_at=CHECKPOINT_STEP if name in CHECKPOINTED else None)
        out["scenarios"][name] = {"config": SCENARIOS[name], "digests": digests, "values": values}
        if saved is not None:
            with open(HERE / f"state_{name}.pkl", "wb") as f:
                pickle.dump(saved, f, protocol=4)
        print(f"{name:>36}  {sha(digests)}", flush=True)
    TRACES.write_text(json.dumps(out, indent=None, separators=(",", ":")) + "\n")


def check() -> int:
    golden = json.loads(TRACES.read_text())["scenarios"]
    bad = 0
    for name in SCENARIOS:
        digests, _, _ = trace(name)
        diff = first_difference(name, golden[name]["digests"], digests)
        print(diff or f"{name}: identical", flush=True)
        bad += diff is not None
    return 1 if bad else 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true")
    p.add_argument("--only", nargs="+", help="re-record these scenarios only (an intended change)")
    p.add_argument("--reason", help="why (stored with the re-recorded scenarios)")
    args = p.parse_args()
    if args.check:
        sys.exit(check())
    if args.only and not args.reason:
        p.error("--only needs --reason")
    record(args.only, args.reason)
