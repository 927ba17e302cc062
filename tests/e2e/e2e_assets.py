"""Tiny assets made in code for the e2e tier: a random Qwen3, its tokenizer, arithmetic parquet.

No hub access exists on CI machines, so everything verl's ``main_ppo`` loads from disk is built
here with the library's own ``save_pretrained`` and verl's RL parquet format:

- a word-level tokenizer over exactly the pieces of the prompts (plus Qwen-style special tokens and
  a Qwen-style chat template), loadable by ``AutoTokenizer`` in verl and in vLLM;
- a 2-layer random ``Qwen3ForCausalLM`` whose vocabulary equals the tokenizer's (vLLM samples
  from every model id, and an id without a token would break detokenisation);
- train/validation parquet of one-digit additions/subtractions, ``data_source="math_dapo"`` so that
  verl's own ``math_dapo`` scorer grades the "Answer: <n>" line, with ``extra_info.index`` the row
  index (the stable prompt id the GDRO trainer uses).

Why the ten answer lines are single tokens ("Answer: 7\\n"): an untrained random model never
writes the characters "A", "n", "s", ... in the right order, so every reward would be -1, every
GRPO advantage zero and every GDRO bin the same; the controllers would only ever see a degenerate
input. With whole answer lines in a ~50-token vocabulary, the random model ends a response with a
correct line roughly one time in ten, and by a prompt-dependent amount (the output layer is scaled
so that logits depend on the prompt), so groups have mixed correctness and the classifier spreads
prompts over several bins. This is test data for orchestration, not a benchmark.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
ANSWER_TOKENS = [f"Answer: {d}\n" for d in range(10)]
# Pieces of text: whitespace, single digits, words (a trailing ":" kept), any other character.
PIECE_PATTERN = r"\s|\d|[A-Za-z]+:?|[^\sA-Za-z\d]"
PROMPT_TEMPLATE = "What is {a} {op} {b}? End with a line Answer: <number>"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
DATA_SOURCE = "math_dapo"


def _problems() -> list[tuple[str, str]]:
    """All one-digit problems whose answer is a single digit: (question, answer)."""
    out = []
    for a in range(10):
        for b in range(10):
            if a + b <= 9:
                out.append((PROMPT_TEMPLATE.format(a=a, op="+", b=b), str(a + b)))
            if a - b >= 0:
                out.append((PROMPT_TEMPLATE.format(a=a, op="-", b=b), str(a - b)))
    return out


def build_tokenizer(out_dir: Path) -> Any:
    """Build and save the word-level tokenizer; returns the ``PreTrainedTokenizerFast``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pieces: set[str] = set()
    texts = [q for q, _ in _problems()] + ["user", "assistant", "system", "\n"]
    for text in texts:
        pieces.update(re.findall(PIECE_PATTERN, text))
    pieces.update(str(d) for d in range(10))
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for piece in sorted(pieces):
        vocab.setdefault(piece, len(vocab))

    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(PIECE_PATTERN), behavior="isolated")
    # Pieces carry their own whitespace, so decoding is plain concatenation (no inserted spaces).
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>"],
    )
    tok.add_tokens(ANSWER_TOKENS)
    tok.chat_template = CHAT_TEMPLATE
    tok.model_max_length = 512
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))
    return tok


def build_model(out_dir: Path, seed: int = 0) -> Path:
    """Build and save a tiny random Qwen3 (with its tokenizer) under ``out_dir``.

    Sizes: head_dim 32 is one of the head sizes vLLM's CPU attention supports; 2 layers keep
    FSDP2 + vLLM start-up and a step within seconds on 2 cores.
    """
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tok = build_tokenizer(out_dir)
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        torch_dtype="float32",
    )
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        # Logit std ~1 instead of ~0.2: responses depend on the prompt (see module doc).
        model.lm_head.weight.normal_(0.0, 0.1)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id).save_pretrained(str(out_dir))
    return out_dir


def build_data(out_dir: Path, n_train: int = 8, n_val: int = 8, seed: int = 0) -> tuple[Path, Path]:
    """Write train/val parquet in verl's RL format with ``extra_info.index`` = row index.

    ``n_train`` defaults to one batch (8 prompts): every step is a new epoch over the same prompts,
    so from step 2 on the classifier bins prompts by their history and Rollout-GDRO allocates
    unequal rollouts; with fresh prompts every step, all prompts would sit in the unseen bin.
    """
    import pandas as pd

    problems = _problems()
    rng = random.Random(seed)
    rng.shuffle(problems)
    if n_train + n_val > len(problems):
        raise ValueError(f"n_train + n_val must be <= {len(problems)}, got {n_train + n_val}")

    def rows(split: str, items: list[tuple[str, str]]) -> list[dict[str, Any]]:
        return [
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": q}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": a},
                "extra_info": {"split": split, "index": i, "answer": a},
            }
            for i, (q, a) in enumerate(items)
        ]

    out_dir.mkdir(parents=True, exist_ok=True)
    train, val = out_dir / "train.parquet", out_dir / "val.parquet"
    pd.DataFrame(rows("train", problems[:n_train])).to_parquet(train)
    pd.DataFrame(rows("test", problems[n_train : n_train + n_val])).to_parquet(val)
    return train, val


ASSETS_VERSION = 2


def build_all(root: Path, seed: int = 0, n_train: int = 8) -> dict[str, str]:
    """Build model + data under ``root`` once (a marker file makes it idempotent)."""
    marker = root / f"assets-v{ASSETS_VERSION}-seed{seed}-train{n_train}.json"
    if marker.exists():
        return json.loads(marker.read_text())
    model_dir = build_model(root / "model", seed=seed)
    train, val = build_data(root / "data", n_train=n_train, seed=seed)
    paths = {"model": str(model_dir), "train": str(train), "val": str(val)}
    marker.write_text(json.dumps(paths))
    return paths


if __name__ == "__main__":
    import sys

    print(json.dumps(build_all(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/verl_gdro_e2e_assets"))))
