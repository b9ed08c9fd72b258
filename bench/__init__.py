"""Benchmarks of chattts-serve: ``python -m bench <runner>`` (bench/README.md: what each measures,
the current results).

* one module per runner, listed in ``__main__.RUNNERS`` (``add_arguments`` and ``main``): ``run``
  (its report: ``run_report``), ``ceiling``, ``baseline``, ``realtime``, ``gpu``, ``fidelity``,
  ``abuse`` (its attackers: ``abuse_attackers``), ``batch``, ``cache_hit``, ``report``;
* ``lib/``, what the runners share (and the tests: processes, clusters, waits, running apps):
  ``procs`` (subprocesses, ports, their environment), ``waiting``, ``machine`` (which process is
  which part, CPU per process and thread), ``sampler`` (RSS, GPU), ``pinning``, ``cluster`` (a
  multi-node Ray on this host), ``config`` (the Serve config and its overrides), ``serve`` (the
  app on a local Ray, a running app's state), ``loadgen`` (HTTP load), ``corpus`` (texts and the
  audio they give), ``reference`` (ChatTTS's own decode), ``first_audio`` (its hops), ``pyspy``
  (profiles), ``stats``, ``harness`` (a run's metadata, signals, partial reports, paths) and
  ``report`` (the one writer of every report's JSON, Markdown and plot).
"""
