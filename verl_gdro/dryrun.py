"""Dry run of a training launch: compose, validate, print, exit; no Ray, no GPU, no model.

``DRY_RUN=1 bash recipes/NAME.sh`` runs it with exactly the arguments the recipe would give
``verl.trainer.main_ppo``, so what is checked is what would be launched: the config composed as main_ppo
composes it, verl's GPU-free checks, ours (the driver's and the trainer's start-up checks), the data
files present here. Exit 0 when valid, else 2 with one ``DRY RUN FAILED: <reason>`` line on stderr.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class DryRunError(Exception):
    """A configuration the launch would refuse (or should refuse); the message says why."""


@contextmanager
def _refused(what: str = "", errors: tuple[type[Exception], ...] = (ValueError,)) -> Iterator[None]:
    """What the block raises (``errors``) as a DryRunError: its message, or ``what: Type: message``."""
    try:
        yield
    except errors as e:
        raise DryRunError(f"{what}: {type(e).__name__}: {e}" if what else str(e)) from e


@dataclass
class HydraArgs:
    """The part of a main_ppo command line that Hydra reads."""

    config_path: str
    config_name: str
    config_dirs: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)


def parse_hydra_argv(argv: list[str]) -> HydraArgs:
    """Split ``--config-path/--config-name/--config-dir`` (both ``--k v`` and ``--k=v``) from overrides."""
    opts: dict[str, Any] = {"config_path": None, "config_name": None, "config_dirs": []}
    names = {"--config-path": "config_path", "-cp": "config_path", "--config-name": "config_name",
             "-cn": "config_name", "--config-dir": "config_dirs", "-cd": "config_dirs"}
    overrides: list[str] = []
    args = iter(argv)
    for arg in args:
        key, eq, value = arg.partition("=")
        if not arg.startswith("-"):
            overrides.append(arg)
        elif key not in names:
            raise DryRunError(f"unsupported option {arg!r} (only Hydra's --config-path/--config-name/--config-dir)")
        elif not eq and (value := next(args, None)) is None:
            raise DryRunError(f"{key} needs a value")
        elif names[key] == "config_dirs":
            opts["config_dirs"].append(value)
        else:
            opts[names[key]] = value
    if not opts["config_path"] or not opts["config_name"]:
        raise DryRunError("--config-path and --config-name are required (as for verl.trainer.main_ppo)")
    return HydraArgs(opts["config_path"], opts["config_name"], opts["config_dirs"], overrides)


def _config_dir(config_path: str) -> str:
    """A filesystem folder for ``config_path`` (``pkg://a.b`` resolved through the package)."""
    if config_path.startswith("pkg://"):
        import importlib

        module = config_path[len("pkg://") :].replace("/", ".")
        parent, _, leaf = module.rpartition(".")
        base = importlib.import_module(parent) if parent else None
        if base is None or not hasattr(base, "__file__"):
            raise DryRunError(f"--config-path={config_path}: cannot locate package {module!r}")
        path = Path(base.__file__).parent / leaf
    else:
        path = Path(config_path.removeprefix("file://"))
    if not path.is_dir():
        raise DryRunError(f"--config-path={config_path}: folder {path} does not exist")
    return str(path.resolve())


def compose_config(args: HydraArgs):
    """Compose the config as ``main_ppo`` would (``--config-dir`` entries prepended to the search path)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    cdir = _config_dir(args.config_path)
    overrides = list(args.overrides)
    if args.config_dirs:
        primary = Path(cdir) / f"{args.config_name}.yaml"
        own = OmegaConf.select(OmegaConf.load(primary), "hydra.searchpath", default=None) if primary.is_file() else None
        extra = [f"file://{Path(d).resolve()}" for d in args.config_dirs]
        for d in args.config_dirs:
            if not Path(d).is_dir():
                raise DryRunError(f"--config-dir={d}: folder does not exist")
        if any(o.startswith("hydra.searchpath=") for o in overrides):
            raise DryRunError("give either --config-dir or a hydra.searchpath override, not both")
        overrides.append("hydra.searchpath=[" + ",".join(extra + list(own or [])) + "]")
    try:
        with initialize_config_dir(config_dir=cdir, version_base=None):
            return compose(config_name=args.config_name, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise DryRunError(unknown_gdro_key(str(e), overrides) or f"Hydra composition failed: {e}") from e


_NOT_OVERRIDABLE = re.compile(r"Could not override '([^']+)'")


def unknown_gdro_key(hydra_message: str, overrides: list[str]) -> str | None:
    """The group's own message (the known keys) for a ``gdro`` / ``algorithm.gdro`` key Hydra cannot
    override because it is unknown (Hydra's answer invites appending the typo with ``+``); None else."""
    from verl_gdro.step.config import estimator_settings, nest, resolve_gdro

    match = _NOT_OVERRIDABLE.search(hydra_message)
    if match is None:
        return None
    key = match.group(1)
    for prefix, resolve in (("gdro.", resolve_gdro), ("algorithm.gdro.", lambda g: estimator_settings({"gdro": g}))):
        if not key.startswith(prefix):
            continue
        try:
            resolve(nest({key[len(prefix) :]: None}))
        except ValueError as e:
            if "is not a known key" in str(e) or "must be a group of keys" in str(e):
                return str(e)
    return None


def verl_checks(cfg) -> list[str]:
    """Run verl's GPU-free config checks; return what was checked. Raises DryRunError naming the part."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    # verl's own function, not the driver's wrapper (which refuses data files the dry run only notes)
    validate_config = getattr(validate_config, "__wrapped__", validate_config)
    with _refused("verl validate_config", (Exception,)):  # verl raises ValueError, AssertionError, ...
        validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    done = ["verl.utils.config.validate_config"]
    for key in ("actor_rollout_ref.rollout", "actor_rollout_ref.rollout.checkpoint_engine"):
        node = OmegaConf.select(cfg, key)
        with _refused(f"{key}: verl dataclass conversion failed", (Exception,)):
            omega_conf_to_dataclass(node)
        done.append(f"{key} -> {node.get('_target_', 'dataclass')}")
    with _refused("reward.custom_reward_function: cannot load", (Exception,)):
        fn = get_custom_reward_fn(cfg)
    if fn is not None:
        done.append(f"reward.custom_reward_function {cfg.reward.custom_reward_function.name} loads")
    return done


def batch_checks(cfg) -> list[str]:
    """Batch arithmetic verl's ``validate_config`` skips under ``use_dynamic_bsz`` (the paper's setting):
    whole mini-batches per step, rollouts that split over the GPUs (else ``_balance_batch`` pads)."""
    bs = int(cfg.data.train_batch_size)
    mini = int(cfg.actor_rollout_ref.actor.ppo_mini_batch_size)
    n = int(cfg.actor_rollout_ref.rollout.n)
    gpus = int(cfg.trainer.nnodes) * int(cfg.trainer.n_gpus_per_node)
    if mini < 1 or bs % mini:
        raise DryRunError(f"actor_rollout_ref.actor.ppo_mini_batch_size={mini} is invalid: data.train_batch_size={bs} "
            "must be a whole multiple of it (one optimizer step per mini-batch)")
    if gpus < 1 or (bs * n) % gpus:
        raise DryRunError(f"trainer.nnodes * trainer.n_gpus_per_node = {gpus} is invalid: the {bs * n} rollouts per "
            "step (data.train_batch_size * actor_rollout_ref.rollout.n) must split evenly over the GPUs")
    return ["batch: mini-batches and GPUs divide the rollouts per step"]


def separate_async_checks(cfg) -> list[str]:
    """verl's own start-up asserts of ``PPOTrainerSeparateAsync`` for ``gdro_separate_async`` (run after Ray
    starts in a launch): its ``__init__`` runs with the base class's worker set-up stubbed out."""
    from omegaconf import OmegaConf

    from verl_gdro.step.config import TRAINER_MODES

    mode = OmegaConf.select(cfg, "trainer.v1.trainer_mode")
    if TRAINER_MODES.get(mode, mode) != "separate_async":
        return []
    import types
    from unittest import mock

    from verl.trainer.ppo.v1 import trainer_separate_async as sep

    def base_init(self, config):  # PPOTrainer.__init__: workers, buffers (not needed for the checks)
        self.config = config
        self.replay_buffer = types.SimpleNamespace(wait_for_sampleable=None, get_sampleable_count=None)

    trainer = object.__new__(sep.PPOTrainerSeparateAsync)
    try:
        with mock.patch.object(sep.PPOTrainer, "__init__", base_init):
            sep.PPOTrainerSeparateAsync.__init__(trainer, OmegaConf.create(OmegaConf.to_container(cfg, resolve=True)))
    except (AssertionError, ValueError, TypeError) as e:
        raise DryRunError(f"trainer.v1.trainer_mode={mode}: verl's PPOTrainerSeparateAsync refuses this config at "
            f"start: {e} (set trainer.v1.separate_async.parameter_sync_step=1, data.train_batch_size equal to "
            "actor_rollout_ref.actor.ppo_mini_batch_size, actor_rollout_ref.rollout.nnodes >= 1 and "
            "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl)") from e
    return ["verl PPOTrainerSeparateAsync start-up checks (batch = sync step x mini-batch, rollout nodes, engine)"]


