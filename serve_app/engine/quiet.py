"""Silence libraries' progress bars and chatter in the serving path (logs stay ours)."""

from __future__ import annotations

import logging
import os
import warnings


def quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:  # pragma: no cover - transformers is a dependency
        pass
    try:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    except ImportError:  # pragma: no cover
        pass
    # ChatTTS logs every loaded module at INFO; keep its warnings.
    logging.getLogger("ChatTTS").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*past_key_values.*", category=FutureWarning)
