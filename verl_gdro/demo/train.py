"""The demo's training: the supervised warm start and one GRPO / GDRO run, built from verl's parts.

The RL step is a miniature of verl's pipeline, in one process, reusing verl wherever it runs on
CPU and the *same* GDRO code path as the ``gdro_sync`` trainer:

1. classify the step's prompts and allocate rollouts: ``GDROController.before_generation``;
2. sample ``n_i`` responses per prompt at temperature 1.0 (the exact budget is asserted);
3. score with verl's ``math_dapo`` (reward = its +-1 score, correctness = its ``acc``);
4. old / reference log-probs; a verl ``DataProto``; advantages from verl's own
   ``compute_advantage`` with ``adv_estimator="gdro_grpo"`` and the Prompt-GDRO multipliers handed
   over through ``gdro_step`` (GRPO = the same estimator with multipliers 1);
5. ``GDROController.after_advantage``: classifier visit, controller updates, ``gdro/`` metrics;
6. policy update: verl's registered ``vanilla`` policy loss (clip 0.2 / 0.28), ``agg_loss``, and
   the ``low_var_kl`` penalty (``kl_penalty``) against the frozen warm start.

torch and verl are imported here, not in the CLI module, so ``verl-gdro --help`` stays fast.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl_gdro.integration.policy_loss import raw_grpo_advantages, update_surrogate_per_response
from verl_gdro.step.sampler import PromptSampler

from .config import DemoConfig, method_gdro_group
from .model import build_model, encode_prompts, response_log_probs, sample
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


class MethodRun:
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

        from verl_gdro.step.controller import GDROController

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
        self.rollouts = 0
        # what the study reports beside accuracy: distinct prompts trained on, generated tokens
        self.trained_uids: set[int] = set()
        self.response_tokens = 0

    # -- batches: reshuffled every epoch from (seed, epoch), so resuming needs only the step; a
    # sampling mode draws from the controller's evidence instead (its generator is checkpointed) --
    def prompt_batch(self, step: int) -> list[Problem]:
        b = self.cfg.batch_prompts
        if self.sampler is not None:
            return [self.train_set[i] for i in self.sampler.draw(b)]
        per_epoch = len(self.train_set) // b
        epoch, pos = divmod(step, per_epoch)
        order = np.random.default_rng([self.seed, epoch, 7]).permutation(len(self.train_set))
        return [self.train_set[i] for i in order[pos * b : (pos + 1) * b]]

    def train_step(self) -> dict[str, float]:
        """One RL step; returns the step's metrics (``gdro/`` plus ``train/`` and ``actor/``)."""
        from verl import DataProto
        from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn, kl_penalty
        from verl.trainer.ppo.ray_trainer import compute_advantage

        from verl_gdro.step.context import gdro_step

        cfg, tok = self.cfg, self.tok
        t0 = time.perf_counter()
        problems = self.prompt_batch(self.step)
        plan = self.ctrl.before_generation(np.array([p.uid for p in problems], dtype=np.int64))
        n = plan.rollout_n.astype(int)
        budget = cfg.n_mean * len(problems)
        if int(n.sum()) != budget:
            raise AssertionError(f"{self.method}: step {self.step} used {int(n.sum())} rollouts, budget is {budget}")
        group_index = np.repeat(plan.positions, n)
        rows = [problems[i] for i in np.repeat(np.arange(len(problems)), n)]
        ids, mask = encode_prompts(tok, [prompt_text(p) for p in rows])
        ro = sample(self.model, ids, mask, cfg.response_tokens, tok.eos_token_id, tok.pad_token_id, self.gen, cfg.temperature)
        t_gen = time.perf_counter() - t0

        scores = [_score(tok.decode(ro.responses[i]), p) for i, p in enumerate(rows)]
        acc = np.array([s[1] for s in scores], dtype=np.float64)
        reward = torch.tensor([s[0] for s in scores], dtype=torch.float32)
        resp_mask = ro.response_mask.float()
        last = (ro.response_mask.sum(1) - 1).clamp(min=0)
        token_rewards = torch.zeros_like(resp_mask)
        token_rewards[torch.arange(len(rows)), last] = reward

        input_ids, attn = ro.input_ids, ro.attention_mask
        R = ro.responses.shape[1]
        self.model.train()
        # One mini-batch = verl with ppo_mini_batch_size = train_batch_size: the update is on-policy,
        # so the old log-probs ARE the first forward's (dropout is 0), and one forward serves both.
        on_policy = cfg.mini_batches == 1
        lp_first = response_log_probs(self.model, input_ids, attn, R) if on_policy else None
        with torch.no_grad():
            if on_policy:
                old_lp = lp_first.detach()
            else:
                old_lp = response_log_probs(self.model, input_ids, attn, R)
            # the reference forward only when something reads it (the KL penalty or Eq. 6's KL)
            ref_lp = response_log_probs(self.ref, input_ids, attn, R) if self._needs_ref else old_lp
        uid_str = np.array([f"{self.step}-{g}" for g in group_index], dtype=object)
        data = DataProto.from_dict(
            tensors={
                "responses": ro.responses,
                "input_ids": input_ids,
                "attention_mask": attn,
                "response_mask": resp_mask,
                "token_level_scores": token_rewards,
                "token_level_rewards": token_rewards,
                "old_log_probs": old_lp,
                "ref_log_prob": ref_lp,
            },
            non_tensors={"uid": uid_str, "index": np.array([p.uid for p in rows], dtype=np.int64)},
        )
        mult = self.ctrl.advantage_multipliers(group_index)
        with gdro_step(uids=uid_str, values=mult):
            data = compute_advantage(data, adv_estimator="gdro_grpo", config=self.algo_cfg)
        adv = data.batch["advantages"]
        metrics = self.ctrl.after_advantage(
            group_index,
            acc,
            response_mask=resp_mask.numpy(),
            old_log_probs=old_lp.numpy(),
            ref_log_probs=ref_lp.numpy(),
            advantages=adv.numpy(),
        )
        if self.sampler is not None:  # the draw itself (gdro/draw/*), as the verl trainer logs it
            metrics.update(self.sampler.draw_metrics())

        # policy update: one epoch over `mini_batches` shuffled mini-batches (verl's actor loop)
        policy_loss_fn = get_policy_loss_fn("vanilla")
        perm = torch.randperm(len(rows), generator=self.gen)
        pg_losses, kls, clipfracs = [], [], []
        # update_surrogate: each response's clipped surrogate on the raw advantages, measured on its
        # mini-batch before that mini-batch's optimizer step (what the verl actor's loss measures)
        update_losses = np.full(len(rows), np.nan) if self.ctrl.wants_update_losses else None
        raw_adv = None
        if update_losses is not None:
            raw_adv = raw_grpo_advantages(token_rewards, uid_str)
        for chunk in torch.chunk(perm, cfg.mini_batches):
            if on_policy:
                chunk = slice(None)  # the whole batch, in the order lp_first was computed
                lp = lp_first
            else:
                lp = response_log_probs(self.model, input_ids[chunk], attn[chunk], R)
            m = resp_mask[chunk]
            if update_losses is not None:
                idx = np.arange(len(rows))[chunk] if isinstance(chunk, slice) else chunk.numpy()
                update_losses[idx] = update_surrogate_per_response(
                    lp.detach(), old_lp[chunk], raw_adv[chunk], m, cfg.clip_ratio_low, cfg.clip_ratio_high
                )
            pg_loss, pg_metrics = policy_loss_fn(
                old_log_prob=old_lp[chunk],
                log_prob=lp,
                advantages=adv[chunk],
                response_mask=m,
                loss_agg_mode=cfg.loss_agg_mode,
                config=self.actor_cfg,
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

        if update_losses is not None:
            metrics.update(self.ctrl.after_update(group_index, update_losses))
        self.rollouts += int(n.sum())
        self.step += 1
        self.trained_uids.update(int(p.uid) for p in problems)
        self.response_tokens += int(ro.response_mask.sum())
        metrics.update(
            {
                "train/reward": float(reward.mean()),
                "train/acc": float(acc.mean()),
                "train/rollouts_total": float(self.rollouts),
                "train/distinct_prompts": float(len(self.trained_uids)),
                "train/response_tokens_total": float(self.response_tokens),
                "actor/pg_loss": float(np.mean(pg_losses)),
                "actor/kl_loss": float(np.mean(kls)) if kls else 0.0,
                "actor/pg_clipfrac": float(np.mean(clipfracs)),
                "timing/gen_s": t_gen,
                "timing/step_s": time.perf_counter() - t0,
            }
        )
        return metrics

    # -- checkpoint --
    def state_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "seed": self.seed,
            "step": self.step,
            "rollouts": self.rollouts,
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
        self.trained_uids = set(state.get("trained_uids", ()))
        self.response_tokens = int(state.get("response_tokens", 0))


def _score(response: str, problem: Problem) -> tuple[float, float]:
    """(shaped reward, acc) from verl's math_dapo: the reward trains, acc feeds the controllers."""
    from verl.utils.reward_score.math_dapo import compute_score

    out = compute_score(response, problem.answer)
    return float(out["score"]), float(bool(out["acc"]))