def gdro_checks(cfg):
    """Our validation of the ``gdro`` group against the rest of the config; the settings the run uses (the
    estimator alone: :func:`estimator_path_settings`, which refuses every key that path does not read)."""
    from verl_gdro.integration.driver import check_launch_keys
    from verl_gdro.integration.estimator_keys import estimator_path_settings, runs_estimator_alone
    from verl_gdro.step.config import validate_gdro_config

    with _refused():
        check_launch_keys(cfg)
        settings = validate_gdro_config(cfg)
        return estimator_path_settings(cfg.algorithm) if runs_estimator_alone(cfg) else settings


#: the ``verl.plugins`` entry point that registers verl-gdro (pyproject.toml)
PLUGIN_ENTRY_POINT = "verl_gdro"


def registration_checks(cfg) -> list[str]:
    """verl-gdro registers through its ``verl.plugins`` entry point unless ``VERL_USE_EXTERNAL_PLUGINS``
    (``auto``, ``none`` or a list of names) leaves it out or it is not installed: refuse that here."""
    from importlib.metadata import entry_points

    from verl_gdro.step.config import ESTIMATOR_NAME, TRAINER_MODES, read_path

    mode = read_path(cfg, "trainer.v1.trainer_mode")
    adv = read_path(cfg, "algorithm.adv_estimator")
    if mode not in TRAINER_MODES and adv != ESTIMATOR_NAME:
        return []
    policy = os.getenv("VERL_USE_EXTERNAL_PLUGINS", "auto").strip().lower()
    allowed = policy == "auto" or PLUGIN_ENTRY_POINT in {p.strip() for p in policy.split(",")}
    installed = any(ep.name == PLUGIN_ENTRY_POINT for ep in entry_points(group="verl.plugins"))
    if not (allowed and installed):  # "none" names no entry point
        why = f"VERL_USE_EXTERNAL_PLUGINS={policy}" if installed else "the verl.plugins entry point is not installed"
        raise DryRunError(f"verl-gdro is not registered with verl ({why}): verl would refuse "
            f"{mode if mode in TRAINER_MODES else ESTIMATOR_NAME!r} after Ray starts; install the package "
            f"(pip install -e .) and unset VERL_USE_EXTERNAL_PLUGINS or include {PLUGIN_ENTRY_POINT} in it")
    return [f"verl-gdro registered through the verl.plugins entry point (VERL_USE_EXTERNAL_PLUGINS={policy})"]


