"""The SLURM sbatch template (run against stub srun/scontrol/ray) and the sweep submit helper."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _load_sweep():
    spec = importlib.util.spec_from_file_location("submit_sweep", REPO / "scripts" / "submit_sweep.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = mod  # dataclasses look their module up there
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
    names = [next(a for a in j.argv if a.startswith("--job-name=")) for j in jobs]
    assert len(set(names)) == len(names)
    j8 = next(j for j in jobs if "--job-name=gdro_rollout_gdro_qwen3_8b_paper_s1" in j.argv)
    assert "--nodes=2" in j8.argv and "--partition=gpu" in j8.argv and j8.argv[0] == "sbatch"
    assert "--export=ALL" in j8.argv
    assert (j8.env["RECIPE"], j8.env["SEED"], j8.env["PRESET"]) == ("rollout_gdro_qwen3_8b", "1", "paper")
    assert j8.argv[-1].endswith("scripts/slurm/ray_job.sbatch")
    assert f"--output={REPO / 'logs'}/%x-%j.out" in j8.argv
    assert (REPO / "recipes" / "rollout_gdro_qwen3_8b.sh").is_file()
    j17 = next(j for j in jobs if "--job-name=gdro_grpo_qwen3_1.7b_s0" in j.argv)
    assert "--nodes=1" in j17.argv


def test_sweep_nodes_come_from_each_recipe():
    """The node count is the recipe's own NNODES default (one source), unless --nodes overrides it."""
    for method in sweep.METHODS:
        for model, want in (("1.7b", 1), ("4b", 1), ("8b", 2)):
            assert sweep.recipe_nodes(f"{method}_qwen3_{model}") == want
    (job,) = sweep.build_jobs(["joint"], ["8b"], [0], ["robust"], nodes={"8b": 4})
    assert "--nodes=4" in job.argv


def test_sweep_validates_inputs():
    with pytest.raises(ValueError, match="--methods"):
        sweep.build_jobs(["ppo"], ["4b"], [0], ["robust"])
    with pytest.raises(ValueError, match="--presets"):
        sweep.build_jobs(["grpo"], ["4b"], [0], ["fast"])
    with pytest.raises(ValueError, match="--seeds"):
        sweep.build_jobs(["grpo"], ["4b"], [], ["robust"])


def test_sweep_dry_run_prints_and_submits_nothing(capsys, monkeypatch, tmp_path):
    def refuse(*a, **k):
        raise AssertionError("dry run must not call sbatch")

    monkeypatch.setattr(sweep.subprocess, "run", refuse)
    logs = tmp_path / "logs"
    assert (
        sweep.main(
            ["--dry-run", "--no-validate", "--models", "4b", "--seeds", "0", "1", "2", "--nodes", "4b=2", "--env", "DATA_DIR=/data",
             "--log-dir", str(logs)]
        )
        == 0
    )
    out = capsys.readouterr()
    lines = out.out.strip().splitlines()
    assert len(lines) == 3 * 3 and all(" sbatch " in line for line in lines)
    assert all("--nodes=2" in line and "DATA_DIR=/data" in line for line in lines)
    assert "9 job(s) listed (dry run)" in out.err and "validated" not in out.err
    assert not logs.exists()  # a dry run creates nothing


def test_sweep_submits_through_a_fake_sbatch_with_commas_and_the_log_folder(tmp_path):
    """issue 32: a fake ``sbatch`` on PATH records its arguments and environment and checks that
    the ``--output`` folder exists when it is called; values with commas reach the job intact."""
    bin_dir, record = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    record.mkdir()
    _stub(
        bin_dir / "sbatch",
        f"""
out=""
for a in "$@"; do case $a in --output=*) out=${{a#--output=}};; esac; done
[[ -n $out && -d $(dirname "$out") ]] || {{ echo "sbatch: output folder of '$out' missing" >&2; exit 1; }}
n=$(ls {record} | wc -l)
printf '%s\n' "$@" > {record}/$n.argv
printf 'RECIPE=%s\nLOGGER=%s\nEXTRA_ARGS=%s\nDATA_DIR=%s\n' "$RECIPE" "$LOGGER" "$EXTRA_ARGS" "$DATA_DIR" > {record}/$n.env
echo "Submitted batch job 4$n"
""",
    )
    logs = tmp_path / "fresh" / "logs"  # does not exist yet: a fresh checkout
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    res = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "submit_sweep.py"), "--methods", "grpo", "joint", "--models", "8b",
         "--presets", "release", "--log-dir", str(logs), "--env", "LOGGER=[console,wandb]", "DATA_DIR=/data",
         "--extra-args", "gdro.classifier.bin_edges=[0.4,0.75] trainer.total_training_steps=5",
         "--python", str(_ok_python(tmp_path))],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert res.returncode == 0, res.stderr
    assert logs.is_dir()
    envs = sorted(record.glob("*.env"))
    assert len(envs) == 2
    for path in envs:
        got = dict(line.split("=", 1) for line in path.read_text().splitlines())
        assert got["LOGGER"] == "[console,wandb]" and got["DATA_DIR"] == "/data"
        assert got["EXTRA_ARGS"] == "gdro.classifier.bin_edges=[0.4,0.75] trainer.total_training_steps=5"
        argv = path.with_suffix(".argv").read_text().splitlines()
        assert "--nodes=2" in argv and "--export=ALL" in argv and f"--output={logs}/%x-%j.out" in argv
        assert argv[-1] == str(REPO / "scripts" / "slurm" / "ray_job.sbatch")
    assert {dict(line.split("=", 1) for line in p.read_text().splitlines())["RECIPE"] for p in envs} == {
        "grpo_qwen3_8b", "joint_qwen3_8b"}


