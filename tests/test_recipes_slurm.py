"""The SLURM sbatch template (run against stub srun/scontrol/ray) and the sweep submit helper."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _load_sweep():
    spec = importlib.util.spec_from_file_location("submit_sweep", REPO / "scripts" / "submit_sweep.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


sweep = _load_sweep()


def test_sweep_is_methods_x_models_x_seeds_with_grpo_once_per_preset_set():
    jobs = sweep.build_jobs(
        ["grpo", "prompt_gdro", "rollout_gdro"],
        ["1.7b", "4b", "8b"],
        [0, 1],
        ["robust", "paper"],
        partition="gpu",
    )
    # per model and seed: GRPO once + 2 GDRO methods x 2 presets
    assert len(jobs) == 3 * 2 * (1 + 2 * 2)
    names = [next(a for a in j if a.startswith("--job-name=")) for j in jobs]
    assert len(set(names)) == len(names)
    j8 = next(j for j in jobs if "--job-name=gdro_rollout_gdro_qwen3_8b_paper_s1" in j)
    assert "--nodes=2" in j8 and "--partition=gpu" in j8 and j8[0] == "sbatch"
    export = next(a for a in j8 if a.startswith("--export="))
    assert "RECIPE=rollout_gdro_qwen3_8b" in export and "SEED=1" in export and "PRESET=paper" in export
    assert j8[-1].endswith("scripts/slurm/ray_job.sbatch")
    assert (REPO / "recipes" / "rollout_gdro_qwen3_8b.sh").is_file()
    j17 = next(j for j in jobs if "--job-name=gdro_grpo_qwen3_1.7b_s0" in j)
    assert "--nodes=1" in j17


def test_sweep_validates_inputs():
    with pytest.raises(ValueError, match="--methods"):
        sweep.build_jobs(["ppo"], ["4b"], [0], ["robust"])
    with pytest.raises(ValueError, match="--presets"):
        sweep.build_jobs(["grpo"], ["4b"], [0], ["fast"])
    with pytest.raises(ValueError, match="--seeds"):
        sweep.build_jobs(["grpo"], ["4b"], [], ["robust"])
    with pytest.raises(ValueError, match="cannot contain ','"):
        sweep.build_jobs(["grpo"], ["4b"], [0], ["robust"], extra_args="a=1,b=2")


def test_sweep_dry_run_prints_and_submits_nothing(capsys, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("dry run must not call sbatch")

    monkeypatch.setattr(sweep.subprocess, "run", refuse)
    assert (
        sweep.main(
            [
                "--dry-run",
                "--models",
                "4b",
                "--seeds",
                "0",
                "1",
                "2",
                "--nodes",
                "4b=2",
                "--env",
                "DATA_DIR=/data",
            ]
        )
        == 0
    )
    out = capsys.readouterr()
    lines = out.out.strip().splitlines()
    assert len(lines) == 3 * 3 and all(line.startswith("sbatch ") for line in lines)
    assert all("--nodes=2" in line and "DATA_DIR=/data" in line for line in lines)
    assert "9 job(s) listed (dry run)" in out.err


def _stub(path: Path, body: str) -> None:
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)


def test_sbatch_template_starts_head_then_workers_then_the_recipe(tmp_path):
    """Run the sbatch script with stub SLURM/Ray commands: head, workers, recipe on the head."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    _stub(bin_dir / "scontrol", 'printf "gpu-a\\ngpu-b\\ngpu-c\\n"\n')
    _stub(
        bin_dir / "srun",
        f"""
cmd=()
while [[ $# -gt 0 ]]; do
  case $1 in -w) echo "node $2" >> {log}; shift 2;; -*) shift;; *) cmd=("$@"); break;; esac
done
case ${{cmd[0]}} in
  hostname) echo 10.0.0.1;;
  ray) echo "ray ${{cmd[*]:1}}" >> {log};;
  *) "${{cmd[@]}}";;
esac
""",
    )
    _stub(bin_dir / "python3", "echo 24\n")  # the Ray GPU count poll: 3 nodes x 8 GPUs
    argv_out = tmp_path / "argv"
    _stub(tmp_path / "py_capture", f'printf "%s\\n" "$@" > {argv_out}\n')
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "gpu-[a-c]",
        "SLURM_JOB_NUM_NODES": "3",
        "RECIPE": "prompt_gdro_qwen3_8b",
        "REPO_DIR": str(REPO),
        "VENV": str(venv),
        "PYTHON": str(tmp_path / "py_capture"),
        "RAY_HEAD_WAIT": "0",
        "RAY_POLL_S": "0",
        "EXTRA_ARGS": "trainer.total_training_steps=5",
        "DATA_DIR": "/data",
    }
    res = subprocess.run(
        ["bash", str(REPO / "scripts" / "slurm" / "ray_job.sbatch")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    calls = log.read_text()
    assert "ray start --head --node-ip-address=10.0.0.1 --port=6379 --num-gpus=8" in calls
    assert calls.count("ray start --address=10.0.0.1:6379") == 2
    assert "node gpu-b" in calls and "node gpu-c" in calls
    argv = argv_out.read_text().splitlines()
    assert argv[:2] == ["-m", "verl.trainer.main_ppo"]
    assert "+experiment=prompt_gdro_qwen3_8b" in argv and "trainer.nnodes=3" in argv
    assert "trainer.n_gpus_per_node=8" in argv and argv[-1] == "trainer.total_training_steps=5"
    assert "24 of 24 GPUs" in res.stdout
