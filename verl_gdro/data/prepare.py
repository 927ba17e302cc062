"""Download DAPO 14.1k and the benchmarks and write verl RL parquet files (run on your cluster).

    python -m verl_gdro.data.prepare --out-dir $DATA_DIR --template answer

writes ``$DATA_DIR/<template>/``: ``train.parquet``, ``val.parquet`` (all benchmarks, unique
indices), ``val/<benchmark>.parquet`` and ``manifest.json``. Only :func:`load_hub_table` touches
the hub. GPQA-Diamond is gated: ``huggingface-cli login`` after accepting its terms, or
``--skip gpqa_diamond``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from verl_gdro.data.sources import (
    BENCHMARKS,
    DAPO_EXPECTED_ROWS,
    DAPO_HUB_CONFIG,
    DAPO_HUB_ID,
    DEFAULT_GPQA_SEED,
    concat_frames,
    prepare_benchmark,
    prepare_dapo,
)
from verl_gdro.data.templates import available_templates, load_template

# Index ranges: the training set starts at 0, validation rows at VAL_INDEX_OFFSET, so a train and
# a val id can never collide even if a run logs them together.
VAL_INDEX_OFFSET = 10_000_000

def load_hub_table(name: str) -> Any:  # pragma: no cover - needs the hub
    """Load the hub table of ``name`` ("dapo" or a benchmark) with ``datasets.load_dataset``."""
    from datasets import load_dataset

    if name == "dapo":
        return load_dataset(DAPO_HUB_ID, DAPO_HUB_CONFIG, split="train")
    b = BENCHMARKS[name]
    if b.hub_config is None:
        return load_dataset(b.hub_id, split=b.split)
    return load_dataset(b.hub_id, b.hub_config, split=b.split)


def write_parquet(df: pd.DataFrame, path: Path) -> Path:
    """Write one RL table (already checked: every converter and concat_frames end in validate_rl_frame)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(path, index=False)
    return path


def prepare_all(
    out_dir: str | Path, template: str = "answer", loader: Callable[[str], Any] = load_hub_table,
    benchmarks: Sequence[str] | None = None, include_train: bool = True, gpqa_seed: int = DEFAULT_GPQA_SEED,
) -> dict[str, Any]:
    """Convert every table ``loader(name)`` returns (hub schema; tests pass fixtures), write the
    parquet files and return the manifest."""
    tpl = load_template(template)
    names = list(BENCHMARKS) if benchmarks is None else list(benchmarks)
    for n in names:
        if n not in BENCHMARKS:
            raise ValueError(f"benchmark={n!r} is unknown; allowed: {sorted(BENCHMARKS)}")
    root = Path(out_dir) / tpl.name
    manifest: dict[str, Any] = {"template": tpl.name, "scorer": tpl.scorer, "gpqa_seed": gpqa_seed, "files": {}}
    if include_train:
        train = prepare_dapo(loader("dapo"), tpl)
        write_parquet(train, root / "train.parquet")
        manifest["files"]["train"] = {"path": "train.parquet", "rows": len(train), "hub_id": DAPO_HUB_ID}
        if len(train) != DAPO_EXPECTED_ROWS:
            manifest["files"]["train"]["warning"] = f"expected {DAPO_EXPECTED_ROWS} rows (paper), got {len(train)}"
    frames = []
    offset = VAL_INDEX_OFFSET
    for n in names:
        df = prepare_benchmark(n, loader(n), tpl, index_offset=offset, gpqa_seed=gpqa_seed)
        offset += len(df)
        write_parquet(df, root / "val" / f"{n}.parquet")
        manifest["files"][n] = {"path": f"val/{n}.parquet", "rows": len(df), "hub_id": BENCHMARKS[n].hub_id}
        frames.append(df)
    if frames:
        write_parquet(concat_frames(frames), root / "val.parquet")
        manifest["files"]["val"] = {"path": "val.parquet", "rows": int(sum(len(f) for f in frames))}
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out-dir", required=True, help="root folder; files go to OUT_DIR/<template>/")
    parser.add_argument("--template", default="answer", choices=available_templates())
    parser.add_argument("--benchmarks", nargs="*", default=None, help=f"subset of {sorted(BENCHMARKS)}")
    parser.add_argument("--skip", nargs="*", default=[], help="benchmarks to leave out (e.g. gated gpqa_diamond)")
    parser.add_argument("--no-train", action="store_true", help="only the validation benchmarks")
    parser.add_argument("--gpqa-seed", type=int, default=DEFAULT_GPQA_SEED)


def main(args: argparse.Namespace) -> int:
    names = [n for n in (args.benchmarks or list(BENCHMARKS)) if n not in set(args.skip)]
    manifest = prepare_all(args.out_dir, template=args.template, benchmarks=names, include_train=not args.no_train,
                           gpqa_seed=args.gpqa_seed)
    print(json.dumps(manifest, indent=2))
    return 0


if __name__ == "__main__":  # pragma: no cover
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    sys.exit(main(p.parse_args()))
