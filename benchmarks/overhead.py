"""Driver-side overhead of GDRO against verl's own GRPO advantage stage (issue 6, "Overhead").

The paper's weakest point: on Qwen3-4B its advantage stage took 0.043 s/step for GRPO, 0.355 s for
Prompt-GDRO and 0.446 s for Rollout-GDRO (8x and 10x). verl-gdro's target is the WHOLE GDRO work
of a step at most 1.10x verl's ``grpo`` for Prompt-GDRO and 1.25x for Rollout-GDRO, measured side
by side in one process on the same batches:

- GRPO: ``verl.trainer.ppo.ray_trainer.compute_advantage`` with ``AdvantageEstimator.GRPO`` on a
  real ``verl.protocol.DataProto``;
- GDRO: everything the GDRO trainer adds or replaces, through the very functions
  ``GDROTrainerMixin`` calls (:mod:`verl_gdro.integration.glue`, the dispatch ledger and the step
  API :class:`verl_gdro.step.controller.GDROController`), minus TransferQueue's reads: at
  ``_next_train_batch``, classification and the allocation DP (``decide``) and the ledger's
  record; at ``_compute_advantage``, the real rows, the ledger update adopted into the plan, the
  stable-id check, ``acc`` from the reward's per-row extra fields, the Eq. 16 multipliers, the
  ``gdro_grpo`` estimator through the same ``compute_advantage`` (inside ``gdro_step``, with the
  trainer's per-row view), the per-prompt loss signal from the token arrays (surrogate signals
  only), the controller updates, the metrics and the ledger's flow metrics.

Batches have the trainer's layout: int64 ``response_mask`` (verl's V1 ``_lengths_to_mask``),
float32 ``token_level_rewards`` (the outcome reward on the last response token), float32
``old_log_probs`` / ``ref_log_prob``, verl ``uid`` strings per prompt group, CPU torch tensors.
Shapes: 256 x 4 and 512 x 4 responses of 4096 tokens, and 512 prompts with n drawn from 2..12 (the
same 2048 responses in total). Rollout-GDRO rows use the group sizes its own allocation chose
(again 4 per prompt on average, so the same total); GRPO is timed on that very batch.

For context each row also times verl's GRPO as its V1 trainer actually runs it
(``compute_advantage_for_multi_trajectories``: a ``select_idxs`` copy of the batch, grpo, a scatter
and a second mask pass); for any other estimator, ``gdro_grpo`` included, that function calls
``compute_advantage`` directly, so this is what the GDRO trainer's stage replaces in a V1 run.

Each repetition is one full step (the controllers' state advances as in training); GRPO and GDRO
alternate order between repetitions, and the V1 path runs last in each. Times are medians after warm-up (the ratio of
the minima is printed beside: on a shared machine noise only ever adds time; so is the median of
the per-repetition ratios, in which a load change that slows a whole repetition cancels). Before timing, the
classifier is given a full window of history for every prompt of a DAPO-sized dataset, so
classification runs at its worst case (late training), not on empty rings.

Run: ``python benchmarks/overhead.py`` (``--quick`` for a small smoke run). The last line printed
is a JSON object with ``prompt_gdro_ratio`` and ``rollout_gdro_ratio`` (the worst ratio over the
shapes, default ``robust`` preset, default allocator) and every row. ``--rollout-variant`` adds
Rollout-GDRO rows under other ``gdro`` keys (e.g. ``rollout.allocator=per_prompt,
rollout.arm_utility=failure_weighted``), so a candidate default is timed in the same run as the
current one; their worst ratios are in ``rollout_variants``.

``tests/test_overhead_bench.py`` records, with wrappers on every function and method of the step
API and the trainer's glue, which of them a real ``gdro_sync`` trainer step and :meth:`Bench.step`
call, in which order, and fails when the two sequences differ: the benchmark cannot drift from
the trainer's path again unnoticed. The machine may be shared: the ratios measured
side by side in one run are what count, not the absolute seconds.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: The paper's driver-side advantage-stage times on Qwen3-4B (s/step), for the printed comparison.
PAPER_SECONDS = {"grpo": 0.043, "prompt": 0.355, "rollout": 0.446}
TARGETS = {"prompt": 1.10, "rollout": 1.25}
N_MEAN = 4
DATASET_PROMPTS = 14_116  # DAPO-Math-17k (en), the paper's training set


@dataclass(frozen=True)
class Shape:
    """A batch shape: ``prompts`` groups, ``n`` rollouts each (``None``: drawn from 2..12)."""

    name: str
    prompts: int
    n: int | None


@dataclass
class Row:
    """One measured (shape, adversary, preset) combination."""

    shape: str
    adversary: str  # "prompt" or "rollout"
    preset: str
    variant: str = ""  # extra gdro overrides of a --rollout-variant row ("" = the defaults)
    grpo_s: list[float] = field(default_factory=list)
    v1_grpo_s: list[float] = field(default_factory=list)
    gdro_s: list[float] = field(default_factory=list)
    parts_s: dict[str, list[float]] = field(default_factory=dict)
    profile_s: dict[str, float] = field(default_factory=dict)  # --profile: mean seconds per step

    @property
    def grpo(self) -> float:
        return statistics.median(self.grpo_s)

    @property
    def gdro(self) -> float:
        return statistics.median(self.gdro_s)

    @property
    def ratio(self) -> float:
        return self.gdro / self.grpo

    @property
    def ratio_v1(self) -> float:
        """Against verl's GRPO as its V1 trainer runs it (compute_advantage_for_multi_trajectories)."""
        return self.gdro / statistics.median(self.v1_grpo_s)

    @property
    def ratio_paired(self) -> float:
        """Median of the per-repetition ratios (GRPO and GDRO timed back to back on one batch):
        load that slows a whole repetition cancels; printed beside the headline, not instead."""
        return statistics.median(d / g for d, g in zip(self.gdro_s, self.grpo_s, strict=True))

    @property
    def ratio_min(self) -> float:
        """Ratio of the fastest repetitions: on a shared machine, noise only ever adds time."""
        return min(self.gdro_s) / min(self.grpo_s)

    def as_dict(self) -> dict[str, Any]:
        return {
            "shape": self.shape,
            "adversary": self.adversary,
            "preset": self.preset,
            "variant": self.variant,
            "grpo_s": self.grpo,
            "gdro_s": self.gdro,
            "ratio": self.ratio,
            "ratio_min": self.ratio_min,
            "ratio_paired": self.ratio_paired,
            "v1_grpo_s": statistics.median(self.v1_grpo_s),
            "ratio_v1": self.ratio_v1,
            "parts_s": {k: statistics.median(v) for k, v in self.parts_s.items()},
            "reps": len(self.gdro_s),
            "profile_s": dict(self.profile_s),
        }


