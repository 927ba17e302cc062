"""Digest of every value the GDRO trainer's path produces on a synthetic run (issue 13).

Speed work on the controllers, the glue and the ledger must keep results bit-identical. This
runs the trainer's per-step path on synthetic batches, exactly as ``benchmarks/overhead.py``
times it (``decide`` and the ledger's ``dispatch``; ``consume``; the multipliers into verl's
``compute_advantage`` with ``gdro_grpo``; ``observe_update``: ``after_advantage``, ``flow_metrics``), with DAPO-style
filtered groups every third step, and hashes the values of every decision, multiplier,
advantage, metric (but ``controller_time_s``) and the final controller state. Run it at two
commits and compare the digests:

    .venv/bin/python benchmarks/trainer_path_digest.py --out before.json   # at the old commit
    .venv/bin/python benchmarks/trainer_path_digest.py --compare before.json

Values are hashed through a canonical text form (``repr`` of Python numbers, raw bytes of
arrays), so equal values give equal digests whatever objects hold them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import numpy as np

CONFIGS = [(preset, adversary, prompts) for preset in ("robust", "paper") for adversary in ("prompt", "rollout", "joint")
           for prompts in (64, 256)]


def canonical(x: Any) -> Any:
    """A value-only form of nested dicts / lists / arrays / numbers (object identity plays no part)."""
    if isinstance(x, dict):
        return {str(k): canonical(v) for k, v in sorted(x.items())}
    if isinstance(x, (list, tuple)):
        return [canonical(v) for v in x]
    if isinstance(x, np.ndarray):
        return (str(x.dtype), list(x.shape), x.tobytes().hex())
    if isinstance(x, np.generic):
        return repr(x.item())
    return repr(x)


def digest(preset: str, adversary: str, prompts: int, steps: int = 60, width: int = 8) -> str:
    """sha256 of every value of ``steps`` synthetic trainer steps of one configuration."""
    import torch
    from omegaconf import OmegaConf

    import verl_gdro.integration.estimator  # noqa: F401  (registers gdro_grpo)
    from verl_gdro.integration.ledger import DispatchLedger
    from verl_gdro.step.controller import GDROController

    torch.set_num_threads(1)
    rng = np.random.default_rng(prompts + len(adversary))
    group = {"preset": preset, "prompt": {"enable": adversary != "rollout"},
             "rollout": {"enable": adversary != "prompt"}}
    ctrl = GDROController.from_config(group, rollout_n=4)
    ledger = DispatchLedger()
    algo = OmegaConf.create({"adv_estimator": "gdro_grpo", "norm_adv_by_std_in_grpo": True, "gdro": group})
    true_p = rng.beta(0.35, 0.5, size=2000)
    record: list[Any] = []
    for step in range(1, steps + 1):
        plan, data, uids, acc_kept = generate(ctrl, ledger, rng, true_p, prompts, step, width)
        mult, metrics = advantage_stage(ctrl, ledger, algo, data, uids, acc_kept, step)
        metrics.pop("gdro/controller_time_s")
        record.append([plan.bins, plan.rollout_n, mult, data.batch["advantages"].numpy(), metrics])
    record.append(ctrl.state_dict())
    return hashlib.sha256(repr(canonical(record)).encode()).hexdigest()


def generate(ctrl: Any, ledger: Any, rng: np.random.Generator, true_p: np.ndarray, prompts: int, step: int,
             width: int) -> tuple[Any, Any, list[str], np.ndarray]:
    """Decide and dispatch a step, draw its outcomes, filter two groups every third step (the
    replay buffer's DAPO filter, before the advantage stage) and build the kept rows' batch."""
    from verl_gdro.step.context import uid_keys

    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    from overhead import TokenArrays, make_batch

    stable = rng.choice(2000, size=prompts, replace=False).astype(np.int64)
    verl_uids = [str(uuid.UUID(int=int(rng.integers(2**63)))) for _ in range(prompts)]
    plan = ctrl.decide(stable)
    n = plan.rollout_n
    ledger.dispatch(verl_uids, plan.uids, plan.bins, n, step=step)
    acc = (rng.random(int(n.sum())) < np.repeat(true_p[stable], n)).astype(np.float64)
    keep = np.ones(prompts, dtype=bool)
    if step % 3 == 0:
        starts = np.concatenate([[0], np.cumsum(n)[:-1]])
        for j in (1, 5):
            ledger.drop(verl_uids[j], acc[starts[j]:starts[j] + n[j]].tolist(), "filtered")
            keep[j] = False
    rows_kept = np.repeat(keep, n)
    acc_kept = acc[rows_kept]
    tokens = TokenArrays(int(rows_kept.sum()), width, rng)
    data = make_batch(tokens, np.array(verl_uids, dtype=object)[keep], n[keep], acc_kept)
    uids = uid_keys(np.repeat(np.array(verl_uids, dtype=object), n)[rows_kept].tolist())
    return plan, data, uids, acc_kept


def advantage_stage(ctrl: Any, ledger: Any, algo: Any, data: Any, uids: list[str], acc_kept: np.ndarray,
                    step: int) -> tuple[np.ndarray, dict[str, Any]]:
    """The trainer's ``_compute_advantage``: consume, multipliers, verl's stage with ``gdro_grpo``,
    the controller's update (before the estimator for the failure rate, after it with the token
    arrays for the surrogate signals)."""
    from verl.trainer.ppo.ray_trainer import compute_advantage

    from verl_gdro.integration.glue import acc_from_extra_fields, consume, observe_update
    from verl_gdro.integration.reads import padded_numpy as _padded_numpy
    from verl_gdro.step.context import gdro_step

    consumed = consume(ledger, ctrl, uids, [{} for _ in uids])
    values, _ = acc_from_extra_fields([{"reward_extra_info": {"acc": a}} for a in acc_kept.tolist()],
                                      consumed.rows, "acc")
    assert values is not None
    mult = ctrl.advantage_multipliers(consumed.group_index)
    table, row_plan = consumed.estimator_inputs(mult)
    dropped_index, _ = consumed.dropped()
    if ctrl.settings.prompt.loss_signal == "failure_rate":
        metrics = observe_update(ledger, ctrl, consumed, values, step)
    with gdro_step(table, settings=ctrl.settings, rows=row_plan, norm_adv_by_std=True):
        compute_advantage(data, "gdro_grpo", norm_adv_by_std_in_grpo=True, config=algo)
    if ctrl.settings.prompt.loss_signal != "failure_rate":
        extra: dict[str, np.ndarray] = {}
        for name, key in (("response_mask", "response_mask"), ("old_log_probs", "old_log_probs"),
                          ("advantages", "advantages"), ("ref_log_probs", "ref_log_prob")):
            arr = _padded_numpy(data.batch[key], consumed.rows)
            if dropped_index.size:  # as the trainer pads the removed groups' token rows
                arr = np.concatenate([arr, np.zeros((dropped_index.size, arr.shape[1]), dtype=arr.dtype)])
            extra[name] = arr
        metrics = observe_update(ledger, ctrl, consumed, values, step, **extra)  # after: reads the advantages
    return mult, metrics


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--out", help="write the digests to this JSON file")
    p.add_argument("--compare", help="JSON file of digests to compare with (exit 1 when any differs)")
    p.add_argument("--configs", default=None, help="comma-separated preset/adversary/prompts, e.g. robust/prompt/64")
    args = p.parse_args(argv)
    configs = CONFIGS
    if args.configs:
        wanted = {c.strip() for c in args.configs.split(",")}
        configs = [c for c in CONFIGS if f"{c[0]}/{c[1]}/{c[2]}" in wanted]
    digests = {}
    for preset, adversary, prompts in configs:
        key = f"{preset}/{adversary}/{prompts}"
        digests[key] = digest(preset, adversary, prompts, steps=args.steps)
        print(f"{key:>22}  {digests[key][:16]}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(digests, indent=1) + "\n")
    if args.compare:
        before = json.loads(Path(args.compare).read_text())
        differ = [k for k in digests if before.get(k) != digests[k]]
        print("identical" if not differ else f"DIFFERENT: {differ}")
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
