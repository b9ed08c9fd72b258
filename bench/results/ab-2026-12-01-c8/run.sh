#!/usr/bin/env bash
# Alternating closed-loop 8-client runs: before (80930ea) and after (8874fda, then HEAD of the recovered work).
# Run from a directory that holds two worktrees, before/ and after/, each with its own .venv;
# each run writes its report to ./<before|after>-<i>/ and its console to ./<before|after>-<i>.log.
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
