"""A new row's prefill: its prompt, built the way ChatTTS builds it, run through the GPT alone.

The row's KV and last hidden state (``Prefilled``) then join the running batch in one merge
(``BatchState.merge``); the hidden state yields the row's first token.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache

from .batch import NUM_VQ, Prefilled
from .row import Row


class Prefiller:
    """ChatTTS's prompt format (tokenizer, speaker embedding, a reference clip's codes) and the GPT
    forward over one row's whole prompt. Called on the decode thread under inference mode."""

    def __init__(self, chat: Any, gpt: Any, embed: Any, device: Any, gpt_device: Any, gpt_dtype: torch.dtype):
        self.chat = chat
        self.gpt = gpt  # transformers LlamaModel
        self.embed = embed  # ChatTTS Embed
        self.device = device  # where hidden states go (the sampler's device)
        self.gpt_device = gpt_device
        self.gpt_dtype = gpt_dtype

    def __call__(self, row: Row) -> Prefilled:
        chat = self.chat
        req = row.req
        # ChatTTS's own prompt building (Chat._infer_code): a reference clip's transcript goes
        # into the text, its audio codes after the text (the tokenizer's ``prompt``).
        text = chat.speaker.decorate_code_prompts([req.text], req.prompt, req.txt_smp, req.spk_emb)
        codes = chat.speaker.decode_prompt(req.spk_smp) if req.spk_smp is not None else None
        input_ids, _attn, text_mask = chat.tokenizer.encode(text, NUM_VQ, prompt=codes, device=self.gpt_device)
        emb = self.embed(input_ids, text_mask)
        if row.req.spk_emb is not None:
            chat.speaker.apply(emb, row.req.spk_emb, input_ids, chat.tokenizer.spk_emb_ids, self.gpt_device)
        row.prompt_len = int(input_ids.shape[1])
        cache = DynamicCache(config=self.gpt.config)
        out = self.gpt(
            inputs_embeds=emb.to(self.gpt_device, self.gpt_dtype),
            position_ids=torch.arange(row.prompt_len, device=self.gpt_device).unsqueeze(0),
            cache=cache,
            use_cache=True,
        )
        hidden = out.last_hidden_state[:, -1].to(self.device, torch.float32)
        keys = [layer.keys for layer in cache.layers]
        values = [layer.values for layer in cache.layers]
        return Prefilled(row, keys, values, hidden)
