"""Read verl 0.9.1 validation dumps (``trainer.validation_data_dir``) into per-prompt correctness.

verl writes ``<global_step>.jsonl``, one line per sample with ``input``, ``gts``, ``score``, the
reward's extra info (``acc``, ``data_source`` from :mod:`verl_gdro.data.reward`) and ``uid`` =
``<prompt uuid>_<session>_<turn>``, which groups a prompt's samples. Without ``data_source``,
``val_files`` maps each prompt to its benchmark through the validation parquet.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Sample:
    """One generated response: the prompt it answers, its benchmark and its 0/1 correctness."""

    prompt_id: str
    data_source: str
    acc: float
    session: str = ""


def resolve_dump_file(path: str | Path, step: int | str | None = "latest") -> Path:
    """``path`` itself if it is a file, else ``<path>/<step>.jsonl`` (``latest`` = highest step)."""
    p = Path(path)
    if p.is_file():
        return p
    if not p.is_dir():
        raise ValueError(f"generations path {str(p)!r} is neither a JSONL file nor a folder")
    steps = sorted(int(f.stem) for f in p.glob("*.jsonl") if f.stem.isdigit())
    if not steps:
        raise ValueError(f"no <step>.jsonl dumps under {str(p)!r} (set trainer.validation_data_dir)")
    s = steps[-1] if step in (None, "latest") else int(step)
    if s not in steps:
        raise ValueError(f"step={s} has no dump under {str(p)!r}; available: {steps}")
    return p / f"{s}.jsonl"


def _split_key(key: str) -> tuple[str, str]:
    parts = str(key).rsplit("_", 2)
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
        return parts[0], parts[1]
    return str(key), ""


class PromptIndex:
    """Maps a dumped (input, ground truth) to its benchmark using the validation parquet files."""

    def __init__(self, val_files: Sequence[str | Path]):
        import pandas as pd

        self._by_gt: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for f in val_files:
            df = pd.read_parquet(f)
            for ds, prompt, rm in zip(df["data_source"], df["prompt"], df["reward_model"], strict=True):
                content = str(list(prompt)[-1]["content"])
                self._by_gt[str(rm["ground_truth"])].append((content, str(ds)))

    def lookup(self, text: str, gts: Any) -> str:
        """The benchmark whose prompt text occurs in ``text`` among rows with ground truth ``gts``."""
        hits = {ds for content, ds in self._by_gt.get(str(gts), []) if content in text}
        if len(hits) != 1:
            raise ValueError(
                f"cannot map a dumped prompt to one benchmark (gts={gts!r}, matches={sorted(hits)}); "
                "dump with verl_gdro.data.reward (it records data_source) or pass the right --val-files"
            )
        return hits.pop()


def read_dump(
    path: str | Path, step: int | str | None = "latest", val_files: Sequence[str | Path] | None = None,
    acc_key: str = "acc",
) -> list[Sample]:
    """Samples of one dump file. Correctness is ``acc`` (never the shaped ``score``)."""
    file = resolve_dump_file(path, step)
    index = PromptIndex(val_files) if val_files else None
    samples = []
    with open(file, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            rec = json.loads(line)
            if acc_key not in rec or rec[acc_key] is None:
                raise ValueError(
                    f"{file}:{line_no}: no {acc_key!r} field; the reward function must return raw "
                    "correctness (verl_gdro.data.reward does); the shaped score is not used"
                )
            ds = rec.get("data_source")
            if ds is None:
                if index is None:
                    raise ValueError(f"{file}:{line_no}: no data_source field; pass val_files to map prompts")
                ds = index.lookup(str(rec.get("input", "")), rec.get("gts"))
            prompt_id, session = _split_key(rec["uid"]) if "uid" in rec else (str(rec.get("input")), str(line_no))
            acc = 1.0 if float(rec[acc_key]) > 0.5 else 0.0
            samples.append(Sample(prompt_id=prompt_id, data_source=str(ds), acc=acc, session=session))
    return samples


def group_by_prompt(samples: Iterable[Sample]) -> dict[str, list[list[float]]]:
    """``{benchmark: [[acc of each sample of one prompt], ...]}``, one entry per rollout session (a
    multi-turn session dumps each turn, all with the session's final acc)."""
    seen: set[tuple[str, str]] = set()
    per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        if s.session and (s.prompt_id, s.session) in seen:
            continue
        seen.add((s.prompt_id, s.session))
        per[s.data_source][s.prompt_id].append(s.acc)
    return {ds: list(prompts.values()) for ds, prompts in per.items()}


def write_dump(records: Iterable[dict[str, Any]], path: str | Path) -> Path:
    """Write records in verl's dump layout (one JSON object per line)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return p