def _ok_python(tmp_path: Path, fail_on: str = "") -> Path:
    """An interpreter stub for the jobs' validation (``-m verl_gdro.dryrun --each FILE``): keeps FILE,
    refuses the jobs whose arguments contain ``fail_on`` as the dry run would."""
    stub, calls = tmp_path / "validate_python", tmp_path / "validations"
    calls.mkdir(exist_ok=True)
    _stub(stub, f"""
[[ $1 == -m && $2 == verl_gdro.dryrun && $3 == --each ]] || exit 3
cp "$4" {calls}/$(ls {calls} | wc -l).jsonl
n=0; status=0
while IFS= read -r line; do
  if [[ -n "{fail_on}" && $line == *"{fail_on}"* ]]; then
    printf '%s\\tDRY RUN FAILED: gdro.prompt.eta=-1 is invalid\\n' $n; status=2
  fi
  n=$((n+1))
done < "$4"
exit $status
""")
    return stub


def test_sweep_validates_every_job_before_submitting_any(tmp_path, capsys, monkeypatch):
    """issue 36, item 10: --dry-run runs each job's recipe dry run (with its node count, all in one
    process); one refusal prints one line naming the job and submits nothing."""
    import json

    stub = _ok_python(tmp_path)
    assert sweep.main(["--dry-run", "--models", "4b", "8b", "--methods", "joint", "--python", str(stub)]) == 0
    (listing,) = sorted((tmp_path / "validations").glob("*.jsonl"))
    argvs = [json.loads(line) for line in listing.read_text().splitlines()]
    assert len(argvs) == 2 and all("--config-name=gdro_trainer" in a for a in argvs)
    assert {"trainer.nnodes=1", "trainer.nnodes=2"} == {x for a in argvs for x in a if x.startswith("trainer.nnodes=")}
    assert "2 job(s) validated, listed (dry run)" in capsys.readouterr().err

    def refuse(argv, **kwargs):
        if argv[0] == "sbatch":
            raise AssertionError("nothing may be submitted")
        return real_run(argv, **kwargs)

    real_run = subprocess.run
    monkeypatch.setattr(sweep.subprocess, "run", refuse)
    bad = _ok_python(tmp_path, fail_on="+experiment=joint_qwen3_8b")
    assert sweep.main(["--models", "4b", "8b", "--methods", "joint", "--python", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("submit_sweep.py: error: job gdro_joint_qwen3_8b_robust_s0: DRY RUN FAILED: gdro.prompt.eta=-1 "
                   "is invalid; nothing submitted"), err


@pytest.mark.slow
def test_dry_run_each_validates_every_line_in_one_process(tmp_path, capsys):
    """The real validator behind the sweep: one refusal line per refused job, exit 2."""
    import json

    from verl_gdro.dryrun import main as dryrun_main

    ok = ["--config-path=pkg://verl_gdro.config", "--config-name=gdro_trainer",
          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
          "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
          "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8", "actor_rollout_ref.rollout.name=vllm"]
    listing = tmp_path / "jobs.jsonl"
    listing.write_text(json.dumps(ok) + "\n" + json.dumps([*ok, "gdro.prompt.eta=-1"]) + "\n")
    assert dryrun_main(["--each", str(listing)]) == 2
    assert capsys.readouterr().out == "1\tDRY RUN FAILED: gdro.prompt.eta=-1 is invalid: must be a finite number > 0.0\n"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--nodes", "8b=x"], "--nodes 8b=x is invalid"),
        (["--nodes", "9b=2"], "--nodes 9b=2 is invalid"),
        (["--env", "DATA_DIR"], "--env expects KEY=VALUE, got 'DATA_DIR'"),
        (["--presets", "fast"], "argument --presets: invalid choice: 'fast'"),
        (["--gpus-per-node", "0"], "argument --gpus-per-node: 0 is invalid"),
    ],
)
def test_sweep_bad_values_get_one_line(args, needle):
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "submit_sweep.py"), "--dry-run", *args],
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert needle in res.stderr.strip().splitlines()[-1], res.stderr


