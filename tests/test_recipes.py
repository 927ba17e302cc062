"""Every recipe composes and validates (dry run); the GRPO baseline differs only in gdro keys."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from verl_gdro.data.prepare import prepare_all
from verl_gdro.dryrun import compose_config, dry_run, parse_hydra_argv

REPO = Path(__file__).resolve().parent.parent
RECIPES = sorted(p.name for p in (REPO / "recipes").glob("*.sh") if not p.name.startswith("_"))
METHODS = ("grpo", "prompt_gdro", "rollout_gdro", "joint")
MODELS = ("1.7b", "4b", "8b")


def recipe_argv(
    tmp_path: Path, recipe: str, env: dict[str, str] | None = None, args: tuple[str, ...] = ()
) -> list[str]:
    """The argv a recipe passes to its interpreter, captured with a stub PYTHON (no verl import)."""
    out = tmp_path / f"{recipe}.argv"
    stub = tmp_path / "stub_python"
    stub.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > "$ARGV_OUT"\n')
    stub.chmod(0o755)
    full_env = {
        **os.environ,
        "PYTHON": str(stub),
        "ARGV_OUT": str(out),
        "DATA_DIR": str(tmp_path / "data"),
        **(env or {}),
    }
    subprocess.run(["bash", str(REPO / "recipes" / recipe), *args], check=True, env=full_env)
    return out.read_text().splitlines()


def compose(argv: list[str]):
    return compose_config(parse_hydra_argv(argv))


def flat(cfg) -> dict[str, object]:
    """Leaf key -> value of the UNRESOLVED config (interpolations compared as written)."""
    out: dict[str, object] = {}

    def walk(node, prefix):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        else:
            out[prefix] = node

    walk(OmegaConf.to_container(cfg, resolve=False), "")
    return out


def test_one_recipe_per_method_and_model():
    assert RECIPES == sorted(f"{m}_qwen3_{s}.sh" for m in METHODS for s in MODELS)
    experiments = sorted(p.stem for p in (REPO / "hydra_configs" / "experiment").glob("*.yaml"))
    assert experiments == sorted(r[:-3] for r in RECIPES)


def test_recipe_calls_verl_main_ppo_and_dry_run_with_the_same_arguments(tmp_path):
    launch = recipe_argv(tmp_path, "prompt_gdro_qwen3_4b.sh", args=("trainer.total_training_steps=7",))
    dry = recipe_argv(
        tmp_path, "prompt_gdro_qwen3_4b.sh", env={"DRY_RUN": "1"}, args=("trainer.total_training_steps=7",)
    )
    assert launch[:2] == ["-m", "verl.trainer.main_ppo"]
    assert dry[:2] == ["-m", "verl_gdro.dryrun"]
    assert launch[2:] == dry[2:]
    assert "--config-name=gdro_trainer" in launch and "+experiment=prompt_gdro_qwen3_4b" in launch
    assert launch[-1] == "trainer.total_training_steps=7"  # "$@" passed through, last wins
    env = recipe_argv(tmp_path, "grpo_qwen3_8b.sh", env={"NNODES": "4", "GPUS_PER_NODE": "4", "SEED": "3"})
    assert {"trainer.nnodes=4", "trainer.n_gpus_per_node=4", "seed=3"} <= set(env)
    assert "trainer.experiment_name=grpo_qwen3_8b_robust_answer_seed3" in env


def test_appendix_a_settings(tmp_path):
    cfg = compose(recipe_argv(tmp_path, "prompt_gdro_qwen3_4b.sh")[2:])
    a, r = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert cfg.data.train_batch_size == 256 and cfg.trainer.total_training_steps == 1000
    assert a.optim.lr == 1e-6 and a.ppo_mini_batch_size == 128
    assert a.use_kl_loss and a.kl_loss_coef == 0.001 and a.kl_loss_type == "low_var_kl"
    assert (a.clip_ratio_low, a.clip_ratio_high) == (0.2, 0.28) and a.strategy == "fsdp"
    assert r.name == "vllm" and r.n == 4 and r.temperature == 1.0 and r.tensor_model_parallel_size == 1
    assert r.dtype == "bfloat16"
    v = r.val_kwargs
    assert (v.n, v.temperature, v.top_p, v.top_k, v.do_sample) == (8, 0.6, 0.8, 20, True)
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length) == (3200, 4096)
    assert cfg.actor_rollout_ref.model.enable_gradient_checkpointing
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen3-4B-Base"
    assert cfg.algorithm.adv_estimator == "gdro_grpo" and cfg.trainer.v1.trainer_mode == "gdro_sync"
    assert cfg.gdro.prompt.kl_coef == a.kl_loss_coef  # one beta_KL
    assert cfg.gdro.advantage_clip == 5.0  # the paper's advantage clip [-5, 5], every method
    assert cfg.reward.custom_reward_function.name == "compute_score_answer"
    assert cfg.data.train_files == f"{tmp_path / 'data'}/answer/train.parquet"
    assert cfg.trainer.validation_data_dir.endswith("/val_generations")


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_grpo_differs_from_gdro_runs_only_in_gdro_keys(tmp_path, model):
    base = flat(compose(recipe_argv(tmp_path, f"grpo_qwen3_{model}.sh", env={"EXP_NAME": "x"})[2:]))
    assert base["gdro.prompt.enable"] is False and base["gdro.rollout.enable"] is False
    for method in METHODS[1:]:
        other = flat(compose(recipe_argv(tmp_path, f"{method}_qwen3_{model}.sh", env={"EXP_NAME": "x"})[2:]))
        assert set(other) == set(base)
        diff = {k for k in base if base[k] != other[k]}
        assert diff and all(k.startswith("gdro.") for k in diff), diff
    # Without EXP_NAME pinned, the only other difference is the run's name.
    a = flat(compose(recipe_argv(tmp_path, f"grpo_qwen3_{model}.sh")[2:]))
    b = flat(compose(recipe_argv(tmp_path, f"rollout_gdro_qwen3_{model}.sh")[2:]))
    assert {k for k in a if a[k] != b[k] and not k.startswith("gdro.")} == {"trainer.experiment_name"}


def test_preset_and_template_are_one_variable_each(tmp_path):
    robust = compose(recipe_argv(tmp_path, "joint_qwen3_1.7b.sh")[2:])
    paper = compose(recipe_argv(tmp_path, "joint_qwen3_1.7b.sh", env={"PRESET": "paper"})[2:])
    assert robust.gdro.preset == "robust" and paper.gdro.preset == "paper"
    assert flat(paper)["trainer.experiment_name"] == "joint_qwen3_1.7b_paper_answer_seed0"
    from verl_gdro.step.config import validate_gdro_config

    assert validate_gdro_config(robust).prompt.loss_signal == "failure_rate"
    s = validate_gdro_config(paper)
    assert s.prompt.loss_signal == "surrogate_kl" and s.rollout.arm_utility == "loss"
    boxed = compose(recipe_argv(tmp_path, "grpo_qwen3_1.7b.sh", env={"TEMPLATE": "boxed"})[2:])
    assert boxed.reward.custom_reward_function.name == "compute_score_boxed"
    assert boxed.prompt_template.scorer == "math_verify"
    assert boxed.data.val_files.endswith("/boxed/val.parquet")


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
def test_dry_run_every_recipe(tmp_path, recipe, capsys):
    argv = recipe_argv(tmp_path, recipe, env={"DRY_RUN": "1"})
    assert argv[:2] == ["-m", "verl_gdro.dryrun"]
    assert dry_run(argv[2:], print_config=True) == 0
    out = capsys.readouterr().out
    assert "=== resolved config ===" in out and "DRY RUN OK" in out
    assert "rollouts per step (exact, = batch * nbar): 1024" in out
    assert "mini-batches (optimizer steps) per step: 2" in out
    assert "mean budget nbar (rollout.n): 4" in out
    if recipe.startswith(("rollout_gdro", "joint")):
        assert "rollout arms per prompt: [2, 12], mean exactly 4" in out
        # the robust default (issue 22's decision), as the dry run names it
        assert "Rollout-GDRO: on (allocator=per_prompt, arm_utility=failure_weighted, rate_decay=0.5)" in out
    else:
        assert "Rollout-GDRO: off (every prompt gets n=4)" in out


@pytest.mark.parametrize(
    ("recipe", "override", "key"),
    [
        ("rollout_gdro_qwen3_1.7b.sh", "gdro.rollout.n_min=1", "gdro.rollout.n_min"),
        ("rollout_gdro_qwen3_1.7b.sh", "actor_rollout_ref.rollout.n=13", "actor_rollout_ref.rollout.n"),
        ("prompt_gdro_qwen3_1.7b.sh", "data.dataloader_num_workers=4", "data.dataloader_num_workers"),
        ("prompt_gdro_qwen3_1.7b.sh", "gdro.prompt.etaa=1", "gdro.prompt.etaa"),
        ("grpo_qwen3_1.7b.sh", "template=latex", "template"),
        ("grpo_qwen3_1.7b.sh", "actor_rollout_ref.actor.ppo_mini_batch_size=100", "ppo_mini_batch_size"),
    ],
)
def test_invalid_override_fails_naming_the_key(tmp_path, capsys, recipe, override, key):
    argv = recipe_argv(tmp_path, recipe, env={"DRY_RUN": "1"}, args=(override,))
    assert dry_run(argv[2:], print_config=False) == 2
    err = capsys.readouterr().err
    assert err.startswith("DRY RUN FAILED:") and key in err, err


@pytest.mark.slow
def test_data_prepared_with_another_template_is_refused(tmp_path, capsys):
    from test_data import loader  # the fixture tables of tests/test_data.py

    prepare_all(tmp_path / "data", template="answer", loader=loader)
    argv = recipe_argv(tmp_path, "grpo_qwen3_1.7b.sh", env={"DRY_RUN": "1"})[2:]
    # 3 fixture rows < one batch of 256: refused (verl would divide by 0 steps per epoch)
    assert dry_run(argv, print_config=False) == 2
    assert "data.train_files has 3 rows, fewer than data.train_batch_size=256" in capsys.readouterr().err
    small = ["data.train_batch_size=3", "actor_rollout_ref.actor.ppo_mini_batch_size=3", "trainer.n_gpus_per_node=4"]
    assert dry_run(argv + small, print_config=False) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "data.train_files" in out and "3 rows, template answer" in out
    assert "gdro.uid_key=index: 3 training rows, unique extra_info.index" in out
    assert "steps per epoch: 1" in out
    # Boxed-prepared rows placed where the answer template's data is expected (defect 5).
    prepare_all(tmp_path / "boxed_data", template="boxed", loader=loader)
    (tmp_path / "data" / "answer" / "val.parquet").unlink()
    pd.read_parquet(tmp_path / "boxed_data" / "boxed" / "val.parquet").to_parquet(
        tmp_path / "data" / "answer" / "val.parquet"
    )
    assert dry_run(argv, print_config=False) == 2
    err = capsys.readouterr().err
    assert "data.val_files" in err and "template ['boxed']" in err and "'answer'" in err
    os.remove(tmp_path / "data" / "answer" / "train.parquet")
    assert (
        dry_run(argv + ["template=boxed", "paths.data_dir=" + str(tmp_path / "nowhere")], require_data=True)
        == 2
    )
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_dry_run_through_bash_end_to_end(tmp_path):
    """The literal user command: DRY_RUN=1 bash recipes/NAME.sh, in a fresh process."""
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "DATA_DIR": str(tmp_path)}
    ok = subprocess.run(
        ["bash", "recipes/rollout_gdro_qwen3_4b.sh", "--quiet"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "DRY RUN OK" in ok.stdout and "rollouts per step (exact, = batch * nbar): 1024" in ok.stdout
    bad = subprocess.run(
        ["bash", "recipes/rollout_gdro_qwen3_4b.sh", "--quiet", "gdro.rollout.n_max=3"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert (
        bad.returncode == 2 and "DRY RUN FAILED" in bad.stderr and "actor_rollout_ref.rollout.n" in bad.stderr
    )


def test_dry_run_cli_namespace_entry(tmp_path, capsys):
    """The ``add_arguments``/``main(args)`` form a ``verl-gdro dry-run`` subcommand would use."""
    import argparse

    from verl_gdro import dryrun

    argv = recipe_argv(
        tmp_path, "rollout_gdro_qwen3_1.7b.sh", env={"DRY_RUN": "1"}, args=("gdro.rollout.n_max=3",)
    )
    parser = argparse.ArgumentParser()
    dryrun.add_arguments(parser)
    ns = parser.parse_args(["--quiet", *argv[2:]])
    assert ns.config_name == "gdro_trainer" and ns.config_dir == [str(REPO / "hydra_configs")]
    from verl_gdro.errors import UsageError

    with pytest.raises(UsageError, match="gdro.rollout.n_max=3"):  # verl-gdro prints it as one usage line
        dryrun.main(ns)


def test_verl_gdro_dry_run_answers_a_bad_key_with_one_line_and_exit_2(tmp_path, capsys):
    """``verl-gdro dry-run`` follows the CLI's convention for bad input (issue 13)."""
    from verl_gdro import cli

    argv = recipe_argv(tmp_path, "prompt_gdro_qwen3_1.7b.sh", env={"DRY_RUN": "1"}, args=("gdro.prompt.eta=-1",))
    assert cli.main(["dry-run", "--quiet", *argv[2:]]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.lstrip().startswith(("warnings.warn", "/"))]
    assert lines == ["verl-gdro dry-run: error: gdro.prompt.eta=-1 is invalid: must be a finite number > 0.0"], err


