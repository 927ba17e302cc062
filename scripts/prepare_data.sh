#!/usr/bin/env bash
# Prepare DAPO 14.1k and the seven validation benchmarks as verl RL parquet, once per template.
# Needs the Hugging Face hub (GPQA-Diamond is gated: accept its terms and `huggingface-cli login`,
# or add `--skip gpqa_diamond`). Writes $DATA_DIR/<template>/{train,val}.parquet, val/<bench>.parquet
# and manifest.json, which the recipes read (paths.data_dir=$DATA_DIR).
#   DATA_DIR=/data/verl_gdro bash scripts/prepare_data.sh                    # answer template
#   DATA_DIR=/data/verl_gdro TEMPLATE=boxed bash scripts/prepare_data.sh     # boxed template
set -euo pipefail
PYTHON=${PYTHON:-python3}
DATA_DIR=${DATA_DIR:-$HOME/data/verl_gdro}
TEMPLATE=${TEMPLATE:-answer}
exec "$PYTHON" -m verl_gdro.data.prepare --out-dir "$DATA_DIR" --template "$TEMPLATE" "$@"
