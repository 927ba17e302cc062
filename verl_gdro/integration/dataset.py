"""Stable prompt ids for the classifier: validated ``extra_info.index``, or the dataset row index
(docs/integration.md, "Stable prompt ids"); verl's ``uid`` is a fresh uuid4 per fetch."""

from __future__ import annotations

from typing import Any

import numpy as np
from verl.utils.dataset.rl_dataset import RLHFDataset

from verl_gdro.step.config import ROW_INDEX_FIELD, UID_KEYS

_SHOW = 5  # rows quoted in an error message


class GDRODataset(RLHFDataset):
    """verl's ``RLHFDataset`` plus the row position as the prompt column ``gdro_row_index``
    (``gdro.uid_key=row_index``; stable while the data files, ``data.train_max_samples`` and the
    prompt-length filter are)."""

    def __getitem__(self, item: int) -> dict[str, Any]:
        row = super().__getitem__(item)
        row[ROW_INDEX_FIELD] = int(item)
        return row


def uid_field(uid_key: str) -> str:
    """The prompt column that carries the stable id for ``gdro.uid_key``."""
    if uid_key == "index":
        return "index"
    if uid_key == "row_index":
        return ROW_INDEX_FIELD
    raise ValueError(f"gdro.uid_key={uid_key!r} is invalid: allowed values are {list(UID_KEYS)}")


def _extra_info_column(dataset: Any) -> list[Any]:
    frame = getattr(dataset, "dataframe", None)
    names = getattr(frame, "column_names", None)
    if frame is not None and names is not None:
        if "extra_info" not in names:
            return [None] * len(dataset)
        return list(frame["extra_info"])
    return [dataset[i].get("extra_info") for i in range(len(dataset))]


def _as_uid(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and np.isfinite(value) and float(value).is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def stable_prompt_uids(dataset: Any, uid_key: str) -> np.ndarray:
    """The validated, unique stable id of every training row; a ValueError names ``gdro.uid_key`` and rows."""
    n = len(dataset)
    if uid_key == "row_index":
        check_row_index_class(type(dataset))
        return np.arange(n, dtype=np.int64)
    uid_field(uid_key)
    return stable_ids_from_extra_info(_extra_info_column(dataset))


def check_row_index_class(dataset_cls: type) -> None:
    """``gdro.uid_key=row_index`` needs the row position, which only :class:`GDRODataset` adds."""
    if not issubclass(dataset_cls, GDRODataset):
        raise ValueError(f"gdro.uid_key=row_index is invalid with dataset class {dataset_cls.__name__}: set "
                         "data.custom_cls.path=pkg://verl_gdro.integration.dataset data.custom_cls.name=GDRODataset")


def stable_ids_from_extra_info(column: list[Any]) -> np.ndarray:
    """``gdro.uid_key=index``: the validated ``extra_info.index`` of every row of an ``extra_info`` column."""
    n = len(column)
    uids = np.empty(n, dtype=np.int64)
    missing: list[int] = []
    bad: list[tuple[int, Any]] = []
    for row, info in enumerate(column):
        value = info.get("index") if isinstance(info, dict) else None
        if value is None:
            missing.append(row)
            continue
        uid = _as_uid(value)
        if uid is None:
            bad.append((row, value))
            continue
        uids[row] = uid
    if missing:
        raise ValueError(
            f"gdro.uid_key=index: {len(missing)} of {n} training rows have no extra_info.index (rows "
            f"{missing[:_SHOW]}{' ...' if len(missing) > _SHOW else ''}); verl would give them all index 0. Give "
            "every row a unique integer extra_info.index (its row number is fine), or use gdro.uid_key=row_index "
            "with data.custom_cls.path=pkg://verl_gdro.integration.dataset data.custom_cls.name=GDRODataset"
        )
    if bad:
        row, value = bad[0]
        raise ValueError(f"gdro.uid_key=index: extra_info.index must be an integer; row {row} has {value!r} "
                         f"({len(bad)} such rows)")
    order = np.argsort(uids, kind="stable")
    sorted_uids = uids[order]
    dup = np.flatnonzero(sorted_uids[1:] == sorted_uids[:-1])
    if dup.size:
        value = int(sorted_uids[dup[0]])
        rows = sorted(order[sorted_uids == value].tolist())
        raise ValueError(f"gdro.uid_key=index: extra_info.index {value} appears in training rows {rows[:_SHOW]} "
                         f"({dup.size} duplicate ids in all); stable prompt ids must be unique, or different prompts "
                         "would share one difficulty history")
    return uids
