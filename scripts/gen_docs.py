"""Regenerate the parts of the docs that restate the code, so they cannot drift from it.

A generated part sits between two markers in a Markdown file::

    <!-- generated:NAME -->
    ... written by this script, never by hand ...
    <!-- /generated:NAME -->

and is rebuilt from the code it describes:

- ``config-keys``: every key of the ``gdro`` group with its default, from the package config
  ``verl_gdro/config/gdro_trainer.yaml`` (a key whose default is ``null`` and that a preset decides
  shows each preset's value). The meaning column comes from :data:`MEANINGS` below, or else from
  the key's comment in the YAML; a key with neither is an error.
- ``presets``: what each preset of ``verl_gdro/presets.py`` (``PRESETS``) sets.
- ``mode-line``: the line the trainer prints at start for Rollout-GDRO with the default preset
  (``verl_gdro.step.controller.describe_mode``).
- ``cli``: every ``verl-gdro`` subcommand and flag, from the argparse parsers of ``verl_gdro/cli.py``.

Usage (from the repository root)::

    python scripts/gen_docs.py          # rewrite every generated part in place
    python scripts/gen_docs.py --check  # exit 1 and name the stale parts (tests/test_docs_drift.py)

New config keys and presets are picked up automatically; give a new key a meaning in
:data:`MEANINGS` or a comment on its line in the YAML.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
YAML_PATH = ROOT / "verl_gdro" / "config" / "gdro_trainer.yaml"

#: Where each generated part lives (one part may appear in several files).
TARGETS: dict[str, tuple[str, ...]] = {
    "config-keys": ("docs/configuration.md",),
    "presets": ("docs/configuration.md",),
    "mode-line": ("README.md",),
    "cli": ("docs/cli.md",),
}

#: What each ``gdro.*`` key means (the defaults and preset values come from the code).
MEANINGS: dict[str, str] = {
    "enable": "master switch; `false`: the trainer is verl's sync trainer and `gdro_grpo` is verl's `grpo` "
    "(clipped if `advantage_clip` is set)",
    "preset": "named set of choices (table below; docs/algorithm.md, \"Presets\")",
    "uid_key": "stable prompt id: `index` (`extra_info.index`, validated unique) or `row_index` (with `GDRODataset`)",
    "acc_key": "correctness key in the reward's extra info (verl's reward managers put a plain float score there)",
    "correct_threshold": "a response is correct when its `acc_key` value (the standalone estimator: its outcome "
    "reward) is above this; 0.0 reads `acc` in {0, 1}, a +-1 reward and a shaped score alike",
    "advantage_clip": "> 0: `gdro_grpo` clips its advantages to [-c, c] after the Prompt-GDRO multipliers (the "
    "paper's 5.0, set by the reproduction recipes; verl 0.9.1 has no such key); `null`: no clip",
    "classifier.num_bins": "B; with `bin_edges` it must equal `len(bin_edges) + 1` or be `null`",
    "classifier.bin_edges": "inner edges, strictly increasing in (0, 1); `null`: `i / B`",
    "classifier.window": "visits kept per prompt",
    "classifier.hysteresis": "in [0, narrowest bin)",
    "classifier.k": "k of pass@k",
    "classifier.passk_estimator": "`pooled` or `any_of_n`",
    "classifier.unseen_bin": "bin of a prompt never seen, in [0, B)",
    "prompt.enable": "Prompt-GDRO on/off. On by default: with `gdro.rollout.enable=true` set it explicitly "
    "(`false` = Rollout-GDRO alone, `true` = joint); the trainer prints the mode at start",
    "prompt.mode": "`reweight` (scale advantages, Eq. 16; the standalone estimator's only mode), or a sampling mode "
    "that draws the prompts (GDRO trainer only): `failure_weighted`, `greso`, `band`, `expected_informative` (per-prompt priorities) or "
    "`resample` (bins drawn with q_t); algorithm.md \"Prompt sampling modes\"",
    "prompt.loss_signal": "`failure_rate`, `surrogate_kl` (Eq. 6), `surrogate` (at the driver, ratio 1) or "
    "`update_surrogate` (the release's: each response's clipped surrogate on the raw advantages, measured in the "
    "actor's PPO update on every mini-batch and fed to the next step)",
    "prompt.eta": "> 0, and `eta * score_clip <= 600`",
    "prompt.beta": "EMA rate in (0, 1]",
    "prompt.gamma": "uniform mixing in [0, 1)",
    "prompt.max_weight": "multiplier cap, > 0",
    "prompt.score_clip": "C of Eq. 14, > 0; `inf`: no clip (`mean_one` multipliers without `min_ess` only)",
    "prompt.mix_support": "`all`: Eq. 15's gamma / B over all bins; `present`: gamma / (bins present in the step), "
    "the release's mixture (`mean_one` without `min_ess` only)",
    "prompt.normalize_by_share": "divide bin losses by the bin's batch share",
    "prompt.share_floor": "in (0, 1]; `null`: 1 / (2B)",
    "prompt.weight_normalization": "`mean_one` or `raw`",
    "prompt.min_ess": "floor on the multipliers' effective sample size, as a share of the batch, in [0, 1); "
    "0: off (`mean_one` only)",
    "prompt.kl_coef": "beta_KL of the `surrogate_kl` signal, >= 0",
    "prompt.clip_ratio_low": "lower clip of the surrogate signals",
    "prompt.clip_ratio_high": "upper clip of the surrogate signals",
    "rollout.enable": "Rollout-GDRO on/off (GDRO trainer only); `null`: on under the GDRO trainer (joint mode, the "
    "default), off for the standalone estimator",
    "rollout.n_min": "smallest n per prompt, >= 2; `actor_rollout_ref.rollout.n` (the mean budget) must lie in "
    "[n_min, n_max]",
    "rollout.n_max": "largest n per prompt, >= n_min",
    "rollout.eta": "bandit: learning rate of the exponential weights over arms",
    "rollout.gamma": "bandit: uniform mixing over arms in [0, 1)",
    "rollout.score_ema": "bandit: arm-score EMA rate in (0, 1]",
    "rollout.dual_lr": "bandit: shadow-price step, >= 0",
    "rollout.allocator": "`bandit` (per bin), `neyman` (per bin), `per_prompt` (each prompt its own n) or "
    "`release_as_run` (the release's allocation as its runs used it: frozen uniform arms, the lexicographically "
    "smallest exact-budget arms of the previous step's classes, by position; algorithm.md \"The release preset\")",
    "rollout.arm_utility": "`failure_weighted`, `expected_informative`, `informative`, `knapsack`, `variance`, "
    "`loss` (played arm, `bandit` only), `hit` (`per_prompt` only)",
    "rollout.rate_decay": "`per_prompt` only: each prompt's evidence weighted by `rate_decay ** age` per visit, "
    "in (0, 1]; `null` or 1.0 pools the classifier's whole window",
    "rollout.selection": "`auto`, `map` (most probable configuration) or `sample`",
    "rollout.seed": "the allocator's own generator, >= 0",
}


def _fmt(value: Any) -> str:
    """A config value as YAML writes it, in backticks."""
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# ----------------------------------------------------------------------------------------------
# the gdro group
# ----------------------------------------------------------------------------------------------


def yaml_gdro_keys() -> list[tuple[str, Any, str]]:
    """(dotted key under gdro, default, YAML comment) of every leaf key, in file order."""
    import yaml

    text = YAML_PATH.read_text(encoding="utf-8")
    defaults = yaml.safe_load(text)["gdro"]
    comments: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    in_gdro = False
    pending: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            pending = []
            continue
        indent = len(line) - len(line.lstrip())
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        m = re.match(r"(\w+):\s*(.*)$", stripped)
        if indent == 0:
            in_gdro = bool(m and m.group(1) == "gdro")
            stack, pending = [], []
            continue
        if not in_gdro or not m:
            pending = []
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m.group(1)))
        inline = ""
        if "#" in m.group(2):
            inline = m.group(2).split("#", 1)[1].strip()
        comments[".".join(k for _, k in stack)] = inline or " ".join(pending)
        pending = []

    out: list[tuple[str, Any, str]] = []

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, value in node.items():
            name = f"{prefix}{key}"
            if isinstance(value, dict):
                walk(value, name + ".")
            else:
                out.append((name, value, comments.get(name, "")))

    walk(defaults, "")
    return out


def _preset_keys() -> dict[str, dict[str, Any]]:
    """``section.key`` -> {preset: value} for every key some preset sets."""
    from verl_gdro.presets import PRESETS

    keys: dict[str, dict[str, Any]] = {}
    for preset, sections in PRESETS.items():
        for section, values in sections.items():
            for key, value in values.items():
                keys.setdefault(f"{section}.{key}", {})[preset] = value
    return keys


def gen_config_keys() -> str:
    from verl_gdro.presets import DEFAULT_PRESET, PRESETS

    preset_keys = _preset_keys()
    rows = ["| key | default | meaning |", "|---|---|---|"]
    missing = []
    for key, default, comment in yaml_gdro_keys():
        meaning = MEANINGS.get(key) or comment
        if not meaning:
            missing.append(key)
        shown = _fmt(default)
        if key == "preset":
            shown += f" (one of {', '.join(f'`{p}`' for p in PRESETS)})"
        elif default is None and key in preset_keys:
            by_preset = ", ".join(f"{p} {_fmt(preset_keys[key].get(p, '(unset)'))}" for p in PRESETS)
            shown += f" (preset: {by_preset})"
        rows.append(f"| `gdro.{key}` | {_cell(shown)} | {_cell(meaning)} |")
    if missing:
        raise SystemExit(
            f"gen_docs: no meaning for gdro keys {missing}: add one to MEANINGS in scripts/gen_docs.py or a "
            f"comment on the key's line in {YAML_PATH.relative_to(ROOT)}"
        )
    rows.append("")
    rows.append(f"Keys left at `null` that a preset decides take the value of `gdro.preset` (default "
                f"`{DEFAULT_PRESET}`); explicit values win.")
    return "\n".join(rows)


def gen_presets() -> str:
    from verl_gdro.presets import DEFAULT_PRESET, PRESETS

    names = list(PRESETS)
    header = "| key | " + " | ".join(f"`{p}`" + (" (default)" if p == DEFAULT_PRESET else "") for p in names) + " |"
    rows = [header, "|---|" + "---|" * len(names)]
    for key, values in _preset_keys().items():
        cells = [_fmt(values[p]) if p in values else "(package default)" for p in names]
        rows.append(f"| `gdro.{key}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def gen_mode_line() -> str:
    from verl_gdro.step.config import resolve_gdro
    from verl_gdro.step.controller import describe_mode

    settings = resolve_gdro({"prompt": {"enable": False}, "rollout": {"enable": True}})
    return "```\n" + describe_mode(settings, rollout_n=4) + "\n```"


def gen_cli() -> str:
    from verl_gdro.cli import SUBCOMMANDS, build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out: list[str] = []
    for name in SUBCOMMANDS:
        p = sub.choices[name]
        out.append(f"### `verl-gdro {name}`")
        out.append("")
        out.append(_cell(p.description or ""))
        out.append("")
        out.append("| flag | default | help |")
        out.append("|---|---|---|")
        for action in p._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            flags = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}` (positional)"
            if action.choices is not None and not action.option_strings:
                flags = f"`{action.dest}` (positional)"
            default = action.default
            if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)) or default in (
                None,
                argparse.SUPPRESS,
                [],
                (),
            ):
                shown = ""
            elif isinstance(default, (list, tuple)):
                shown = "`" + " ".join(str(v) for v in default) + "`"
            else:
                shown = f"`{default}`"
            help_text = (action.help or "") % {"default": default, "prog": p.prog} if action.help else ""
            if action.choices is not None:
                help_text = (help_text + "; " if help_text else "") + "one of " + ", ".join(
                    f"`{c}`" for c in action.choices
                )
            out.append(f"| {flags} | {_cell(shown)} | {_cell(help_text)} |")
        out.append("")
    return "\n".join(out).rstrip()


GENERATORS: dict[str, Callable[[], str]] = {
    "config-keys": gen_config_keys,
    "presets": gen_presets,
    "mode-line": gen_mode_line,
    "cli": gen_cli,
}


# ----------------------------------------------------------------------------------------------
# rewriting the marked blocks
# ----------------------------------------------------------------------------------------------


def _block_re(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- generated:{re.escape(name)} -->\n)(.*?)(<!-- /generated:{re.escape(name)} -->)", re.DOTALL
    )


def render(text: str, name: str, body: str, path: str) -> str:
    pattern = _block_re(name)
    if not pattern.search(text):
        raise SystemExit(f"gen_docs: {path} has no <!-- generated:{name} --> ... <!-- /generated:{name} --> block")
    return pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(3), text)


def regenerate(check: bool = False) -> list[str]:
    """Rewrite (or with ``check``, only compare) every generated block; returns the stale ``path:name``s."""
    bodies = {name: gen() for name, gen in GENERATORS.items()}
    stale: list[str] = []
    files: dict[str, str] = {}
    for name, paths in TARGETS.items():
        for path in paths:
            text = files.get(path)
            if text is None:
                text = (ROOT / path).read_text(encoding="utf-8")
            new = render(text, name, bodies[name], path)
            if new != text:
                stale.append(f"{path}:{name}")
            files[path] = new
    if not check:
        for path, text in files.items():
            if (ROOT / path).read_text(encoding="utf-8") != text:
                (ROOT / path).write_text(text, encoding="utf-8")
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale blocks (exit 1 if any)")
    args = parser.parse_args(argv)
    stale = regenerate(check=args.check)
    if args.check and stale:
        print("stale generated docs (run python scripts/gen_docs.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    if not args.check:
        print("regenerated: " + (", ".join(stale) if stale else "nothing changed"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
