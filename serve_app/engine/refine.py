"""Optional text refinement: ChatTTS's GPT in text mode adds prosody tags ([uv_break], [laugh]...).

It is a second, autoregressive generation over the text (up to a few hundred tokens), so it is
off by default and only runs when a request asks for ``refine_text``. It is ChatTTS's own
``Chat._refine_text`` (the same prompt, processors and seeded sampling, so the same output),
with a per-call seed; ChatTTS's generator is shared, hence one generation at a time.

Bounded, so one request cannot hold it (``AcousticConfig``):

- **Input**: at most ``refine_max_texts`` segments and ``refine_max_chars`` characters per call
  (``RequestTooLarge``); each text's generation is capped near its length (``refine_token_cap``).
- **Turns**: a call's segments are refined ``REFINE_BATCH`` at a time, each batch one generation;
  between two batches other calls' batches go first (``refine_async``: one refine thread, its
  queue in arrival order), and a batch that cannot start within ``refine_wait_s`` gives up
  (``RefineBusy``).
- **Cancellation**: a ``threading.Event`` checked before every generated token (a logits
  processor ChatTTS's ``gpt.generate`` calls each step): a set event ends the generation at once
  with ``RefineCancelled``. ``refine_async`` sets it when its awaiting task is cancelled (the
  client went away), and drops its batches still queued.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Optional

import torch

from .config import AcousticConfig
from .errors import RefineBusy, RefineCancelled, RequestTooLarge
from .text.chars import SAYABLE_CJK_RE
from .threads import TorchThread
from .weights.loading import LoadedModel

# Refined text is the input plus a few tags: cap the generation near the input's length.
REFINE_MAX_TOKENS = 384
# Segments refined together in one generation: the refiner's turn. A larger batch costs about the
# same per step, but holds the refiner (one generation at a time) longer for everyone waiting.
REFINE_BATCH = 8


def refine_token_cap(text: str) -> int:
    return min(REFINE_MAX_TOKENS, 2 * len(text) + 16)


class _StopWhenCancelled:
    """A logits processor for ``gpt.generate``: called once per generated token, before
    sampling; raises when the caller has gone away (the generation's state is dropped)."""

    def __init__(self, cancel: threading.Event):
        self.cancel = cancel

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.cancel.is_set():
            raise RefineCancelled("refine_text cancelled: its caller went away")
        return scores


class TextRefiner:
    batch = REFINE_BATCH  # segments per generation

    def __init__(self, model: LoadedModel, config: AcousticConfig = AcousticConfig()):
        self.chat = model.chat
        self.cfg = config
        self._lock = threading.Lock()
        self.calls = 0  # generations run (one per batch)

    def configure(self, config: AcousticConfig) -> None:
        """Take the refine_* limits of ``config`` (live: from the next call)."""
        self.cfg = config

    def check(self, texts: list[str]) -> None:
        """``RequestTooLarge`` past the per-call limits."""
        if len(texts) > self.cfg.refine_max_texts:
            raise RequestTooLarge(
                f"refine_text input is {len(texts)} segments; the limit is "
                f"{self.cfg.refine_max_texts} (refine_max_texts): send less text or no refine_text"
            )
        chars = sum(len(t) for t in texts)
        if chars > self.cfg.refine_max_chars:
            raise RequestTooLarge(
                f"refine_text input is {chars} characters after normalisation; the limit is "
                f"{self.cfg.refine_max_chars} (refine_max_chars): send less text or no refine_text"
            )

    def batches(self, texts: list[str]) -> list[list[str]]:
        return [texts[i : i + self.batch] for i in range(0, len(texts), self.batch)]

    def refine(
        self,
        texts: list[str],
        seed: int,
        temperature: float = 0.7,
        top_p: float = 0.7,
        top_k: int = 20,
        cancel: Optional[threading.Event] = None,
    ) -> list[str]:
        """Refined versions of ``texts`` (same order), batch after batch on the calling thread.
        Deterministic for a seed. For callers on their own threads (CLI, tests); a Serve replica
        uses ``refine_async``."""
        self.check(texts)
        out: list[str] = []
        for batch in self.batches(texts):
            out += self.refine_batch(batch, seed, temperature, top_p, top_k, cancel=cancel)
        return out

    def refine_batch(
        self,
        texts: list[str],
        seed: int,
        temperature: float = 0.7,
        top_p: float = 0.7,
        top_k: int = 20,
        cancel: Optional[threading.Event] = None,
        wait_s: Optional[float] = None,
    ) -> list[str]:
        """One generation over ``texts`` (at most ``batch``, unchecked here). Waits at most
        ``wait_s`` (default ``refine_wait_s``) for a generation in progress (``RefineBusy``);
        ``cancel`` set before or during it: ``RefineCancelled``."""
        if not texts:
            return []
        cancel = cancel or threading.Event()
        if cancel.is_set():
            raise RefineCancelled("refine_text cancelled: its caller went away")
        wait = self.cfg.refine_wait_s if wait_s is None else wait_s
        if not self._lock.acquire(timeout=wait):
            raise RefineBusy(f"refine_text could not start within {wait:g} s (refine_wait_s): the refiner is busy")
        try:
            with torch.inference_mode():
                self.calls += 1
                ids = self._generate(texts, seed, temperature, top_p, top_k, cancel)
                out = self.chat.tokenizer.decode(ids)
        finally:
            self._lock.release()
        # The BERT decoder joins tokens with spaces; CJK text reads better without them.
        return [_join_cjk(t) for t in out]

    def _generate(
        self, texts: list[str], seed: int, temperature: float, top_p: float, top_k: int, cancel: threading.Event
    ) -> list[torch.Tensor]:
        """ChatTTS's ``Chat._refine_text`` (0.2.5, the non-vLLM path) with RefineTextParams'
        defaults, plus the cancel check; returns each text's kept token ids."""
        from ChatTTS.model import GPT, gen_logits

        chat = self.chat
        params = chat.RefineTextParams(
            temperature=temperature,
            top_P=top_p,
            top_K=top_k,
            max_new_token=max(refine_token_cap(t) for t in texts),
            show_tqdm=False,
            manual_seed=seed,
        )
        input_ids, attention_mask, text_mask = chat.tokenizer.encode(
            chat.speaker.decorate_text_prompts(list(texts), params.prompt),
            chat.config.gpt.num_vq,
            device=chat.device_gpt,
        )
        logits_warpers, logits_processors = gen_logits(
            num_code=chat.tokenizer.len,
            top_P=params.top_P,
            top_K=params.top_K,
            repetition_penalty=params.repetition_penalty,
        )
        emb = chat.embed(input_ids, text_mask)
        del text_mask
        result = next(
            chat.gpt.generate(
                emb,
                input_ids,
                temperature=torch.tensor([params.temperature], device=chat.device),
                eos_token=chat.tokenizer.eos_token,
                attention_mask=attention_mask,
                max_new_token=params.max_new_token,
                min_new_token=params.min_new_token,
                logits_processors=(_StopWhenCancelled(cancel), *logits_processors, *logits_warpers),
                infer_text=True,
                stream=False,
                show_tqdm=False,
                ensure_non_empty=params.ensure_non_empty,
                manual_seed=params.manual_seed,
                context=GPT.Context(),  # ours, not the Chat's: Chat.interrupt() is not this call's
            )
        )
        # As ChatTTS's own infer does: keep text tokens and tags below [break_0].
        ids = [i[i.less(chat.tokenizer.break_0_ids)] for i in result.ids]
        result.destroy()
        return ids


async def refine_async(refiner: TextRefiner, thread: TorchThread, texts: list[str], seed: int) -> list[str]:
    """``refiner.refine`` for an event loop, its generations on ``thread`` (one at a time, in
    arrival order): each batch is queued on its own, so other calls' batches interleave with
    this call's; a batch not started within ``refine_wait_s`` raises ``RefineBusy``. Cancelling
    the awaiting task (the caller went away) drops the batches still queued and stops the one
    running before its next token."""
    refiner.check(texts)
    loop = asyncio.get_running_loop()
    cancel = threading.Event()
    job = None
    out: list[str] = []
    try:
        for batch in refiner.batches(texts):
            started = loop.create_future()

            def run(batch: list[str] = batch, started: asyncio.Future = started) -> list[str]:
                try:
                    loop.call_soon_threadsafe(_set_started, started)
                except RuntimeError:  # the loop is gone: nobody is waiting
                    cancel.set()
                return refiner.refine_batch(batch, seed, cancel=cancel, wait_s=refiner.cfg.refine_wait_s)

            job = thread.submit(run)
            wait = refiner.cfg.refine_wait_s
            try:
                await asyncio.wait_for(asyncio.shield(started), wait)
            except asyncio.TimeoutError:
                raise RefineBusy(
                    f"refine_text could not start within {wait:g} s (refine_wait_s): "
                    "the refiner is busy with other requests"
                ) from None
            out += await asyncio.wrap_future(job)
            job = None
        return out
    except BaseException:
        cancel.set()  # a running batch stops before its next token
        if job is not None:
            job.cancel()  # a queued one never starts
        raise


def _set_started(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


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
