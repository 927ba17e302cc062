"""The tiny Qwen3 policy: construction, batched sampling with a KV cache, and token log-probs.

Why a hand-written sampling loop rather than ``model.generate``: it draws from an explicit
``torch.Generator`` whose state is checkpointed, so a killed run resumes with bit-identical
samples (issue 6), and it returns exactly the tensors the RL step needs (response ids and mask,
verl's layout: prompt left-padded, response right-padded, mask covering tokens up to and
including the end-of-turn token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .tokenizer import CharTokenizer

__all__ = ["Rollouts", "build_model", "encode_prompts", "response_log_probs", "sample"]


def build_model(vocab_size: int, hidden: int = 128, layers: int = 2, seed: int = 0) -> torch.nn.Module:
    """A tiny ``Qwen3ForCausalLM`` (random init, seeded): the same architecture as the GPU recipes."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(cfg)
    return model


def encode_prompts(tok: CharTokenizer, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Chat-template and left-pad user messages: ``(input_ids, attention_mask)`` [B, P]."""
    seqs = [tok.encode(tok.apply_chat_template([{"role": "user", "content": t}])) for t in texts]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :] = torch.tensor(s)
        mask[i, width - len(s) :] = 1
    return ids, mask


@dataclass
class Rollouts:
    """One batch of sampled responses in verl's layout."""

    prompts: torch.Tensor  # [N, P] left-padded
    prompt_mask: torch.Tensor  # [N, P]
    responses: torch.Tensor  # [N, R] right-padded with pad
    response_mask: torch.Tensor  # [N, R] 1 up to and including eos

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompts, self.responses], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)


@torch.no_grad()
def sample(
    model: torch.nn.Module,
    prompts: torch.Tensor,
    prompt_mask: torch.Tensor,
    max_new_tokens: int,
    eos_token_id: int,
    pad_token_id: int,
    generator: torch.Generator,
    temperature: float = 1.0,
) -> Rollouts:
    """Sample one response per row at ``temperature`` (1.0 = the policy's own distribution)."""
    from transformers import DynamicCache

    model.eval()
    n = prompts.shape[0]
    cache = DynamicCache(config=model.config)
    mask = prompt_mask.clone()
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=prompts, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
    logits = out.logits[:, -1, :]
    next_pos = pos[:, -1:] + 1
    tokens = torch.full((n, max_new_tokens), pad_token_id, dtype=torch.long)
    resp_mask = torch.zeros((n, max_new_tokens), dtype=torch.long)
    alive = torch.ones(n, dtype=torch.bool)
    for t in range(max_new_tokens):
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        nxt = torch.where(alive, nxt, torch.full_like(nxt, pad_token_id))
        tokens[:, t] = nxt
        resp_mask[:, t] = alive.long()
        alive = alive & (nxt != eos_token_id)
        if not alive.any() or t == max_new_tokens - 1:
            break
        mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype)], dim=1)
        out = model(
            input_ids=nxt[:, None], attention_mask=mask, position_ids=next_pos, past_key_values=cache, use_cache=True
        )
        logits = out.logits[:, -1, :]
        next_pos = next_pos + 1
    return Rollouts(prompts, prompt_mask, tokens, resp_mask)


def response_log_probs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
) -> torch.Tensor:
    """Per-token log-probs of the last ``response_len`` tokens (verl's ``old_log_prob`` layout)."""
    pos = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos, use_cache=False).logits
    logits = logits[:, -response_len - 1 : -1, :].float()
    targets = input_ids[:, -response_len:]
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, targets[..., None]).squeeze(-1)