def row_index_checks(cfg) -> list[str]:
    """``gdro.uid_key=row_index``: the dataset class verl would load (``data.custom_cls``, with
    verl's ``get_dataset_class``) must be a ``GDRODataset``."""
    from verl.utils.dataset.rl_dataset import get_dataset_class

    from verl_gdro.integration.dataset import check_row_index_class

    with _refused("data.custom_cls: verl cannot load the dataset class", (Exception,)):
        dataset_cls = get_dataset_class(cfg.data)
    with _refused():
        check_row_index_class(dataset_cls)
    return [f"gdro.uid_key=row_index: data.custom_cls is {dataset_cls.__name__} (a GDRODataset)"]


def data_checks(cfg, settings: Any, require: bool = False) -> tuple[list[str], int | None]:
    """The launch's data checks on the parquet files present here: every row's template is the config's,
    and, where the GDRO trainer reads them, the stable prompt ids (``gdro.uid_key=index``: the trainer's
    own check of the training rows; :func:`row_index_checks`). Returns notes and the training row count
    (None unless every file is here)."""
    import pyarrow.parquet as pq

    from verl_gdro.integration.dataset import stable_ids_from_extra_info
    from verl_gdro.integration.driver import data_files
    from verl_gdro.step.config import TRAINER_MODES, read_path

    template = read_path(cfg, "prompt_template.name")
    ids = settings.enable and read_path(cfg, "trainer.v1.trainer_mode") in TRAINER_MODES
    notes: list[str] = row_index_checks(cfg) if ids and settings.uid_key == "row_index" else []
    train_column: list[Any] | None = []
    for key in ("data.train_files", "data.val_files"):
        for f in data_files(cfg, key):
            p = Path(os.path.expanduser(f))
            if not p.is_file():
                if require:
                    raise DryRunError(f"{key}={f} does not exist{_prepare_hint(cfg, f)}")
                notes.append(f"{key}: {f} not found here (the launch's driver check refuses a missing local file)")
                if key == "data.train_files":
                    train_column = None
                continue
            names = pq.read_schema(p).names
            table = pq.read_table(p, columns=["extra_info"]).column("extra_info").to_pylist() if (
                "extra_info" in names) else [None] * pq.read_metadata(p).num_rows
            if template is not None:
                found = {row.get("template") if isinstance(row, dict) else None for row in table}
                if found != {template}:
                    raise DryRunError(f"{key}: {f} was prepared with template {sorted(map(str, found))} but the "
                        f"config's template is {template!r}: prepare the data with --template {template} or select "
                        f"template={'/'.join(sorted(map(str, found)))}")
            notes.append(f"{key}: {f}: {len(table)} rows" + (f", template {template}" if template else ""))
            if key == "data.train_files" and train_column is not None:
                train_column += table
    train_rows = None if train_column is None else len(train_column)
    if ids and settings.uid_key == "index" and train_column:
        try:
            stable_ids_from_extra_info(train_column)
        except ValueError as e:
            raise DryRunError(f"data.train_files: {e}") from e
        notes.append(f"gdro.uid_key=index: {len(train_column)} training rows, unique extra_info.index")
    if train_rows is not None:
        cap = read_path(cfg, "data.train_max_samples", -1)
        if isinstance(cap, int) and 0 < cap < train_rows:
            train_rows = cap  # verl keeps the first train_max_samples rows
    return notes, train_rows


