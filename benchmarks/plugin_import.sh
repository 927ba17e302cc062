#!/bin/bash
# import verl: plugin off / this branch's lazy plugin / the eager plugin (main checkout)
# Usage: bash benchmarks/plugin_import.sh  (from any checkout; edit the two repo paths to compare)
cd /tmp
for i in 1 2 3 4 5; do
  for cfg in none:/work/wt32 auto:/work/wt32 auto:/work/main; do
    pol=${cfg%%:*}; repo=${cfg#*:}
    t=$(VERL_USE_EXTERNAL_PLUGINS=$pol PYTHONPATH=$repo PYTHONWARNINGS=ignore OMP_NUM_THREADS=1 /work/main/.venv/bin/python -c "import time; t=time.perf_counter(); import verl; import sys; print(round(time.perf_counter()-t,3), len(sys.modules))" 2>/dev/null | tail -1)
    echo "$pol $repo $t"
  done
done
