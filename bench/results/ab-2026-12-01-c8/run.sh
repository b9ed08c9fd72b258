#!/usr/bin/env bash
# Alternating closed-loop 8-client runs: before (80930ea) and after (HEAD of the recovered work).
set -u
export RAY_AUTH_MODE=disabled
for i in 1 2 3; do
  for v in before after; do
    if [ $i = 2 ]; then [ $v = before ] && v=after || v=before; fi
    out=/work/ab/$v-$i
    [ -e $out/report.json ] && continue
    echo "$(date +%T) start $v-$i load $(cut -d' ' -f1 /proc/loadavg)"
    (cd /work/$v && timeout 900 .venv/bin/python -m bench run --phases serve --serve-levels 8 --duration-scale 1.5 --no-progress --out $out > /work/ab/$v-$i.log 2>&1)
    echo "$(date +%T) end $v-$i rc=$?"
  done
done