# ----------------------------------------------------------------------------------------------
# Synthetic data (untimed)
# ----------------------------------------------------------------------------------------------


class TokenArrays:
    """Per-token tensors for ``rows`` responses of ``width`` tokens, built once and reused.

    Every step of a shape has the same number of responses (the exact budget keeps it at
    ``prompts * 4``), so only the rewards and the grouping change between repetitions.
    """

    def __init__(self, rows: int, width: int, rng: np.random.Generator) -> None:
        import torch

        lengths = rng.integers(max(1, width // 16), width + 1, size=rows)
        self.lengths = torch.as_tensor(lengths, dtype=torch.int64)
        positions = torch.arange(width).unsqueeze(0)
        self.response_mask = (positions < self.lengths.unsqueeze(1)).to(torch.int64)  # as verl V1 builds it
        gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
        old = -(torch.randn(rows, width, generator=gen).abs() * 0.7) * self.response_mask
        self.old_log_probs = old.to(torch.float32)
        self.ref_log_prob = (old + 0.05 * torch.randn(rows, width, generator=gen)) * self.response_mask
        self.width = width

    def token_level_rewards(self, rewards: np.ndarray) -> Any:
        """Outcome reward on each response's last valid token (verl's reward manager layout)."""
        import torch

        out = torch.zeros(self.response_mask.shape, dtype=torch.float32)
        out[torch.arange(out.shape[0]), self.lengths - 1] = torch.as_tensor(rewards, dtype=torch.float32)
        return out


def random_group_sizes(prompts: int, rng: np.random.Generator, low: int = 2, high: int = 12) -> np.ndarray:
    """n_i in [low, high] summing exactly to ``N_MEAN * prompts`` (variable-n shape)."""
    n = np.full(prompts, N_MEAN, dtype=np.int64)
    for _ in range(prompts * 8):  # move rollouts between random pairs while staying in range
        i, j = rng.integers(prompts, size=2)
        k = int(rng.integers(1, 5))
        if i != j and n[i] + k <= high and n[j] - k >= low:
            n[i] += k
            n[j] -= k
    return n


def make_batch(tokens: TokenArrays, group_uids: np.ndarray, group_sizes: np.ndarray, acc: np.ndarray) -> Any:
    """A verl DataProto as the advantage stage sees it (one verl uid string per prompt group)."""
    from verl.protocol import DataProto

    traj_uids = np.repeat(group_uids, group_sizes)
    rewards = np.where(acc > 0.5, 1.0, -1.0)  # the paper's reward in {-1, +1}; acc stays binary
    data = DataProto.from_dict(
        tensors={
            "token_level_rewards": tokens.token_level_rewards(rewards),
            "response_mask": tokens.response_mask,
            "old_log_probs": tokens.old_log_probs,
            "ref_log_prob": tokens.ref_log_prob,
        },
        non_tensors={"uid": traj_uids, "acc": acc.astype(np.float64)},
    )
    return data


def shallow_copy(data: Any) -> Any:
    """A DataProto sharing the tensors: each estimator writes its own advantages / returns."""
    from verl.protocol import DataProto

    return DataProto.from_dict(
        tensors={k: data.batch[k] for k in data.batch.keys()},
        non_tensors=dict(data.non_tensor_batch),
    )


# ----------------------------------------------------------------------------------------------
# The measured step
# ----------------------------------------------------------------------------------------------


@dataclass
class StepBatch:
    """One step's generated batch: a copy per stage (each writes its advantages into its own), what
    TransferQueue hands the GDRO stage besides the tensors, and the V1 agent loop's keys."""

    grpo: Any
    gdro: Any
    v1: Any
    fetched: dict[str, np.ndarray]
    tags: list[dict[str, Any]]
    v1_keys: list[str]


class Bench:
    """Holds the controller of one (adversary, preset) and runs timed steps on synthetic batches."""

    def __init__(
        self, adversary: str, preset: str, width: int, rng: np.random.Generator, history: int,
        overrides: dict[str, Any] | None = None,
    ) -> None:
        from omegaconf import OmegaConf

        from verl_gdro.integration.ledger import DispatchLedger
        from verl_gdro.step.controller import GDROController

        group: dict[str, Any] = {
            "preset": preset,
            # Prompt-GDRO's advantage stage is its reweighting; the sampling modes' cost is a
            # draw before generation (benchmarks/sampler.py)
            "prompt": {"enable": adversary == "prompt", "mode": "reweight"},
            "rollout": {"enable": adversary == "rollout"},
        }
        for key, value in (overrides or {}).items():  # dotted gdro keys, e.g. rollout.allocator
            *sections, leaf = key.split(".")
            node = group
            for section in sections:
                node = node.setdefault(section, {})
            node[leaf] = value
        self.ctrl = GDROController.from_config(group, rollout_n=N_MEAN)
        self.ledger = DispatchLedger()  # the trainer decides at dispatch and records it here
        self.global_steps = 1
        # the `algorithm` group verl hands the estimator; the GDRO trainer mirrors `gdro` into it
        self.algo_cfg = OmegaConf.create(
            {"adv_estimator": "gdro_grpo", "norm_adv_by_std_in_grpo": True, "gdro": group}
        )
        self.grpo_cfg = OmegaConf.create({"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": True})
        self.adversary = adversary
        # the trainer reads the token arrays only for the surrogate loss signals (preset paper),
        # and the reference log-probs only for surrogate_kl (verl_gdro.integration.reads.token_fields)
        signal = self.ctrl.settings.prompt.loss_signal
        self.needs_log_probs = signal != "failure_rate" and (
            self.ctrl.prompt is not None or self.ctrl.rollout is not None
        )
        self.token_fields = ["response_mask", "old_log_probs", "advantages"]
        if signal == "surrogate_kl":
            self.token_fields.append("ref_log_prob")
        self.width = width
        self.rng = rng
        # heavy-tailed true pass rates: many prompts near 0 or 1, as on DAPO
        self.true_p = rng.beta(0.35, 0.5, size=DATASET_PROMPTS)
        self._prefill(history)

    def _prefill(self, history: int) -> None:
        """Give every dataset prompt ``history`` visits (rings at full width: the worst case)."""
        clf = self.ctrl.classifier
        assert clf is not None
        uids = np.arange(DATASET_PROMPTS, dtype=np.int64)
        for _ in range(history):
            succ = self.rng.binomial(N_MEAN, self.true_p)
            clf.observe(uids, succ, np.full(uids.size, N_MEAN))

    def step(
        self, shape: Shape, tokens: TokenArrays, grpo_first: bool
    ) -> tuple[float, float, float, dict[str, float]]:
        """One training step's advantage stage, GRPO and GDRO on the same batch.

        Returns (grpo seconds, gdro seconds, verl V1 grpo-path seconds, gdro parts).
        GRPO and GDRO alternate which goes first; verl's V1 path (context only) always goes last.
        It copies the whole batch and frees the copies, so whichever stage follows it pays for
        mapping fresh memory: before issue 13's third pass it preceded GDRO in every other
        repetition and GRPO never, which charged GDRO's estimator column 2-5 ms that verl's own
        grpo, called the same way, did not pay.
        """
        plan, prompt_batch, verl_uids, t_plan = self._decide(shape)
        b = self._batch(shape, tokens, plan, prompt_batch, verl_uids)
        parts: dict[str, float] = {"plan": t_plan}
        if grpo_first:
            grpo_s = self._run_grpo(b)
            gdro_s = self._run_gdro(b, parts)
        else:
            gdro_s = self._run_gdro(b, parts)
            grpo_s = self._run_grpo(b)
        v1_s = self._run_v1_grpo(b)
        self.global_steps += 1
        return grpo_s, t_plan + gdro_s, v1_s, parts

    def _decide(self, shape: Shape) -> tuple[Any, dict[str, np.ndarray], list[str], float]:
        """``GDROTrainerMixin._next_train_batch``: read the ids, decide, check the budget, record."""
        from verl_gdro.integration.reads import as_list as _as_list
        from verl_gdro.integration.reads import int_column as _int_column
        from verl_gdro.step.context import uid_keys

        ctrl, ledger = self.ctrl, self.ledger
        prompt_uids = self.rng.choice(DATASET_PROMPTS, size=shape.prompts, replace=False).astype(np.int64)
        # the prompt batch as verl's _next_train_batch hands it over: stable ids, a uid per group
        prompt_batch = {"uid": np.array([str(uuid.uuid4()) for _ in range(shape.prompts)], dtype=object),
                        "stable": prompt_uids.astype(object)}
        t0 = time.perf_counter()
        stable = _int_column(prompt_batch["stable"])
        verl_uids = uid_keys(_as_list(prompt_batch["uid"]))
        plan = ctrl.decide(stable)
        n = plan.rollout_n
        if int(n.sum()) != N_MEAN * len(verl_uids):
            raise AssertionError("exact budget")
        ledger.dispatch(verl_uids, plan.uids, plan.bins, n, step=self.global_steps)
        if ctrl.rollout is not None:
            n.tolist()  # the __rollout_n__ column the trainer hands verl's agent loop
        return plan, prompt_batch, verl_uids, time.perf_counter() - t0

    def _batch(
        self, shape: Shape, tokens: TokenArrays, plan: Any, prompt_batch: dict[str, np.ndarray], verl_uids: list[str]
    ) -> StepBatch:
        """The generated batch: group sizes, outcomes, and what TransferQueue would hand back."""
        if self.adversary == "rollout":
            sizes = plan.rollout_n
        elif shape.n is None:
            sizes = random_group_sizes(shape.prompts, self.rng)
        else:
            sizes = np.full(shape.prompts, shape.n, dtype=np.int64)
        assert int(sizes.sum()) == tokens.response_mask.shape[0]
        prompt_of_row = np.repeat(np.arange(sizes.size), sizes)
        prompt_uids = prompt_batch["stable"].astype(np.int64)
        acc = (self.rng.random(prompt_of_row.size) < self.true_p[prompt_uids][prompt_of_row]).astype(np.float64)
        data = make_batch(tokens, np.array(verl_uids, dtype=object), sizes, acc)
        # what the trainer's tq.kv_batch_get returns besides the tensors: per-row verl uid, stable
        # id, the streaming reward's extra fields; and the KVBatchMeta tags (one dict per row)
        fetched = {
            "uid": np.repeat(prompt_batch["uid"], sizes),
            "stable": np.repeat(prompt_batch["stable"], sizes),
            "extra_fields": np.array([{"reward_extra_info": {"acc": a, "score": 2 * a - 1}} for a in acc.tolist()],
                                     dtype=object),
        }
        # TransferQueue keys of the V1 agent loop: {uid}_{session_id}_{output index}
        v1_keys = [f"{u}_{j}_0" for u, k in zip(verl_uids, sizes.tolist()) for j in range(k)]
        return StepBatch(shallow_copy(data), shallow_copy(data), shallow_copy(data), fetched,
                         [{} for _ in range(acc.size)], v1_keys)

    def _run_grpo(self, b: StepBatch) -> float:
        from verl.trainer.ppo.core_algos import AdvantageEstimator
        from verl.trainer.ppo.ray_trainer import compute_advantage

        t = time.perf_counter()
        compute_advantage(b.grpo, AdvantageEstimator.GRPO, norm_adv_by_std_in_grpo=True, config=self.grpo_cfg)
        return time.perf_counter() - t

    def _run_v1_grpo(self, b: StepBatch) -> float:
        """What verl's V1 trainer runs for grpo (select_idxs copy, grpo, scatter); for any other
        estimator, gdro_grpo included, it calls compute_advantage directly."""
        from verl.trainer.ppo.core_algos import AdvantageEstimator
        from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

        t = time.perf_counter()
        compute_advantage_for_multi_trajectories(
            b.v1, batch_keys=b.v1_keys, adv_estimator=AdvantageEstimator.GRPO, num_repeat=N_MEAN,
            norm_adv_by_std_in_grpo=True, config=self.grpo_cfg,
        )
        return time.perf_counter() - t

    def _run_gdro(self, b: StepBatch, parts: dict[str, float]) -> float:
        """``GDROTrainerMixin._compute_advantage`` line by line, through the same glue functions
        (verl_gdro.integration.glue), minus TransferQueue's reads: real rows, the ledger update
        adopted into the controller's plan, the stable-id check, acc, the multipliers into verl's
        stage (gdro_grpo) per prompt group, the controller updates, the ledger and flow metrics
        (observe_update: before verl's estimator for the failure-rate signal, after it, with the
        token arrays, for the surrogate signals of preset paper)."""
        from verl.trainer.ppo.ray_trainer import compute_advantage

        from verl_gdro.integration.glue import acc_from_extra_fields, consume, correctness, observe_update
        from verl_gdro.integration.reads import as_list as _as_list
        from verl_gdro.integration.reads import int_column as _int_column
        from verl_gdro.step.context import gdro_step, uid_keys

        ctrl, ledger = self.ctrl, self.ledger
        t = time.perf_counter()
        uids = uid_keys(_as_list(b.fetched["uid"]))
        consumed = consume(ledger, ctrl, uids, b.tags)
        rows = consumed.rows
        stable_rows = _int_column(b.fetched["stable"])[rows]
        if not np.array_equal(stable_rows, ctrl.planned_uids(consumed.group_index)):
            raise AssertionError("stable ids")
        values, _ = acc_from_extra_fields(_as_list(b.fetched["extra_fields"]), rows, "acc")
        assert values is not None
        acc_rows = correctness(values, 0.0, "gdro.acc_key='acc'")  # the trainer's threshold
        t_glue = time.perf_counter()
        mult = ctrl.advantage_multipliers(consumed.group_index)
        table, row_plan = consumed.estimator_inputs(mult)
        t_mult = time.perf_counter()
        if not self.needs_log_probs:
            observe_update(ledger, ctrl, consumed, acc_rows, self.global_steps)
        t_update = time.perf_counter()
        with gdro_step(table, settings=ctrl.settings, rows=row_plan, norm_adv_by_std=True):
            t1 = time.perf_counter()
            compute_advantage(b.gdro, "gdro_grpo", norm_adv_by_std_in_grpo=True, config=self.algo_cfg)
            t2 = time.perf_counter()
        extra = self._token_fields(b, consumed, rows)
        t3 = time.perf_counter()
        if self.needs_log_probs:
            observe_update(ledger, ctrl, consumed, acc_rows, self.global_steps, **extra)
        t4 = time.perf_counter()
        parts.update(glue=t_glue - t, multipliers=(t_mult - t_glue) + (t1 - t_update), estimator=t2 - t1,
                     read_tokens=t3 - t2, update_metrics=(t_update - t_mult) + (t4 - t3))
        return t4 - t

    def _token_fields(self, b: StepBatch, consumed: Any, rows: np.ndarray) -> dict[str, np.ndarray]:
        """verl_gdro.integration.reads.token_fields: the removed groups' rows (none here) are
        appended zero-masked; the fields come from verl's stage output (surrogate signals only)."""
        from verl_gdro.integration.reads import padded_numpy as read_tokens

        extra: dict[str, np.ndarray] = {}
        if self.needs_log_probs:
            assert consumed.dropped()[0].size == 0
            for key in self.token_fields:
                extra["ref_log_probs" if key == "ref_log_prob" else key] = read_tokens(b.gdro.batch[key], rows)
        return extra


#: What ``--profile`` times inside the GDRO step: (module, class or None, function names).
PROFILED = (
    ("verl_gdro.classifier", "OnlineDifficultyClassifier", ("bins", "observe_prepared")),
    ("verl_gdro.classifier", "_VisitHistory", ("slots",)),
    ("verl_gdro.prompt_gdro", "PromptGDRO", ("bin_multipliers", "update")),
    ("verl_gdro.allocators.base", "RolloutGDRO", ("plan", "update")),
    ("verl_gdro.allocators.per_prompt", "PerPrompt", ("plan",)),
    ("verl_gdro.step.controller", "GDROController", ("decide", "adopt", "advantage_multipliers",
                                                           "after_advantage")),
    ("verl_gdro.step.observe", None, ("step_metrics_prepared",)),
    ("verl_gdro.integration.ledger", "DispatchLedger", ("dispatch", "begin_update", "finish_update")),
    ("verl_gdro.integration.glue", None, ("real_rows", "acc_from_extra_fields", "correctness", "consume",
                                          "observe_update", "flow_metrics")),
)


class Profiler:
    """Cumulative seconds in each :data:`PROFILED` function while installed (``--profile``).

    A ``perf_counter`` pair around each call (~1 us of its own per call): where the GDRO step's
    time goes, measured inside the benchmark's own step (cold caches after verl's [N, T] passes),
    which a profiler's per-line overhead would distort.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> Profiler:
        import functools
        import importlib

        for module_name, cls_name, names in PROFILED:
            module = importlib.import_module(module_name)
            owner = module if cls_name is None else getattr(module, cls_name)
            for name in names:
                fn = getattr(owner, name)
                label = f"{cls_name or module_name.rsplit('.', 1)[-1]}.{name}"

                def timed(*a: Any, _fn: Any = fn, _label: str = label, **k: Any) -> Any:
                    t = time.perf_counter()
                    try:
                        return _fn(*a, **k)
                    finally:
                        self.seconds[_label] = self.seconds.get(_label, 0.0) + time.perf_counter() - t

                # an inherited method (GDROController.decide is StepPlanner's) is removed again on
                # exit, not set on the subclass: what the class holds afterwards is what it held
                self._saved.append((owner, name, fn if name in vars(owner) else None))
                setattr(owner, name, functools.wraps(fn)(timed))
        return self

    def __exit__(self, *exc: Any) -> None:
        for owner, name, fn in reversed(self._saved):
            if fn is None:
                delattr(owner, name)
            else:
                setattr(owner, name, fn)
        self._saved.clear()


def measure(
    shape: Shape, adversary: str, preset: str, width: int, reps: int, warmup: int, history: int, seed: int,
    profile: bool = False, pause_gc: bool = True, variant: str = "",
) -> Row:
    rng = np.random.default_rng(seed)
    bench = Bench(adversary, preset, width, rng, history, parse_overrides(variant))
    tokens = TokenArrays(shape.prompts * N_MEAN, width, rng)
    row = Row(shape=shape.name, adversary=adversary, preset=preset, variant=variant)
    profiler = Profiler() if profile else None
    for i in range(warmup + reps):
        if profiler is not None and i == warmup:
            profiler.__enter__()
        if pause_gc:
            # Python's collector runs when container allocations cross a count (mostly verl's grpo's
            # per-row tensors and lists), so a full collection of the process's ~10^5 objects lands
            # in whichever timed stage crosses it, and medians moved by ~3 ms with it. Collect
            # between repetitions, untimed, and time both stages with the collector paused.
            gc.collect()
            gc.disable()
        try:
            grpo_s, gdro_s, v1_s, parts = bench.step(shape, tokens, grpo_first=i % 2 == 0)
        finally:
            if pause_gc:
                gc.enable()
        if i >= warmup:
            row.grpo_s.append(grpo_s)
            row.v1_grpo_s.append(v1_s)
            row.gdro_s.append(gdro_s)
            for k, v in parts.items():
                row.parts_s.setdefault(k, []).append(v)
    if profiler is not None:
        profiler.__exit__(None, None, None)
        row.profile_s = {k: v / reps for k, v in sorted(profiler.seconds.items(), key=lambda kv: -kv[1])}
    return row


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------


def steady_allocator() -> bool:
    """Keep freed memory in the process (glibc ``mallopt``): True when applied.

    Each stage writes a fresh [N, T] advantage tensor (16-32 MiB). With glibc's defaults, freed
    blocks of that size go back to the OS (the heap top is trimmed, or they were mapped on their
    own), so the next stage to allocate page-faults all of its output in again: 2-30 ms that
    landed on whichever stage came first after verl's V1 path freed its batch copy, and roughly
    doubled verl's grpo at 512 x 4. Serving every block from the heap (no mmap) and never trimming
    it make every stage reuse warm memory, so both columns time their work, not the allocator's
    history (``--default-malloc`` keeps glibc's defaults).
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    m_trim_threshold, m_mmap_max = -1, -4
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 2**30))


def parse_overrides(variant: str) -> dict[str, Any]:
    """``"rollout.allocator=per_prompt,rollout.arm_utility=failure_weighted"`` -> a dict of dotted
    gdro keys; values are read as YAML scalars (``0.9`` a float, ``null`` None, ``true`` a bool)."""
    import yaml

    out: dict[str, Any] = {}
    for item in filter(None, (x.strip() for x in variant.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--rollout-variant: expected KEY=VALUE[,KEY=VALUE...] (gdro keys), got {item!r}")
        key = key.strip().removeprefix("gdro.")
        out[key] = yaml.safe_load(value.strip())
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small shapes and few repetitions (smoke run)")
    p.add_argument("--reps", type=int, default=None, help="timed repetitions per row (default 11; quick 3)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3; quick 1)")
    p.add_argument("--tokens", type=int, default=None, help="response length (default 4096; quick 256)")
    p.add_argument("--presets", default="robust,paper", help="comma-separated presets (default robust,paper)")
    p.add_argument(
        "--threads", type=int, default=1,
        help="torch threads (default 1: verl's TaskRunner is a Ray actor without num_cpus, so Ray sets "
        "OMP_NUM_THREADS=1 where the advantage stage runs)",
    )
    p.add_argument("--shapes", default=None, help="comma-separated shape names to run (default: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--default-malloc", action="store_true",
                   help="keep glibc's default allocator settings (default: steady_allocator(), so no stage "
                        "page-faults its output in because another stage's memory went back to the OS)")
    p.add_argument("--with-gc", action="store_true",
                   help="leave Python's automatic garbage collection on while timing (default: collect between "
                        "repetitions and pause it during each step, so a collection triggered by any stage's "
                        "allocations does not land in whichever stage happens to cross the threshold)")
    p.add_argument("--profile", action="store_true",
                   help="also print the mean time per step in each controller / glue function (timing wrappers)")
    p.add_argument("--rollout-variant", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE...]",
                   help="also time Rollout-GDRO with these gdro overrides, e.g. "
                        "rollout.allocator=per_prompt,rollout.arm_utility=failure_weighted (repeatable; the "
                        "default-allocator rows always run and give the headline ratios)")
    args = p.parse_args(argv)
    for variant in args.rollout_variant:
        parse_overrides(variant)  # refuse a malformed variant before any timing
    return args


def bench_shapes(args: argparse.Namespace) -> list[Shape]:
    """The batch shapes of the run (``--quick``: small ones; ``--shapes``: a subset by name)."""
    shapes = (
        [Shape("32x4", 32, N_MEAN), Shape("32xvar", 32, None)]
        if args.quick
        else [Shape("256x4", 256, N_MEAN), Shape("512x4", 512, N_MEAN), Shape("512xvar", 512, None)]
    )
    if args.shapes:
        wanted = {x.strip() for x in args.shapes.split(",")}
        shapes = [s for s in shapes if s.name in wanted]
    return shapes


def measure_all(args: argparse.Namespace, presets: list[str], width: int) -> list[Row]:
    """Every (shape, adversary, preset, variant) row, printed as it is measured."""
    reps = args.reps or (3 if args.quick else 11)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    history = 3 if args.quick else 100
    rows: list[Row] = []
    for si, shape in enumerate(bench_shapes(args)):
        for adversary in ("prompt", "rollout"):
            if adversary == "rollout" and shape.n is None:
                continue  # Rollout-GDRO's batches are variable-n by construction (its allocation)
            variants = [""] + (args.rollout_variant if adversary == "rollout" else [])
            for preset, variant in ((p, v) for v in variants for p in presets):
                row = measure(shape, adversary, preset, width, reps, warmup, history, args.seed + si, args.profile,
                              pause_gc=not args.with_gc, variant=variant)
                rows.append(row)
                parts = "  ".join(f"{k}={statistics.median(v):.4f}" for k, v in row.parts_s.items())
                label = preset + (f" [{variant}]" if variant else "")
                print(
                    f"{shape.name:>16}  {adversary + '-GDRO':<12} {label:<7} grpo {row.grpo:8.4f} s  "
                    f"gdro {row.gdro:8.4f} s  ratio {row.ratio:5.2f}x (of minima {row.ratio_min:5.2f}x, "
                    f"paired {row.ratio_paired:5.2f}x, "
                    f"target {TARGETS[adversary]:.2f}x; vs verl V1 grpo path {row.ratio_v1:5.2f}x)  [{parts}]",
                    flush=True,
                )
                if row.profile_s:
                    print("      profile (ms/step, nested calls count in their callers too): " + "  ".join(
                        f"{k}={v * 1e3:.3f}" for k, v in row.profile_s.items()), flush=True)
    return rows


def summarise(rows: list[Row], presets: list[str], variants: list[str]) -> dict[str, Any]:
    """The worst ratio per adversary and preset (the targets' figure), and the paper's."""

    def worst(adversary: str, preset: str, variant: str = "") -> float:
        vals = [r.ratio for r in rows if r.adversary == adversary and r.preset == preset and r.variant == variant]
        return max(vals) if vals else math.nan

    headline = "robust" if "robust" in presets else presets[0]
    return {
        "prompt_gdro_ratio": worst("prompt", headline),
        "rollout_gdro_ratio": worst("rollout", headline),
        "preset": headline,
        "ratios_by_preset": {p: {"prompt": worst("prompt", p), "rollout": worst("rollout", p)} for p in presets},
        "rollout_variants": {v: {p: worst("rollout", p, v) for p in presets} for v in variants},
        "targets": TARGETS,
        "paper_seconds": PAPER_SECONDS,
        "paper_ratios": {"prompt": PAPER_SECONDS["prompt"] / PAPER_SECONDS["grpo"],
                         "rollout": PAPER_SECONDS["rollout"] / PAPER_SECONDS["grpo"]},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    # importing the estimator registers gdro_grpo with verl (the plugin entry point does the same)
    import torch

    import verl_gdro.integration.estimator  # noqa: F401

    torch.set_num_threads(args.threads)
    steady = False if args.default_malloc else steady_allocator()
    width = args.tokens or (256 if args.quick else 4096)
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    print(
        f"verl-gdro overhead benchmark: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"responses of {width} tokens, {args.reps or (3 if args.quick else 11)} reps after "
        f"{args.warmup if args.warmup is not None else (1 if args.quick else 3)} warm-up, median seconds, "
        f"garbage collector {'on' if args.with_gc else 'paused while timing'}, "
        f"allocator {'steady (heap only, no trimming)' if steady else 'glibc defaults'}"
    )
    rows = measure_all(args, presets, width)
    summary = summarise(rows, presets, args.rollout_variant)
    summary.update(tokens=width, gc_paused=not args.with_gc, steady_allocator=steady,
                   torch_threads=torch.get_num_threads(), quick=args.quick, rows=[r.as_dict() for r in rows])
    for p in presets:
        r = summary["ratios_by_preset"][p]
        print(
            f"worst ratio, preset {p}: Prompt-GDRO {r['prompt']:.2f}x (target {TARGETS['prompt']}x), "
            f"Rollout-GDRO {r['rollout']:.2f}x (target {TARGETS['rollout']}x); paper: "
            f"{summary['paper_ratios']['prompt']:.1f}x and {summary['paper_ratios']['rollout']:.1f}x"
        )
        for v in args.rollout_variant:
            print(f"worst ratio, preset {p}, Rollout-GDRO [{v}]: {summary['rollout_variants'][v][p]:.2f}x "
                  f"(target {TARGETS['rollout']}x)")
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
