"""Standalone evaluation of a checkpoint with vLLM, written in verl's dump format.

    python -m verl_gdro.eval.vllm_eval --model ckpts/.../huggingface --template answer \\
        --val-files $DATA_DIR/answer/val.parquet --out evals/pgdro_4b/0.jsonl
    verl-gdro eval --run Prompt-GDRO=evals/pgdro_4b/0.jsonl ...

Sampling is the paper's validation (:class:`Sampling`); vLLM is imported only to generate, and the
scoring and dump layout are training's (tested with an injected generator).
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_gdro.data.reward import SCORERS
from verl_gdro.eval.generations import write_dump

# generate(list of chat message lists, sampling) -> for each prompt, its n response strings
Generator = Callable[[list[list[dict[str, str]]], "Sampling"], list[list[str]]]


@dataclass(frozen=True)
class Sampling:
    """Validation sampling of the paper (Appendix A)."""

    n: int = 8
    temperature: float = 0.6
    top_p: float = 0.8
    top_k: int = 20
    max_tokens: int = 4096
    seed: int = 0


def vllm_generator(model: str, tensor_parallel_size: int = 1, max_model_len: int = 3200 + 4096) -> Generator:
    """A generator backed by ``vllm.LLM.chat`` (imported here, on the GPU machine)."""
    from vllm import LLM, SamplingParams  # noqa: PLC0415

    llm = LLM(model=model, tensor_parallel_size=tensor_parallel_size, max_model_len=max_model_len)

    def generate(messages: list[list[dict[str, str]]], s: Sampling) -> list[list[str]]:
        params = SamplingParams(n=s.n, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                max_tokens=s.max_tokens, seed=s.seed)
        outs = llm.chat(messages, params)
        return [[o.text for o in out.outputs] for out in outs]

    return generate


def evaluate_files(
    val_files: Sequence[str | Path], template: str, generate: Generator, sampling: Sampling = Sampling()
) -> list[dict[str, Any]]:
    """Generate, score with the template's reward function and return dump records."""
    import pandas as pd

    scorer = SCORERS[template]
    df = pd.concat([pd.read_parquet(f) for f in val_files], ignore_index=True)
    messages = [[dict(m) for m in p] for p in df["prompt"]]
    outputs = generate(messages, sampling)
    if len(outputs) != len(df):
        raise ValueError(f"generator returned {len(outputs)} prompts for {len(df)}")
    records = []
    for (_, row), msgs, responses in zip(df.iterrows(), messages, outputs, strict=True):
        uid = str(uuid.uuid4())
        gt = row["reward_model"]["ground_truth"]
        for j, text in enumerate(responses):
            res = scorer(row["data_source"], text, gt, extra_info=dict(row["extra_info"]))
            records.append({"input": msgs[-1]["content"], "output": text, "gts": gt, "score": res["score"], "step": 0,
                            "acc": res["acc"], "pred": res["pred"], "data_source": res["data_source"],
                            "uid": f"{uid}_{j}_0"})
    return records


def main(argv: list[str] | None = None) -> int:
    """Generate with vLLM and write ``--out`` (a JSONL in verl's validation dump layout)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--val-files", nargs="+", required=True)
    p.add_argument("--template", default="answer", choices=sorted(SCORERS))
    p.add_argument("--out", required=True)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    records = evaluate_files(a.val_files, a.template, vllm_generator(a.model, a.tp), Sampling(n=a.n, seed=a.seed))
    print(write_dump(records, a.out))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
