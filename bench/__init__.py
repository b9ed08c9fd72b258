"""Benchmarks of chattts-serve: ``python -m bench run [--quick] [--out DIR]`` (see bench/README.md).

Modules: ``corpus`` (request texts), ``loadgen`` (async httpx load generator and statistics),
``ceiling`` (the model's raw in-process throughput), ``baseline`` (the "before" server),
``serve_runner`` (the project on Ray Serve), ``procs`` (subprocesses, ports, RSS sampling),
``report`` (JSON, Markdown, PNG) and ``runner`` (the phases of one run).
"""
