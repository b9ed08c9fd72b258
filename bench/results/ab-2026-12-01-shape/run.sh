#!/usr/bin/env bash
# Alternating closed-loop 8-client runs: before (84fe060, the code before the layered reshaping)
# and after (the reshaped code with the abuse limits; its commit is in each report's meta.git).
# Run from a directory that holds two checkouts, before/ and after/, each with its own .venv
# (python -m venv .venv && .venv/bin/pip install -e ".[bench]"); each run writes its report to
# ./<before|after>-<i>/ and its console to ./<before|after>-<i>.log. Order: b a, a b, b a.
set -u
export RAY_AUTH_MODE=disabled
here=$PWD
for i in 1 2 3; do
  for v in before after; do
    if [ $i = 2 ]; then [ $v = before ] && v=after || v=before; fi
    out=$here/$v-$i
    [ -e $out/report.json ] && continue
    echo "$(date +%T) start $v-$i load $(cut -d' ' -f1 /proc/loadavg)"
    (cd $here/$v && timeout 900 .venv/bin/python -m bench run --phases serve --serve-levels 8 --duration-scale 1.5 --no-progress --out $out > $here/$v-$i.log 2>&1)
    echo "$(date +%T) end $v-$i rc=$?"
  done
done
