"""Silence libraries' progress bars and chatter in the serving path (logs stay ours)."""

from __future__ import annotations

import logging
import os
import sys
import warnings


def quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Only where transformers is loaded (or loads later: its verbosity also comes from the
    # environment): importing it just to quiet it costs ~230 MiB in the Vocoder stage.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    try:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    except ImportError:  # pragma: no cover
        pass
    # ChatTTS logs every loaded module at INFO; keep its warnings.
    logging.getLogger("ChatTTS").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*past_key_values.*", category=FutureWarning)
