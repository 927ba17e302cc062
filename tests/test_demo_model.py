"""The demo policy's sampling and log-prob layout (left-padded prompts, right-padded responses)."""

from __future__ import annotations

import pytest
import torch

from verl_gdro.demo.model import build_model, encode_prompts, response_log_probs, sample
from verl_gdro.demo.tokenizer import CharTokenizer

# building a Qwen3 imports transformers (several seconds on a shared 2-core machine)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny():
    tok = CharTokenizer()
    model = build_model(tok.vocab_size, hidden=32, layers=1, seed=0).eval()
    return tok, model


def test_log_probs_do_not_depend_on_left_padding(tiny):
    """Position ids follow the attention mask, so a prompt scores the same alone or padded."""
    tok, model = tiny
    texts = ["3+5=? End with Answer: N", "47+38+6=? End with Answer: N"]
    ids, mask = encode_prompts(tok, texts)
    assert mask[0].sum() < mask[1].sum() and mask[0, 0] == 0  # the short prompt is left-padded
    resp = torch.tensor([tok.encode("Answer: 8") + [tok.eos_token_id]] * 2)
    rmask = torch.ones_like(resp)
    with torch.no_grad():
        both = response_log_probs(model, torch.cat([ids, resp], 1), torch.cat([mask, rmask], 1), resp.shape[1])
        for i, t in enumerate(texts):
            ids1, m1 = encode_prompts(tok, [t])
            one = response_log_probs(model, torch.cat([ids1, resp[:1]], 1), torch.cat([m1, rmask[:1]], 1), resp.shape[1])
            torch.testing.assert_close(both[i], one[0], atol=1e-5, rtol=1e-5)


def test_sample_layout_and_reproducibility(tiny):
    tok, model = tiny
    ids, mask = encode_prompts(tok, ["3+5=? End with Answer: N"] * 6 + ["47+8=? End with Answer: N"] * 2)
    a = sample(model, ids, mask, 10, tok.eos_token_id, tok.pad_token_id, torch.Generator().manual_seed(3))
    b = sample(model, ids, mask, 10, tok.eos_token_id, tok.pad_token_id, torch.Generator().manual_seed(3))
    assert torch.equal(a.responses, b.responses)
    assert a.responses.shape == (8, 10) and a.response_mask.shape == (8, 10)
    for row, m in zip(a.responses, a.response_mask):
        L = int(m.sum())
        assert torch.all(m[:L] == 1) and torch.all(m[L:] == 0)  # mask is a prefix
        assert torch.all(row[L:] == tok.pad_token_id)
        eos = (row[:L] == tok.eos_token_id).nonzero()
        # eos, if any, is the last masked token (verl's layout: mask covers up to and incl. eos)
        assert eos.numel() == 0 or (eos.numel() == 1 and int(eos[0]) == L - 1)
        if eos.numel() == 0:
            assert L == 10


def test_sampled_tokens_follow_the_models_distribution(tiny):
    """At temperature 1 the empirical first-token frequencies match softmax(logits)."""
    tok, model = tiny
    ids, mask = encode_prompts(tok, ["3+5=? End with Answer: N"] * 4000)
    r = sample(model, ids, mask, 1, tok.eos_token_id, tok.pad_token_id, torch.Generator().manual_seed(0))
    with torch.no_grad():
        lp = response_log_probs(model, torch.cat([ids[:1], r.responses[:1]], 1), torch.cat([mask[:1], r.response_mask[:1]], 1), 1)
        logits = model(input_ids=ids[:1], attention_mask=mask[:1]).logits[0, -1]
    probs = torch.softmax(logits, -1)
    assert abs(float(lp[0, 0].exp()) - float(probs[r.responses[0, 0]])) < 1e-4
    freq = torch.bincount(r.responses[:, 0], minlength=probs.numel()).float() / 4000
    assert float((freq - probs).abs().max()) < 0.03
