"""ChatTTS's own decode, the reference every measurement and test compares with: one builder of its
``InferCodeParams`` for a segment, ``chattts_infer`` (``Chat.infer``: the ceiling, the baseline
server) and ``chattts_tokens`` (``Chat._infer_code``: fidelity and the tests, re-exported by
tests/support/engine.py); and ``TokenLog``, the tokens each row of the engine draws (the engine
streams hidden states only)."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch


def infer_params(req: Any, tokens: Optional[tuple[int, int]] = None, seed: Optional[int] = None, spk_emb=None):
    """``Chat.InferCodeParams`` of a ``SegmentRequest``: its prompt, speaker (or ``spk_emb``), clip and
    sampling, decoding ``tokens`` = (min, max) tokens (default exactly ``max_new_tokens``) from
    ``seed`` (default the segment's)."""
    from ChatTTS import Chat

    low, high = tokens or (req.max_new_tokens, req.max_new_tokens)
    return Chat.InferCodeParams(
        prompt=req.prompt,
        spk_emb=spk_emb or req.spk_emb,
        spk_smp=req.spk_smp,
        txt_smp=req.txt_smp,
        temperature=req.temperature,
        top_P=req.top_p,
        top_K=req.top_k,
        repetition_penalty=req.repetition_penalty,
        max_new_token=high,
        min_new_token=low,
        show_tqdm=False,
        manual_seed=req.seed if seed is None else seed,
    )


def chattts_infer(chat: Any, segs: Sequence[Any], tokens: Optional[tuple[int, int]] = None, **params: Any) -> list:
    """ChatTTS's ``Chat.infer`` of the segments' texts in one batch, with the first one's parameters
    (``infer_params``), the text as the planner left it (no refinement, normalisation or splitting):
    one waveform per segment."""
    return chat.infer(
        [s.text for s in segs],
        skip_refine_text=True,
        do_text_normalization=False,
        do_homophone_replacement=False,
        split_text=False,
        params_infer_code=infer_params(segs[0], tokens, **params),
    )


def chattts_tokens(chat: Any, req: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens (n, 4) and hidden states (n, 768) of ChatTTS's own ``_infer_code`` for one segment."""
    out = list(chat._infer_code([req.text], False, chat.device, True, infer_params(req)))[-1]
    return out.ids[0], out.hiddens[0]


class TokenLog:
    """Observes an engine's sampler: every token each row draws, by row."""

    def __init__(self, engine: Any):
        self.by_row: dict[int, list[torch.Tensor]] = {}
        sample = engine.sampler.sample

        def record(state, hidden, start=0):
            tokens, ok = sample(state, hidden, start)
            for row, token, good in zip(engine.batch.rows[start:], tokens, ok.tolist()):
                if good:
                    self.by_row.setdefault(row.stream.row_id, []).append(token.cpu())
            return tokens, ok

        engine.sampler.sample = record

    def tokens(self, stream: Any) -> torch.Tensor:
        return torch.stack(self.by_row[stream.row_id])
