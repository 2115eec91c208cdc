"""Drafting: beam search with the recurrent draft head (ReDrafter paper, section 3.2).

Convention (Apple's, stated once): a beam of length L *includes* the base model's own next
token at position 0 (already sampled from the base model, so always accepted), followed by
L - 1 drafted tokens. A step can therefore emit at most L tokens: L - 1 accepted drafts plus
the base model's token after them.

All W beams advance together as a batch: (W, hidden) states, (W, V) log-probs, one top-W over
the W * V candidates per depth. Beams start as W copies of the root with scores [0, -inf, ...]
so the first expansion draws all W beams from one distribution without duplicates, and the
shapes never change (mx.compile-friendly). The returned beams are ordered best first, so the
packed tree lays the most likely beam out contiguously (its K/V then need no moving on commit).
"""

from typing import Optional

import mlx.core as mx


def beam_search(
    drafter,
    base,
    h: mx.array,
    token: mx.array,
    width: int,
    length: int,
    top_k: Optional[int] = None,
) -> mx.array:
    """Draft `width` beams of `length` tokens.

    h: (hidden,) base hidden state at the last accepted token. token: () the base model's
    next token (the root of every beam). Returns beams (W, L) int32 with beams[:, 0] == token.
    top_k: restrict each draft distribution to its k most likely tokens (None: no limit).
    """
    root = mx.broadcast_to(token.reshape(1, 1).astype(mx.int32), (width, 1))
    if length <= 1:
        return root
    scores = mx.concatenate([mx.zeros((1,)), mx.full((width - 1,), -mx.inf)])  # (W,)
    context = mx.broadcast_to(h.reshape(1, -1), (width, h.size))  # (W, H)
    state = mx.zeros_like(context)  # (W, H)
    vocab = drafter.draft_vocab if "draft_vocab" in drafter else None
    beams = [root]  # list of (W, 1), reordered as beams are chosen
    last = root[:, 0]  # (W,)
    for _ in range(length - 1):
        state = drafter.update_state(base.embed(last).astype(state.dtype), state)
        logits = drafter.draft_logits(context, state, base).astype(mx.float32)  # (W, V_draft)
        if top_k is not None and top_k < logits.shape[-1]:
            kth = mx.sort(logits, axis=-1)[:, -top_k][:, None]
            logits = mx.where(logits >= kth, logits, -mx.inf)
        logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)  # (W, V)
        V = logp.shape[-1]
        candidates = (scores[:, None] + logp).reshape(-1)  # (W * V,)
        best = mx.argpartition(-candidates, kth=width - 1)[:width]  # (W,) unordered top-W
        scores = candidates[best]
        parent = best // V
        last = (best % V).astype(mx.int32)
        if vocab is not None:
            last = vocab[last]  # draft-vocabulary index -> token id
        beams = [b[parent] for b in beams] + [last[:, None]]
        state = state[parent]
    order = mx.argsort(-scores)  # (W,) best first
    return mx.concatenate(beams, axis=1)[order]  # (W, L)
