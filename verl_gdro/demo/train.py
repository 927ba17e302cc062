"""The demo's training: the supervised warm start and one GRPO / GDRO run, built from verl's parts.

The RL step is a miniature of verl's pipeline, in one process, reusing verl wherever it runs on
CPU and the *same* GDRO code path as the ``gdro_sync`` trainer:

1. draw the step's prompts (the epoch order, or the GDRO sampler under a sampling mode); for each
   generation call classify them and allocate their rollouts at the controller state of that
   moment (``GDROController.decide``, the exact budget asserted);
2. sample ``n_i`` responses per prompt at temperature 1.0;
3. score with verl's ``math_dapo`` (reward = its +-1 score, correctness = its ``acc``); under
   DAPO's dynamic sampling (``dynamic_sampling=true``, verl_gdro/demo/dynamic.py) drop the groups
   whose metric is all-equal and generate more calls, excluding the step's prompts, until the
   batch is full; every generated rollout is counted;
4. adopt the trained groups, then the dropped ones, into one plan (``GDROController.adopt``);
   old / reference log-probs; a verl ``DataProto``; advantages from verl's own
   ``compute_advantage`` with ``adv_estimator="gdro_grpo"`` and the Prompt-GDRO multipliers handed
   over through ``gdro_step`` (GRPO = the same estimator with multipliers 1);
5. ``GDROController.after_advantage`` with every generated group: classifier visit, controller
   updates, ``gdro/`` metrics;
6. policy update: verl's registered ``vanilla`` policy loss (clip 0.2 / 0.28), ``agg_loss``, and
   the ``low_var_kl`` penalty (``kl_penalty``) against the frozen warm start, over ``mini_batches``
   mini-batches split in batch order (verl's default ``actor.shuffle=false``; ``shuffle=true``
   permutes them).

torch and verl are imported here, not in the CLI module, so ``verl-gdro --help`` stays fast.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl_gdro.integration.policy_loss import raw_grpo_advantages, update_surrogate_per_response
from verl_gdro.step.controller import GDROController
from verl_gdro.step.sampler import PromptSampler

from .config import DemoConfig, DynamicSampling, method_gdro_group, method_steps, method_study_keys
from .dynamic import GenCall, cat_rollouts, select_trained, take_rows
from .model import Rollouts, build_model, encode_prompts, response_log_probs, sample
from .task import Problem, get_task, pass_at_k, prompt_text, response_text
from .tokenizer import CharTokenizer

__all__ = ["MethodRun", "evaluate", "warm_start", "warm_start_cache_dir"]


# ------------------------------------------------------------------------------------------------
# batching helpers
# ------------------------------------------------------------------------------------------------


def _sft_batch(tok: CharTokenizer, problems: Sequence[Problem], width: int) -> tuple[torch.Tensor, ...]:
    ids, mask = encode_prompts(tok, [prompt_text(p) for p in problems])
    resp = torch.full((len(problems), width), tok.pad_token_id, dtype=torch.long)
    rmask = torch.zeros_like(resp)
    for i, p in enumerate(problems):
        s = tok.encode(response_text(p)) + [tok.eos_token_id]
        resp[i, : len(s)] = torch.tensor(s)
        rmask[i, : len(s)] = 1
    return ids, mask, resp, rmask


def _set_rng(seed: int) -> None:
    torch.manual_seed(seed)


# ------------------------------------------------------------------------------------------------
# warm start
# ------------------------------------------------------------------------------------------------


def warm_start_cache_dir() -> Path:
    """Where warm starts are shared between runs (``VERL_GDRO_CACHE``, default ``~/.cache/verl-gdro``).

    The warm start is a pure function of its settings (seeded), so reusing it across run
    directories changes nothing but the wall time.
    """
    return Path(os.environ.get("VERL_GDRO_CACHE", Path.home() / ".cache" / "verl-gdro"))


def warm_start(cfg: DemoConfig, tok: CharTokenizer, path: Path, log: Callable[[str], None] = print) -> dict:
    """Supervised warm start on freshly drawn problems, cached at ``path`` (and in the shared cache).

    Why: RL from a random policy has no reward signal; the paper starts from a base model that
    already solves part of the task. The warm start sees every level equally often, from its own
    random stream (not the RL train list), so that the policy begins with graded, non-zero success
    across levels rather than a solved easy level and nothing else. Returns the model's state
    dict; every method and seed starts from exactly these weights.
    """
    key = _sft_key(cfg)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    shared = warm_start_cache_dir() / f"demo_warm_start_{digest}.pt"
    for candidate in (path, shared):
        if candidate.exists():
            try:
                blob = torch.load(candidate, map_location="cpu", weights_only=False)
            except Exception:  # a torn file from a killed run: recompute
                continue
            if blob.get("config") == key:
                log(f"warm start: cached at {candidate}")
                if candidate != path:
                    _save_atomic(blob, path)
                return blob["state_dict"]
    t0 = time.perf_counter()
    model = build_model(tok.vocab_size, cfg.hidden, cfg.layers, seed=1234)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.sft_lr, weight_decay=0.0)
    warmup = min(50, cfg.sft_steps)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * max(0.1, 1 - s / cfg.sft_steps)
    )
    rng = np.random.default_rng(4321)
    task = get_task(cfg.task)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(4321)
        for step in range(cfg.sft_steps):
            levels = rng.integers(0, task.num_levels, cfg.sft_batch)
            probs = [task.problem(rng, int(lv), -1) for lv in levels]
            if cfg.sft_noise > 0:
                probs = [_corrupt(p, cfg.sft_noise, rng) for p in probs]
            ids, mask, resp, rmask = _sft_batch(tok, probs, cfg.response_tokens)
            model.train()
            lp = response_log_probs(model, torch.cat([ids, resp], 1), torch.cat([mask, rmask], 1), resp.shape[1])
            loss = -(lp * rmask).sum() / rmask.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            if (step + 1) % 100 == 0:
                log(f"warm start: step {step + 1}/{cfg.sft_steps} loss {loss.item():.3f} ({time.perf_counter() - t0:.0f}s)")
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    blob = {"config": key, "state_dict": state}
    _save_atomic(blob, path)
    try:
        _save_atomic(blob, shared)
    except OSError:  # a read-only home is no reason to fail the run
        pass
    log(f"warm start: {cfg.sft_steps} steps in {time.perf_counter() - t0:.1f}s")
    return state


def _corrupt(problem: Problem, rate: float, rng: np.random.Generator) -> Problem:
    """The problem with each answer digit replaced by a random digit with probability ``rate``.

    Why: a warm start fitted to clean targets is sharp (its wrong answers are wrong for every
    sample) or, under-trained, has not learned the skill; RL with verifiable rewards is for the
    regime between, where the right answer is among the policy's samples but not its only one
    (pass@8 well above mean@8). Digit noise in the supervised targets puts a base model's noisy
    habits into the warm start: problem-independent, so what RL removes on the train set it removes
    on held-out problems too, and compounding with answer length, so hard levels stay hard.
    """
    digits = [str(int(rng.integers(0, 10))) if ch.isdigit() and rng.random() < rate else ch for ch in problem.answer]
    return Problem(uid=problem.uid, level=problem.level, question=problem.question, answer="".join(digits))


def _save_atomic(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _sft_key(cfg: DemoConfig) -> dict:
    keys = ("task", "hidden", "layers", "sft_steps", "sft_batch", "sft_lr", "sft_noise")
    levels = [list(lv) for lv in get_task(cfg.task).levels]
    key = {"levels": levels, "version": 2, **{k: getattr(cfg, k) for k in keys}}
    return {**key, "max_new_tokens": cfg.response_tokens}


# ------------------------------------------------------------------------------------------------
# evaluation
# ------------------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, tok: CharTokenizer, problems: Sequence[Problem], cfg: DemoConfig, seed: int
) -> dict[str, Any]:
    """``eval_samples`` samples per held-out problem: pooled pass@8 (unbiased), mean@8, per level.

    pass@8 is the mean over problems of the unbiased estimator 1 - C(n-c, 8) / C(n, 8) (n =
    ``eval_samples``); mean@8 is the mean correctness; ``levels`` holds each level's mean
    correctness and ``worst_level_acc`` the smallest of them (the GDRO objective's worst group).
    """
    gen = torch.Generator().manual_seed(10_000 + seed)
    k = cfg.eval_samples
    rows = [p for p in problems for _ in range(k)]
    correct = np.zeros(len(rows))
    for start in range(0, len(rows), cfg.eval_batch):
        chunk = rows[start : start + cfg.eval_batch]
        ids, mask = encode_prompts(tok, [prompt_text(p) for p in chunk])
        r = sample(model, ids, mask, cfg.response_tokens, tok.eos_token_id, tok.pad_token_id, gen, cfg.eval_temperature)
        for i, p in enumerate(chunk):
            correct[start + i] = _score(tok.decode(r.responses[i]), p)[1]
    per_problem = correct.reshape(len(problems), k)
    c = per_problem.sum(1).astype(int)
    levels = np.array([p.level for p in problems])
    # level keys are strings, as they are after a JSON round trip (a resumed run reads them back)
    level_acc = {str(lv): float(per_problem[levels == lv].mean()) for lv in sorted(set(levels.tolist()))}
    level_pass = {
        str(lv): float(np.mean([pass_at_k(k, int(ci), 8) for ci in c[levels == lv]])) for lv in sorted(set(levels.tolist()))
    }
    return {
        "pass@8": float(np.mean([pass_at_k(k, int(ci), 8) for ci in c])),
        "mean@8": float(per_problem.mean()),
        "level_acc": level_acc,
        "level_pass@8": level_pass,
        "worst_level_acc": float(min(level_acc.values())),
        "worst_level": int(min(level_acc, key=level_acc.__getitem__)),
    }


# ------------------------------------------------------------------------------------------------
# one method's RL run
# ------------------------------------------------------------------------------------------------


@dataclass
class _StepRows:
    """A step's generated groups, in plan order (trained groups first), and their rows in that order."""

    problems: list[Problem]  # per group, in generation order
    n: np.ndarray  # [G] responses per group
    trained: np.ndarray  # [G] trained (kept and within the batch)
    informative: np.ndarray  # [G] not all-equal on the filter metric (all True without the filter)
    rollouts: Rollouts  # [rows] trained rows first
    acc: np.ndarray  # [rows]
    reward: np.ndarray  # [rows]
    group_index: np.ndarray  # [rows] plan positions
    num_trained_rows: int
    uids: np.ndarray  # [rows] stable prompt ids


class _StepGeneration:
    """The generation half of a step (prompts, generation calls, the step's plan), apart from the
    update half in :class:`MethodRun`. Attributes come from :class:`MethodRun`."""

    cfg: DemoConfig
    tok: CharTokenizer
    train_set: list[Problem]
    seed: int
    method: str
    step: int
    cursor: int
    _order: tuple[int, np.ndarray] | None
    sampler: PromptSampler | None
    dynamic: DynamicSampling
    model: torch.nn.Module
    gen: torch.Generator
    ctrl: GDROController
    rollouts: int
    trained_rollouts: int
    trained_uids: set[int]
    response_tokens: int

    # -- prompts: an epoch order reshuffled from (seed, epoch) and read at a cursor (the step's
    # batch and any refills), so resuming needs only the cursor; a sampling mode draws from the
    # controller's evidence instead (its generator is checkpointed) --
    def _epoch_order(self, epoch: int) -> np.ndarray:
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, np.random.default_rng([self.seed, epoch, 7]).permutation(len(self.train_set)))
        return self._order[1]

    def _draw(self, size: int, drawn: set[int]) -> list[int]:
        """``size`` rows of the training set not in ``drawn`` (the step's earlier prompts)."""
        if self.sampler is not None:
            exclude = np.fromiter(drawn, dtype=np.int64, count=len(drawn)) if drawn else None
            return [int(i) for i in self.sampler.draw(size, exclude=exclude)]
        b = self.cfg.batch_prompts
        per_epoch = (len(self.train_set) // b) * b
        rows: list[int] = []
        while len(rows) < size:
            epoch, pos = divmod(self.cursor, per_epoch)
            row = int(self._epoch_order(epoch)[pos])
            self.cursor += 1
            if row not in drawn and row not in rows:
                rows.append(row)
        return rows

    def _generate_call(self, problems: list[Problem]) -> GenCall:
        """One generation call: decide (classify, allocate the call's exact budget), sample, score."""
        cfg, tok = self.cfg, self.tok
        plan = self.ctrl.decide(np.array([p.uid for p in problems], dtype=np.int64))
        n = plan.rollout_n.astype(int)
        budget = cfg.n_mean * len(problems)
        if int(n.sum()) != budget:
            raise AssertionError(f"{self.method}: step {self.step} used {int(n.sum())} rollouts, budget is {budget}")
        rows = [problems[i] for i in np.repeat(np.arange(len(problems)), n)]
        ids, mask = encode_prompts(tok, [prompt_text(p) for p in rows])
        ro = sample(self.model, ids, mask, cfg.response_tokens, tok.eos_token_id, tok.pad_token_id, self.gen, cfg.temperature)
        scores = [_score(tok.decode(ro.responses[i]), p) for i, p in enumerate(rows)]
        return GenCall(
            problems=problems, bins=plan.bins, rollout_n=n, rollouts=ro,
            acc=np.array([s[1] for s in scores], dtype=np.float64),
            reward=np.array([s[0] for s in scores], dtype=np.float64),
        )

    def _generate(self) -> list[GenCall]:
        """The step's generation calls: one, or under dynamic sampling as many as fill the batch."""
        b, ds = self.cfg.batch_prompts, self.dynamic
        calls: list[GenCall] = []
        drawn: set[int] = set()
        kept, credit, want = 0, 0, ds.call_size(b)
        while True:
            size = min(want, len(self.train_set) - len(drawn))
            if size == 0:  # every training prompt was drawn in this step: nothing left to refill with
                break
            rows = self._draw(size, drawn)
            drawn.update(rows)
            calls.append(self._generate_call([self.train_set[i] for i in rows]))
            informative = int(calls[-1].informative(ds.metric).sum())
            kept += informative
            if ds.done(kept, len(calls), b):
                break
            want, credit = ds.refill_size(b, kept, size - informative, credit)
        return calls

    def _plan_step(self, calls: list[GenCall]) -> _StepRows:
        """Adopt the trained groups, then the filtered and surplus ones, into one controller plan
        (dispatch-time decisions), as the trainer's consume does; the rows in that order."""
        ds = self.dynamic
        inform = np.concatenate([c.informative(ds.metric) for c in calls])
        trained = select_trained(inform, self.cfg.batch_prompts) if ds.enable else np.ones(inform.size, bool)
        problems = [p for c in calls for p in c.problems]
        n = np.concatenate([c.rollout_n for c in calls])
        bins = np.concatenate([c.bins for c in calls])
        order = np.concatenate([np.flatnonzero(trained), np.flatnonzero(~trained)])
        positions = np.empty(order.size, dtype=np.int64)
        positions[order] = self.ctrl.adopt(
            np.array([problems[g].uid for g in order], dtype=np.int64), bins[order], n[order]
        )
        group_of_row = np.repeat(np.arange(len(problems)), n)
        row_trained = trained[group_of_row]
        rows = np.concatenate([np.flatnonzero(row_trained), np.flatnonzero(~row_trained)])
        return _StepRows(
            problems=problems, n=n, trained=trained, informative=inform,
            rollouts=take_rows(cat_rollouts([c.rollouts for c in calls], self.tok.pad_token_id), rows),
            acc=np.concatenate([c.acc for c in calls])[rows],
            reward=np.concatenate([c.reward for c in calls])[rows],
            group_index=positions[group_of_row[rows]],
            num_trained_rows=int(row_trained.sum()),
            uids=np.array([problems[g].uid for g in group_of_row[rows]], dtype=np.int64),
        )


    def _count_step(self, calls: list[GenCall], sr: _StepRows, ro: Rollouts) -> dict[str, float]:
        """Advance the counters; the ``train/`` metrics, generated rollouts (the compute axis)
        beside the trained ones."""
        generated = int(sr.n.sum())
        trained = sr.num_trained_rows
        self.rollouts += generated
        self.trained_rollouts += trained
        self.step += 1
        self.trained_uids.update(int(sr.problems[g].uid) for g in np.flatnonzero(sr.trained))
        self.response_tokens += int(sum(int(c.rollouts.response_mask.sum()) for c in calls))
        k = sr.num_trained_rows
        return {
            "train/reward": float(sr.reward[:k].mean()) if k else 0.0,
            "train/acc": float(sr.acc[:k].mean()) if k else 0.0,
            "train/generated_acc": float(sr.acc.mean()),
            "train/rollouts_total": float(self.rollouts),
            "train/trained_rollouts_total": float(self.trained_rollouts),
            "train/generated_rollouts": float(generated),
            "train/gen_calls": float(len(calls)),
            "train/filtered_share": float(1.0 - sr.informative.mean()),
            "train/surplus_groups": float(int(sr.informative.sum()) - int(sr.trained.sum())),
            "train/trained_groups": float(sr.trained.sum()),
            "train/short_batch": float(int(sr.trained.sum()) < self.cfg.batch_prompts),
            "train/distinct_prompts": float(len(self.trained_uids)),
            "train/response_tokens_total": float(self.response_tokens),
        }


class MethodRun(_StepGeneration):
    """One method x seed: policy, frozen reference, optimizer, GDRO controller and RNG streams.

    Everything that decides the run's future lives in :meth:`state_dict` (model, optimizer,
    controller, the sampling generator, the step), so a run resumed from its checkpoint makes
    bit-identical decisions (issue 6).
    """

    def __init__(
        self,
        method: str,
        seed: int,
        cfg: DemoConfig,
        tok: CharTokenizer,
        train_set: Sequence[Problem],
        init_state: dict[str, torch.Tensor],
    ) -> None:
        from omegaconf import OmegaConf

        self.method, self.seed, self.cfg, self.tok = method, seed, cfg, tok
        self.train_set = list(train_set)
        _set_rng(seed)
        self.model = build_model(tok.vocab_size, cfg.hidden, cfg.layers)
        self.model.load_state_dict(init_state)
        self.ref = copy.deepcopy(self.model).eval()
        for p in self.ref.parameters():
            p.requires_grad_(False)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=0.0)
        self.gdro_group = method_gdro_group(cfg.method_spec(method), seed, cfg.gdro)
        # DAPO's dynamic sampling (verl's algorithm.filter_groups): the study's --set, then the arm's own keys
        self.dynamic = DynamicSampling.from_settings(cfg.to_dict(), method_study_keys(cfg.method_spec(method)))
        self.steps = method_steps(cfg.method_spec(method), cfg.steps)  # the arm's run length
        self.ctrl = GDROController.from_config(self.gdro_group, rollout_n=cfg.n_mean)
        # a sampling mode draws the batches through the step API's sampler, as the verl trainer does
        self.sampler: PromptSampler | None = None
        if self.ctrl.resamples:
            uids = np.array([p.uid for p in self.train_set], dtype=np.int64)
            self.sampler = PromptSampler(self.ctrl, uids, seed=seed * 1_000_003 + 29)
        # verl's `algorithm` group as the estimator sees it, and the actor's loss settings.
        self.algo_cfg = OmegaConf.create(
            {"adv_estimator": "gdro_grpo", "norm_adv_by_std_in_grpo": True, "gdro": self.gdro_group}
        )
        self.actor_cfg = OmegaConf.create(
            {
                "clip_ratio": cfg.clip_ratio_low,
                "clip_ratio_low": cfg.clip_ratio_low,
                "clip_ratio_high": cfg.clip_ratio_high,
                "clip_ratio_c": 3.0,
                "global_batch_info": {},
            }
        )
        self.gen = torch.Generator().manual_seed(seed * 1_000_003 + 17)
        settings = self.ctrl.settings
        self._needs_ref = cfg.kl_coef > 0 or (settings.prompt.enable and settings.prompt.loss_signal == "surrogate_kl")
        self.step = 0
        #: generated rollouts (trained, filtered and surplus alike): the study's compute axis
        self.rollouts = 0
        self.trained_rollouts = 0
        #: position in the stream of epoch orders (the step's batch, then its refills)
        self.cursor = 0
        self._order: tuple[int, np.ndarray] | None = None
        # what the study reports beside accuracy: distinct prompts trained on, generated tokens
        self.trained_uids: set[int] = set()
        self.response_tokens = 0

    def train_step(self) -> dict[str, float]:
        """One RL step; returns the step's metrics (``gdro/`` plus ``train/`` and ``actor/``)."""
        t0 = time.perf_counter()
        calls = self._generate()
        sr = self._plan_step(calls)
        t_gen = time.perf_counter() - t0
        k = sr.num_trained_rows
        ro = take_rows(sr.rollouts, np.arange(k))
        resp_mask = ro.response_mask.float()
        last = (ro.response_mask.sum(1) - 1).clamp(min=0)
        token_rewards = torch.zeros_like(resp_mask)
        token_rewards[torch.arange(k), last] = torch.tensor(sr.reward[:k], dtype=torch.float32)
        self.model.train()
        # One mini-batch = verl with ppo_mini_batch_size = train_batch_size: the update is on-policy,
        # so the old log-probs ARE the first forward's (dropout is 0), and one forward serves both.
        lp_first, old_lp, ref_lp = self._log_probs(ro)
        uid_str = np.array([f"{self.step}-{g}" for g in sr.group_index[:k]], dtype=object)
        adv = self._advantages(ro, resp_mask, token_rewards, old_lp, ref_lp, uid_str, sr)
        metrics = self._observe(sr, resp_mask, old_lp, ref_lp, adv)
        if self.sampler is not None:  # the draw itself (gdro/draw/*), as the verl trainer logs it
            metrics.update(self.sampler.draw_metrics())
        actor, update_losses = self._update(ro, resp_mask, token_rewards, lp_first, old_lp, ref_lp, adv, uid_str, sr)
        if update_losses is not None:
            metrics.update(self.ctrl.after_update(sr.group_index[:k], update_losses))
        metrics.update(actor)
        metrics.update(self._count_step(calls, sr, ro))
        metrics.update({"timing/gen_s": t_gen, "timing/step_s": time.perf_counter() - t0})
        return metrics

    def _log_probs(self, ro: Rollouts) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """(the on-policy forward with its graph or None, old log-probs, reference log-probs)."""
        R = ro.responses.shape[1]
        input_ids, attn = ro.input_ids, ro.attention_mask
        on_policy = self.cfg.mini_batches == 1
        lp_first = response_log_probs(self.model, input_ids, attn, R) if on_policy else None
        with torch.no_grad():
            old_lp = lp_first.detach() if lp_first is not None else response_log_probs(self.model, input_ids, attn, R)
            # the reference forward only when something reads it (the KL penalty or Eq. 6's KL)
            ref_lp = response_log_probs(self.ref, input_ids, attn, R) if self._needs_ref else old_lp
        return lp_first, old_lp, ref_lp

    def _advantages(self, ro: Rollouts, resp_mask: torch.Tensor, token_rewards: torch.Tensor, old_lp: torch.Tensor,
                    ref_lp: torch.Tensor, uid_str: np.ndarray, sr: _StepRows) -> torch.Tensor:
        """verl's ``compute_advantage`` (``gdro_grpo``) on the trained rows, with the multipliers."""
        from verl import DataProto
        from verl.trainer.ppo.ray_trainer import compute_advantage

        from verl_gdro.step.context import gdro_step

        k = sr.num_trained_rows
        data = DataProto.from_dict(
            tensors={
                "responses": ro.responses, "input_ids": ro.input_ids, "attention_mask": ro.attention_mask,
                "response_mask": resp_mask, "token_level_scores": token_rewards, "token_level_rewards": token_rewards,
                "old_log_probs": old_lp, "ref_log_prob": ref_lp,
            },
            non_tensors={"uid": uid_str, "index": sr.uids[:k]},
        )
        mult = self.ctrl.advantage_multipliers(sr.group_index[:k])
        with gdro_step(uids=uid_str, values=mult):
            data = compute_advantage(data, adv_estimator="gdro_grpo", config=self.algo_cfg)
        return data.batch["advantages"]

    def _observe(self, sr: _StepRows, resp_mask: torch.Tensor, old_lp: torch.Tensor, ref_lp: torch.Tensor,
                 adv: torch.Tensor) -> dict[str, float]:
        """The controllers' update with every generated group: the trained rows, then the filtered
        and surplus ones with their correctness (their token fields zero-masked), as the trainer's
        ``observe_update`` does."""
        extra = sr.acc.size - sr.num_trained_rows

        def padded(t: torch.Tensor) -> np.ndarray:
            arr = t.detach().numpy()
            return np.concatenate([arr, np.zeros((extra, arr.shape[1]), arr.dtype)]) if extra else arr

        return self.ctrl.after_advantage(
            sr.group_index, sr.acc, response_mask=padded(resp_mask), old_log_probs=padded(old_lp),
            ref_log_probs=padded(ref_lp), advantages=padded(adv),
        )

    def _update(self, ro: Rollouts, resp_mask: torch.Tensor, token_rewards: torch.Tensor, lp_first: torch.Tensor | None,
                old_lp: torch.Tensor, ref_lp: torch.Tensor, adv: torch.Tensor, uid_str: np.ndarray,
                sr: _StepRows) -> tuple[dict[str, float], np.ndarray | None]:
        """The policy update: one epoch over ``mini_batches`` mini-batches, split in batch order as
        verl's actor does by default (``actor.shuffle=false``), or shuffled (``shuffle=true``)."""
        from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn, kl_penalty

        cfg = self.cfg
        size = sr.num_trained_rows
        if size == 0:  # a short step whose every group was filtered: nothing to train on
            return {"actor/pg_loss": 0.0, "actor/kl_loss": 0.0, "actor/pg_clipfrac": 0.0}, None
        order = torch.randperm(size, generator=self.gen) if cfg.shuffle else torch.arange(size)
        policy_loss_fn = get_policy_loss_fn("vanilla")
        pg_losses, kls, clipfracs = [], [], []
        # update_surrogate: each response's clipped surrogate on the raw advantages, measured on its
        # mini-batch before that mini-batch's optimizer step (what the verl actor's loss measures)
        update_losses = np.full(size, np.nan) if self.ctrl.wants_update_losses else None
        raw_adv = raw_grpo_advantages(token_rewards, uid_str) if update_losses is not None else None
        R = ro.responses.shape[1]
        for chunk in torch.chunk(order, cfg.mini_batches):
            if lp_first is not None:
                chunk, lp = slice(None), lp_first  # the whole batch, in the order lp_first was computed
            else:
                lp = response_log_probs(self.model, ro.input_ids[chunk], ro.attention_mask[chunk], R)
            m = resp_mask[chunk]
            if update_losses is not None:
                idx = np.arange(size)[chunk] if isinstance(chunk, slice) else chunk.numpy()
                update_losses[idx] = update_surrogate_per_response(
                    lp.detach(), old_lp[chunk], raw_adv[chunk], m, cfg.clip_ratio_low, cfg.clip_ratio_high
                )
            pg_loss, pg_metrics = policy_loss_fn(
                old_log_prob=old_lp[chunk], log_prob=lp, advantages=adv[chunk], response_mask=m,
                loss_agg_mode=cfg.loss_agg_mode, config=self.actor_cfg,
            )
            loss = pg_loss
            if cfg.kl_coef > 0:
                kl = agg_loss(loss_mat=kl_penalty(lp, ref_lp[chunk], cfg.kl_type), loss_mask=m, loss_agg_mode=cfg.loss_agg_mode)
                loss = pg_loss + cfg.kl_coef * kl
                kls.append(float(kl.detach()))
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            pg_losses.append(float(pg_loss.detach()))
            clipfracs.append(float(pg_metrics["actor/pg_clipfrac"]))
        return {
            "actor/pg_loss": float(np.mean(pg_losses)),
            "actor/kl_loss": float(np.mean(kls)) if kls else 0.0,
            "actor/pg_clipfrac": float(np.mean(clipfracs)),
        }, update_losses

    # -- checkpoint --
    def state_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "seed": self.seed,
            "step": self.step,
            "rollouts": self.rollouts,
            "trained_rollouts": self.trained_rollouts,
            "cursor": self.cursor,
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "controller": self.ctrl.state_dict(),
            "generator": self.gen.get_state(),
            "torch_rng": torch.get_rng_state(),
            "sampler": None if self.sampler is None else self.sampler.state_dict(),
            "trained_uids": sorted(self.trained_uids),
            "response_tokens": self.response_tokens,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state["method"], state["seed"]) != (self.method, self.seed):
            raise ValueError(f"checkpoint of {state['method']}/seed {state['seed']} loaded into {self.method}/seed {self.seed}")
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.ctrl.load_state_dict(state["controller"])
        if self.sampler is not None:
            self.sampler.load_state_dict(state["sampler"])
        self.gen.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        self.step = int(state["step"])
        self.rollouts = int(state["rollouts"])
        self.trained_rollouts = int(state.get("trained_rollouts", self.rollouts))
        self.cursor = int(state.get("cursor", self.step * self.cfg.batch_prompts))
        self.trained_uids = set(state.get("trained_uids", ()))
        self.response_tokens = int(state.get("response_tokens", 0))


def _score(response: str, problem: Problem) -> tuple[float, float]:
    """(shaped reward, acc) from verl's math_dapo: the reward trains, acc feeds the controllers."""
    from verl.utils.reward_score.math_dapo import compute_score

    out = compute_score(response, problem.answer)
    return float(out["score"]), float(bool(out["acc"]))

