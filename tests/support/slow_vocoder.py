"""A Vocoder replica slowed on purpose, for the back-pressure tests: the real deployment class,
with a sleep in every decode call (the engine's ``on_decode`` hook)."""

from __future__ import annotations

import time

from ray import serve

from deployments.vocoder import Vocoder


@serve.deployment
class SlowVocoder(Vocoder.func_or_class):
    def __init__(self, *args, delay_s: float = 0.05, **kwargs):
        super().__init__(*args, **kwargs)
        self.vocoder.on_decode = lambda tokens: time.sleep(delay_s)
