#!/usr/bin/env bash
# Closed-loop 8-client runs: before (84fe060, the code before the layered reshaping) and after
# (the reshaped code with the abuse limits; its commit is in each report's meta.git). Run from a
# directory that holds two checkouts, before/ and after/, each with its own .venv
# (python -m venv .venv && .venv/bin/pip install -e ".[bench]"); each run writes its report to
# ./<before|after>-<i>/ and its console to ./<before|after>-<i>.log. The order used (bench/README.md):
# before-1 before-2, then after-1 before-3 after-2 after-3 before-4 after-4.
set -u
export RAY_AUTH_MODE=disabled
here=$PWD
for v in ${RUNS:-before-1 before-2 after-1 before-3 after-2 after-3 before-4 after-4}; do
  side=${v%-*}
  out=$here/$v
  [ -e $out/report.json ] && continue
  echo "$(date +%T) start $v load $(cut -d' ' -f1 /proc/loadavg)"
  (cd $here/$side && timeout 900 .venv/bin/python -m bench run --phases serve --serve-levels 8 --duration-scale 1.5 --no-progress --out $out > $here/$v.log 2>&1)
  echo "$(date +%T) end $v rc=$?"
done
