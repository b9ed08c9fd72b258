"""Optional text refinement: ChatTTS's GPT in text mode adds prosody tags ([uv_break], [laugh]...).

It is a second, autoregressive generation over the text (up to a few hundred tokens), so it is
off by default and only runs when a request asks for ``refine_text``. It uses ChatTTS's own
``Chat._refine_text`` with a per-call seed; ChatTTS's generator is shared, hence the lock.
"""

from __future__ import annotations

import threading

import torch

from .text.chars import SAYABLE_CJK_RE
from .weights import LoadedModel

# Refined text is the input plus a few tags: cap the generation near the input's length.
REFINE_MAX_TOKENS = 384


def refine_token_cap(text: str) -> int:
    return min(REFINE_MAX_TOKENS, 2 * len(text) + 16)


class TextRefiner:
    def __init__(self, model: LoadedModel):
        self.chat = model.chat
        self._lock = threading.Lock()
        self.calls = 0

    def refine(self, texts: list[str], seed: int, temperature: float = 0.7, top_p: float = 0.7, top_k: int = 20) -> list[str]:
        """Refined versions of ``texts`` (same order). Deterministic for a seed."""
        if not texts:
            return []
        chat = self.chat
        params = chat.RefineTextParams(
            temperature=temperature,
            top_P=top_p,
            top_K=top_k,
            max_new_token=max(refine_token_cap(t) for t in texts),
            show_tqdm=False,
            manual_seed=seed,
        )
        with self._lock, torch.inference_mode():
            self.calls += 1
            refined = chat._refine_text(list(texts), chat.device, params)
            # As ChatTTS's own infer does: keep text tokens and tags below [break_0].
            ids = [i[i.less(chat.tokenizer.break_0_ids)] for i in refined.ids]
            out = chat.tokenizer.decode(ids)
            refined.destroy()
        # The BERT decoder joins tokens with spaces; CJK text reads better without them.
        return [_join_cjk(t) for t in out]


def _join_cjk(text: str) -> str:
    parts = text.split(" ")
    out = []
    for p in parts:
        if out and (_is_cjk(out[-1][-1:]) or _is_cjk(p[:1]) or p.startswith("[") or out[-1].endswith("]")):
            out[-1] += p
        else:
            out.append(p)
    return " ".join(out)


def _is_cjk(ch: str) -> bool:
    return bool(ch) and SAYABLE_CJK_RE.match(ch) is not None