@pytest.mark.parametrize(
    ("recipe", "extra", "bins"),
    [
        # the release's launch cases (docs/reproduce.md, "The release preset")
        ("prompt_gdro_qwen3_1.7b.sh", [], 3),
        ("prompt_gdro_qwen3_1.7b.sh", ["gdro.classifier.bin_edges=[0.1,0.2,0.4,0.6,0.8,0.9]", "gdro.classifier.window=100"], 7),
        ("rollout_gdro_qwen3_1.7b.sh", [], 3),
        ("rollout_gdro_qwen3_1.7b.sh", ["gdro.classifier.bin_edges=[0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9]"], 10),
    ],
)
def test_release_launch_cases_compose_and_validate(tmp_path, recipe, extra, bins):
    from verl_gdro.step.config import validate_gdro_config

    cfg = compose(recipe_argv(tmp_path, recipe, env={"PRESET": "release"}, args=tuple(extra))[2:])
    s = validate_gdro_config(cfg)
    assert s.preset == "release" and s.num_bins == bins
    assert s.classifier.passk_estimator == "any_of_n" and s.prompt.loss_signal == "update_surrogate"
    name = flat(cfg)["trainer.experiment_name"]
    assert name.startswith(recipe[:-3] + "_release_answer_seed0") and (name.endswith("_seed0") == (not extra))


