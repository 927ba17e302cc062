"""A character-level tokenizer with a Qwen-style chat template, built in code (nothing downloaded).

Why not a Hugging Face tokenizer: the demo must run with no model hub, and a character vocabulary
of ~100 symbols keeps the tiny model's embedding small while making every digit its own token
(which is what makes multi-digit addition learnable and its difficulty graded). The chat template
mirrors Qwen's ``<|im_start|>role ... <|im_end|>`` layout so prompts look like those of the GPU
recipes; the special markers are single tokens.
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from pathlib import Path

__all__ = ["CharTokenizer"]

SPECIAL_TOKENS = ("<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>")


class CharTokenizer:
    """Characters <-> ids, plus four special tokens; ``eos`` is ``<|im_end|>`` (end of turn)."""

    def __init__(self, chars: str | None = None) -> None:
        if chars is None:
            chars = string.digits + string.ascii_letters + string.punctuation + " \n"
        if len(set(chars)) != len(chars):
            raise ValueError("chars must not contain duplicates")
        self.chars = chars
        self.specials = SPECIAL_TOKENS
        self._itos = list(SPECIAL_TOKENS) + list(chars)
        self._stoi = {c: i for i, c in enumerate(self._itos)}

    # ---- ids -----------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self._itos)

    @property
    def pad_token_id(self) -> int:
        return self._stoi["<|pad|>"]

    @property
    def eos_token_id(self) -> int:
        return self._stoi["<|im_end|>"]

    def encode(self, text: str) -> list[int]:
        """Encode text; the special markers are recognised as single tokens."""
        ids: list[int] = []
        i = 0
        while i < len(text):
            for sp in self.specials:
                if text.startswith(sp, i):
                    ids.append(self._stoi[sp])
                    i += len(sp)
                    break
            else:
                ch = text[i]
                if ch not in self._stoi:
                    raise ValueError(f"character {ch!r} is not in the tokenizer's vocabulary")
                ids.append(self._stoi[ch])
                i += 1
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Decode ids; stops at nothing, drops special tokens when ``skip_special_tokens``."""
        out = []
        for i in ids:
            tok = self._itos[int(i)]
            if skip_special_tokens and tok in self.specials:
                continue
            out.append(tok)
        return "".join(out)

    # ---- chat ----------------------------------------------------------------------------------
    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
        """Qwen-style template: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message."""
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
        return text

    # ---- persistence ---------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"type": "CharTokenizer", "chars": self.chars, "specials": list(self.specials)}))

    @classmethod
    def load(cls, path: str | Path) -> CharTokenizer:
        d = json.loads(Path(path).read_text())
        if d.get("type") != "CharTokenizer" or tuple(d.get("specials", ())) != SPECIAL_TOKENS:
            raise ValueError(f"{path} is not a CharTokenizer file of this version")
        return cls(d["chars"])
