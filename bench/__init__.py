"""Benchmarks of chattts-serve: ``python -m bench <subcommand>`` (``python -m bench --help``;
what each measures and the current results: bench/README.md).

Layout:

* ``lib/``: what the runners share. ``stats`` (percentiles, medians, ratios), ``procs``
  (subprocesses, ports, process groups, waits, thread CPU time), ``sampler`` (the periodic
  sampler thread: RSS, GPU), ``harness`` (a run's metadata, signals, partial reports, paths
  relative to the output), ``serve`` (the Serve config and the app on a local Ray),
  ``cluster`` (a multi-node Ray on this host), ``loadgen`` (HTTP load), ``corpus`` (request
  texts and the audio they must give), ``pyspy`` (profiles), ``render`` (report helpers).
* one module per subcommand: ``run`` (and ``run_report``), ``compare``, ``report``,
  ``ceiling``, ``baseline``, ``cache_hit``, ``realtime``, ``autoscale``, ``gpu``.
* ``studies/``: measurements behind a code choice, not runs of the service: ``numerics`` (int8
  against float32), ``text_compare`` (our text rules against WeTextProcessing).
"""