def test_sweep_flags_all_have_help():
    actions = [a for a in sweep.build_parser()._actions if a.option_strings]
    assert all(a.help for a in actions), [a.option_strings for a in actions if not a.help]


def test_sbatch_template_logs_to_an_existing_folder_and_nodes_default_to_one():
    """sbatch opens --output before the script runs: the template's default is the submit folder
    itself, and it asks for no node count of its own (1, what the 1.7B and 4B recipes assume)."""
    head = [line for line in (REPO / "scripts" / "slurm" / "ray_job.sbatch").read_text().splitlines()
            if line.startswith("#SBATCH")]
    output = next(line for line in head if "--output=" in line).split("=", 1)[1]
    assert "/" not in output
    assert not any("--nodes" in line for line in head)


def _stub(path: Path, body: str) -> None:
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)


def _sbatch_env(tmp_path: Path) -> tuple[dict[str, str], Path, Path]:
    """Stub SLURM/Ray commands and interpreter; returns (env, call log, argv file)."""
    for old in ("bin", "venv"):
        shutil.rmtree(tmp_path / old, ignore_errors=True)
    (tmp_path / "calls.log").unlink(missing_ok=True)
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
    # the interpreter the recipe runs: records its module in the call log, its argv in argv_out, and
    # refuses the dry run when FAIL_DRY_RUN is set
    _stub(tmp_path / "py_capture", f'echo "python $2" >> {log}\nprintf "%s\\n" "$@" > {argv_out}\n'
                                   '[[ $2 == verl_gdro.dryrun && -n ${FAIL_DRY_RUN:-} ]] && '
                                   '{ echo "DRY RUN FAILED: gdro.prompt.eta=-1 is invalid" >&2; exit 2; }\nexit 0\n')
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
        "EXTRA_ARGS": "gdro.classifier.bin_edges=[0.4,0.75] trainer.total_training_steps=5",
        "DATA_DIR": "/data",
    }
    return env, log, argv_out


def _run_sbatch(tmp_path: Path, **extra: str) -> tuple[subprocess.CompletedProcess, str, list[str]]:
    env, log, argv_out = _sbatch_env(tmp_path)
    res = subprocess.run(["bash", str(REPO / "scripts" / "slurm" / "ray_job.sbatch")], env={**env, **extra},
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    calls = log.read_text() if log.exists() else ""
    return res, calls, argv_out.read_text().splitlines() if argv_out.exists() else []


def test_sbatch_template_starts_head_then_workers_then_the_recipe(tmp_path):
    """Run the sbatch script with stub SLURM/Ray commands: head, workers, recipe on the head."""
    env, log, argv_out = _sbatch_env(tmp_path)
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
    assert argv[-2] == "gdro.classifier.bin_edges=[0.4,0.75]"  # one word, unglobbed
    assert "24 of 24 GPUs" in res.stdout
    # fewer nodes than the recipe's model needs: refused before Ray starts
    small = subprocess.run(
        ["bash", str(REPO / "scripts" / "slurm" / "ray_job.sbatch")],
        env={**env, "SLURM_JOB_NUM_NODES": "1"}, cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )
    assert small.returncode == 2 and "sbatch --nodes=2" in small.stderr, small.stderr


def test_sbatch_template_validates_before_starting_ray(tmp_path):
    """issue 36, item 10: the recipe's dry run runs first, with the allocation's node count; a config
    it refuses ends the job before any Ray process starts; DRY_RUN=1 stops after it."""
    res, calls, argv = _run_sbatch(tmp_path)
    assert res.returncode == 0, res.stderr
    assert calls.index("python verl_gdro.dryrun") < calls.index("ray start --head") < calls.index(
        "python verl.trainer.main_ppo")
    bad, calls, _ = _run_sbatch(tmp_path, FAIL_DRY_RUN="1")
    assert bad.returncode == 2 and "ray start" not in calls and "main_ppo" not in calls, calls
    assert "Ray was not started" in bad.stderr and "gdro.prompt.eta=-1" in bad.stderr
    dry, calls, argv = _run_sbatch(tmp_path, DRY_RUN="1")
    assert dry.returncode == 0 and "ray start" not in calls and "main_ppo" not in calls, calls
    assert "trainer.nnodes=3" in argv and argv[-1] == "trainer.total_training_steps=5"


def test_documented_launches_keep_the_file_logger_plot_reads():
    """issue 36, item 15: ``verl-gdro plot`` reads verl's ``file`` logger; every documented LOGGER of
    a launch keeps it."""
    import re

    for doc in ("docs/multinode.md", "scripts/slurm/ray_job.sbatch"):
        text = (REPO / doc).read_text(encoding="utf-8")
        launches = re.findall(r"LOGGER='(\[[^']*\])'", text)
        assert launches, doc
        assert all("file" in value.strip("[]").split(",") for value in launches), (doc, launches)
