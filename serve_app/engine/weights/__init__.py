"""ChatTTS weights: find real ones, or build random ones in ChatTTS's own asset layout.

Every source ends in the same call, ``ChatTTS.Chat._load(**asset_paths)``, so random weights
exercise exactly the loading code that real weights do. ``Chat.load(source="custom")`` is not
used for them because it checks the SHA-256 sums of the published assets.

Random weights (``random`` full size, ``random-tiny`` with a 1-layer GPT and shallow decoder and
vocoder, ``random-deep`` at every real depth with narrow MLPs) are built once per (kind, seed,
layout version) into the cache directory, under a file
lock and with an atomic rename, so replicas starting together neither clash nor read a
half-written tree. A manifest ``chattts_serve.json`` beside ``asset/`` records the config
overrides the small variants need; real weights have no manifest and load with ChatTTS's defaults.

The parts: ``sources.py`` finds the weights a config asks for (a local path, the Hugging Face
cache or hub, random ones) as a ``ResolvedWeights``; ``random_weights.py`` builds random
weights with ChatTTS's architecture and writes them in its asset layout; ``loading.py`` loads
them (``load_model`` through ``Chat._load``, ``load_vocoder`` for the Decoder and Vocos only);
``chattts.py`` imports ChatTTS's modules without its package ``__init__`` and gives a private
copy of its Config with overrides. Import each name from its module.
"""