def test_run_names_carry_every_setting_that_changes_the_run(tmp_path):
    """issue 36, item 13: two different runs never share a checkpoint folder (resume_mode=auto would
    load one's controller into the other after the models load); resuming keeps the name."""

    def name(recipe: str, env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> str:
        argv = recipe_argv(tmp_path, recipe, env={"DRY_RUN": "1", **(env or {})}, args=args)
        return next(a.split("=", 1)[1] for a in argv if a.startswith("trainer.experiment_name="))

    runs = {
        "grpo robust": name("grpo_qwen3_1.7b.sh"),
        "grpo release": name("grpo_qwen3_1.7b.sh", {"PRESET": "release"}),
        "release 3 bins": name("prompt_gdro_qwen3_1.7b.sh", {"PRESET": "release"}),
        "release 7 bins": name("prompt_gdro_qwen3_1.7b.sh", {"PRESET": "release"},
                               ("gdro.classifier.bin_edges=[0.1,0.2,0.4,0.6,0.8,0.9]",)),
        "release 10 bins": name("prompt_gdro_qwen3_1.7b.sh", {"PRESET": "release"},
                                ("gdro.classifier.bin_edges=[0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9]",)),
        "6 bins": name("prompt_gdro_qwen3_1.7b.sh", args=("gdro.classifier.num_bins=6",)),
        "boxed": name("prompt_gdro_qwen3_1.7b.sh", {"TEMPLATE": "boxed"}),
        "seed 1": name("prompt_gdro_qwen3_1.7b.sh", {"SEED": "1"}),
        "robust": name("prompt_gdro_qwen3_1.7b.sh"),
    }
    assert len(set(runs.values())) == len(runs), runs
    assert runs["grpo release"] == "grpo_qwen3_1.7b_release_answer_seed0"
    assert "_b6_" in runs["6 bins"]
    resumed = name("prompt_gdro_qwen3_1.7b.sh", args=("trainer.resume_mode=auto", "trainer.test_freq=5",
                                                     "trainer.logger=[console,file,wandb]"))
    assert resumed == runs["robust"] == "prompt_gdro_qwen3_1.7b_robust_answer_seed0"
    assert name("prompt_gdro_qwen3_1.7b.sh", {"EXP_NAME": "mine"}, ("gdro.prompt.eta=0.3",)) == "mine"


def _table1_rows() -> list[tuple[str, str, str]]:
    """(row, as-run command, default command) of docs/reproduce.md's "Table 1 rows" table."""
    import re

    text = (REPO / "docs" / "reproduce.md").read_text(encoding="utf-8")
    section = text.split("### Table 1 rows: the authors' runs as run, and our default", 1)[1].split("\n### ", 1)[0]
    rows = []
    for line in section.splitlines():
        m = re.match(r"^\| (\S+ [\w-]+) \| `([^`]+)` \| `([^`]+)` \|$", line)
        if m:
            rows.append(m.groups())
    return rows


def _run_command(tmp_path, command: str):
    """Compose the config of a documented ``ENV=... bash recipes/x.sh overrides...`` command."""
    import shlex

    words = shlex.split(command)
    env = {}
    while "=" in words[0]:
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    assert words[0] == "bash" and words[1].startswith("recipes/"), command
    return compose(recipe_argv(tmp_path, Path(words[1]).name, env=env, args=tuple(words[2:]))[2:])


def test_table1_as_run_commands_compose_and_validate(tmp_path):
    from verl_gdro.step.config import validate_gdro_config

    rows = _table1_rows()
    assert sorted(r[0] for r in rows) == sorted(
        f"{m} {meth}" for m in ("1.7B", "4B", "8B") for meth in ("GRPO", "Prompt-GDRO", "Rollout-GDRO")
    )
    for row, as_run, default in rows:
        size, method = row.split()
        recipe = {"GRPO": "grpo", "Prompt-GDRO": "prompt_gdro", "Rollout-GDRO": "rollout_gdro"}[method]
        assert f"recipes/{recipe}_qwen3_{size.lower()}.sh" in as_run and default == f"bash recipes/{recipe}_qwen3_{size.lower()}.sh"
        cfg = _run_command(tmp_path, as_run)
        s = validate_gdro_config(cfg)
        f = flat(cfg)
        assert s.advantage_clip is None, row  # the release's adv_clip keys are read by nothing
        assert "_boxed_seed0" in f["trainer.experiment_name"], row  # the release prompt: boxed
        prompts = int(f["data.train_batch_size"])
        mini_batches = prompts // int(f["actor_rollout_ref.actor.ppo_mini_batch_size"])
        if method == "Rollout-GDRO":
            assert (prompts, f["trainer.total_training_steps"], mini_batches) == (256, 1000, 2), row
            assert s.preset == "release" and s.rollout.enable and not s.prompt.enable
            assert s.rollout.allocator == "release_as_run" and s.classifier.hysteresis == 0.0
        else:
            assert (prompts, f["trainer.total_training_steps"], mini_batches) == (512, 500, 4), row
            if method == "Prompt-GDRO":
                assert s.preset == "release" and s.prompt.enable and not s.rollout.enable
                assert s.prompt.loss_signal == "update_surrogate" and s.prompt.mix_support == "present"
            else:
                assert not s.prompt.enable and not s.rollout.enable
        d = validate_gdro_config(_run_command(tmp_path, default))
        assert d.preset == "robust", row