def _prepare_hint(cfg, path: str) -> str:
    """How to make a missing file: ``scripts/prepare_data.sh`` for the package's own data (a file
    under ``paths.data_dir``), nothing to suggest for one's own."""
    from verl_gdro.step.config import read_path

    data_dir = read_path(cfg, "paths.data_dir")
    if data_dir and Path(os.path.expanduser(path)).resolve().is_relative_to(Path(os.path.expanduser(data_dir)).resolve()):
        return " (run scripts/prepare_data.sh)"
    return ""


def epoch_checks(cfg, train_rows: int | None) -> list[str]:
    """A training set smaller than one batch gives 0 steps per epoch (verl's loader drops the
    incomplete last batch), and verl's ``fit`` then divides by it after the first validation pass."""
    from verl_gdro.integration.driver import check_batch_fits

    if train_rows is None:
        return []
    with _refused():
        check_batch_fits(cfg, train_rows)
    return [f"data: {train_rows} training rows fill {train_rows // int(cfg.data.train_batch_size)} batch(es) per epoch"]


def derived_quantities(cfg, settings: Any, train_rows: int | None) -> dict[str, Any]:
    """Rollouts, mini-batches and budget per step, as the trainer will see them."""
    bs = int(cfg.data.train_batch_size)
    n = int(cfg.actor_rollout_ref.rollout.n)
    mini = int(cfg.actor_rollout_ref.actor.ppo_mini_batch_size)
    epochs = int(cfg.actor_rollout_ref.actor.ppo_epochs)
    gpus = int(cfg.trainer.nnodes) * int(cfg.trainer.n_gpus_per_node)
    steps = cfg.trainer.total_training_steps
    unknown = "unknown (no training file here)"
    out: dict[str, Any] = {
        "prompts per step": bs,
        "mean budget nbar (rollout.n)": n,
        "rollouts per step (exact, = batch * nbar)": bs * n,
        "mini-batches (optimizer steps) per step": (bs // mini) * epochs,
        "trajectories per mini-batch": mini * n,
        "GPUs": gpus,
        "rollouts per GPU per step": (bs * n) / gpus,
        "steps per epoch": unknown if train_rows is None else train_rows // bs,
        "total steps": steps,
        "epochs over the training set":
            unknown if train_rows is None else round(int(steps) * bs / train_rows, 2) if steps and train_rows else None,
        "validation samples per prompt": int(cfg.actor_rollout_ref.rollout.val_kwargs.n),
    }
    out["gdro preset"] = settings.preset
    out["Prompt-GDRO"] = (f"on ({settings.prompt.mode}, loss_signal={settings.prompt.loss_signal})"
                          if settings.prompt.enable and settings.enable else "off")
    if settings.allocates:
        from verl_gdro.allocators import get_allocator

        r = settings.rollout
        reads = get_allocator(r.allocator).reads  # the keys the allocator reads, as it declares them
        detail = ", ".join([f"allocator={r.allocator}"] + [
            f"{k}={getattr(r, k)}" for k in ("arm_utility", "selection", "rate_decay") if f"rollout.{k}" in reads])
        out["Rollout-GDRO"] = f"on ({detail})"
        out["rollout arms per prompt"] = f"[{r.n_min}, {r.n_max}], mean exactly {n}"
    else:
        out["Rollout-GDRO"] = f"off (every prompt gets n={n})"
    out["bins"] = settings.num_bins
    if "prompt_template" in cfg:
        out["prompt template / scorer"] = f"{cfg.prompt_template.name} / {cfg.prompt_template.scorer}"
    return out


def resolve_config(cfg) -> dict[str, Any]:
    """The composed config with its interpolations resolved; a dangling one named with its fix (``~gdro``
    alone leaves the package config's ``algorithm.gdro: ${gdro}`` pointing at nothing)."""
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception as e:
        if "Interpolation key 'gdro' not found" in str(e):
            raise DryRunError("algorithm.gdro=${gdro} does not resolve: ~gdro removed the group the package config "
                "mirrors into algorithm.gdro; remove both (~algorithm.gdro ~gdro) and give the estimator's keys as "
                "+algorithm.gdro.<key>=...") from e
        raise DryRunError(f"config does not resolve: {e}") from e


def settled_config(resolved: dict[str, Any], cfg, settings: Any) -> dict[str, Any]:
    """The resolved config as the run will use it: the ``gdro`` group (and its ``algorithm.gdro``
    mirror) with the values the preset and the actor decide instead of ``null``; for the estimator
    alone, ``algorithm.gdro`` with the keys that path reads (what the driver hands it)."""
    from verl_gdro.integration.estimator_keys import honoured_group, runs_estimator_alone

    if runs_estimator_alone(cfg):
        resolved["algorithm"]["gdro"] = honoured_group(settings)
    elif isinstance(resolved.get("gdro"), dict):
        resolved["gdro"] = settings.to_dict()
        if isinstance(resolved.get("algorithm", {}).get("gdro"), dict):
            resolved["algorithm"]["gdro"] = settings.to_dict()
    return resolved


def dry_run(argv: list[str], require_data: bool = False, print_config: bool = True, out: Any = None,
            cli: bool = False) -> int:
    """Compose and validate; print the config and derived quantities. Returns 0, or 2 with one ``DRY RUN
    FAILED: <reason>`` line on stderr (``cli``: raises :class:`verl_gdro.errors.UsageError` instead)."""
    from omegaconf import OmegaConf

    out = sys.stdout if out is None else out  # looked up per call (pytest's capsys swaps it)
    try:
        args = parse_hydra_argv(argv)
        cfg = compose_config(args)
        resolved = resolve_config(cfg)
        # ours first: a gdro key error names the key itself, not verl's validate_config (which the
        # plugin wraps with the same check in main_ppo's driver)
        checks = registration_checks(cfg)
        settings = gdro_checks(cfg)
        checks += verl_checks(cfg)
        checks += batch_checks(cfg)
        checks.append("verl_gdro.step.config.validate_gdro_config")
        checks += separate_async_checks(cfg)
        notes, train_rows = data_checks(cfg, settings, require=require_data)
        notes += epoch_checks(cfg, train_rows)
        derived = derived_quantities(cfg, settings, train_rows)
        resolved = settled_config(resolved, cfg, settings)
    except DryRunError as e:
        reason = " ".join(str(e).split())  # one line, whatever Hydra or verl put in it
        if cli:
            from verl_gdro.errors import UsageError

            raise UsageError(reason) from e
        print(f"DRY RUN FAILED: {reason}", file=sys.stderr)
        return 2  # bad input, as argparse and every other verl-gdro subcommand answer it
    if print_config:
        print("=== resolved config ===", file=out)
        print(OmegaConf.to_yaml(OmegaConf.create(resolved)), file=out)
    lines = ["=== checks passed ===", *(f"  {c}" for c in checks + notes), "=== derived quantities ===",
             *(f"  {k}: {v}" for k, v in derived.items()), f"DRY RUN OK: {args.config_name} {' '.join(args.overrides)}"]
    print("\n".join(lines).rstrip(), file=out)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments for a ``verl-gdro dry-run`` subcommand (same options as main_ppo's Hydra CLI)."""
    parser.add_argument("--require-data", action="store_true",
                        help="fail when a local data file is missing here (default: note it)")
    parser.add_argument("--quiet", action="store_true", help="do not print the resolved config")
    parser.add_argument("--config-path", "-cp", required=True, help="config folder, or pkg://package.path (as main_ppo)")
    parser.add_argument("--config-name", "-cn", required=True, help="config name in that folder (as main_ppo)")
    parser.add_argument("--config-dir", "-cd", action="append", default=[],
                        help="extra config folder searched first (repeatable, as main_ppo)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides")


def main(argv: list[str] | argparse.Namespace | None = None) -> int:
    """``python -m verl_gdro.dryrun [--require-data] [--quiet] --config-path=... --config-name=... [overrides]``,
    or the parsed namespace of :func:`add_arguments` (the ``verl-gdro`` CLI)."""
    if isinstance(argv, argparse.Namespace):
        a = argv
        hydra_argv = [f"--config-path={a.config_path}", f"--config-name={a.config_name}"]
        hydra_argv += [f"--config-dir={d}" for d in a.config_dir] + list(a.overrides)
        return dry_run(hydra_argv, require_data=a.require_data, print_config=not a.quiet, cli=True)
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--require-data", action="store_true")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--each", default=None)
    own, rest = parser.parse_known_args(argv)
    if own.each is not None:
        return dry_run_each(Path(own.each), require_data=own.require_data)
    return dry_run(rest, require_data=own.require_data, print_config=not own.quiet)


def dry_run_each(path: Path, require_data: bool = False) -> int:
    """``--each FILE``: one dry run per line of FILE (a JSON list of dry-run arguments) in this one process
    (``scripts/submit_sweep.py``); prints ``<line>\tDRY RUN FAILED: <reason>`` per refusal, exit 2 if any."""
    import contextlib
    import io
    import json

    failed = 0
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):  # verl prints too
            status = dry_run(json.loads(line), require_data=require_data, print_config=False, out=io.StringIO())
        if status != 0:
            failed += 1
            reason = next((x for x in err.getvalue().splitlines() if x.startswith("DRY RUN FAILED")), f"exit {status}")
            print(f"{number}\t{reason}")
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
