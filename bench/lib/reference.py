"""What a decode is checked against: ChatTTS's own ``Chat._infer_code`` for one segment, and the
tokens each row of the engine draws (the engine streams hidden states only). Shared by the
fidelity bench and the tests (tests/support/engine.py re-exports them)."""

from __future__ import annotations

from typing import Any

import torch


def chattts_tokens(chat: Any, req: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens (n, 4) and hidden states (n, 768) of ChatTTS's own ``_infer_code`` for one segment."""
    from ChatTTS import Chat

    params = Chat.InferCodeParams(
        prompt=req.prompt,
        spk_emb=req.spk_emb,
        spk_smp=req.spk_smp,
        txt_smp=req.txt_smp,
        temperature=req.temperature,
        top_P=req.top_p,
        top_K=req.top_k,
        repetition_penalty=req.repetition_penalty,
        max_new_token=req.max_new_tokens,
        min_new_token=req.max_new_tokens,
        show_tqdm=False,
        manual_seed=req.seed,
    )
    out = list(chat._infer_code([req.text], False, chat.device, True, params))[-1]
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
