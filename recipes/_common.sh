#!/usr/bin/env bash
# Shared body of the recipes: verl 0.9.1's own main_ppo on the verl-gdro package config
# (verl_gdro/config/gdro_trainer.yaml = verl's ppo_trainer + the gdro group) plus one experiment
# from hydra_configs/experiment/. Sourced by recipes/<experiment>.sh after it sets EXPERIMENT.
#
# Environment (defaults in brackets):
#   DATA_DIR       prepared parquet root, see scripts/prepare_data.sh   [$HOME/data/verl_gdro]
#   OUTPUT_DIR     checkpoints and validation dumps                     [<repo>/checkpoints]
#   MODEL_ROOT     hub organisation or local folder with Qwen3-*-Base    [Qwen]
#   NNODES, GPUS_PER_NODE                                                [recipe's value, 8]
#   PRESET         robust | paper | release (GDRO runs)                  [robust]
#   TEMPLATE       answer | boxed (prompt template + its scorer)         [answer]
#   SEED           data order, vLLM sampling, Rollout-GDRO sampler       [0]
#   PROJECT, EXP_NAME, LOGGER (Hydra list)                             [[console,file]]
#                  e.g. "[console,file,wandb]"; `file` is what `verl-gdro plot` reads
#   METRICS_DIR    verl's file-logger JSONL, one file per start of the run [$OUTPUT_DIR/$PROJECT/$EXP_NAME/metrics]
#   PYTHON         interpreter                                           [python3]
#   DRY_RUN=1      compose + validate + print, no Ray/GPU (verl_gdro.dryrun)
# Extra Hydra overrides: "$@" (e.g. trainer.total_training_steps=10).
set -euo pipefail

: "${EXPERIMENT:?set EXPERIMENT (the recipe does)}"
REPO_DIR=${REPO_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
PYTHON=${PYTHON:-python3}
DATA_DIR=${DATA_DIR:-$HOME/data/verl_gdro}
OUTPUT_DIR=${OUTPUT_DIR:-$REPO_DIR/checkpoints}
MODEL_ROOT=${MODEL_ROOT:-Qwen}
NNODES=${NNODES:-1}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
PRESET=${PRESET:-robust}
TEMPLATE=${TEMPLATE:-answer}
SEED=${SEED:-0}
PROJECT=${PROJECT:-verl_gdro}
LOGGER=${LOGGER:-[console,file]}
# The run's name (its checkpoint and log folder) carries every setting that changes the run, so
# two different runs never share a folder (resume_mode=auto would load one into the other): the
# preset (also for the GRPO baseline: it sets the classifier whose bins it logs and saves), the
# template, the seed, the bins an override sets, and a digest of the other overrides. Overrides
# that only say how to run (resume, logging, save and test frequency) are left out of the digest.
RUN_OVERRIDES=()
BINS=""
for arg in "$@"; do
    case $arg in
        trainer.resume_mode=*|trainer.resume_from_path=*|trainer.logger=*|trainer.save_freq=*|\
        trainer.test_freq=*|trainer.val_before_train=*|trainer.experiment_name=*|trainer.project_name=*) ;;
        --*) ;;  # the dry run's own flags (--quiet, --require-data), not overrides
        gdro.classifier.num_bins=*) BINS=_b${arg#*=}; RUN_OVERRIDES+=("$arg") ;;
        *) RUN_OVERRIDES+=("$arg") ;;
    esac
done
DIGEST=""
if (( ${#RUN_OVERRIDES[@]} )); then
    DIGEST=_o$(printf '%s\n' "${RUN_OVERRIDES[@]}" | cksum | awk '{printf "%08x", $1}')
fi
EXP_NAME=${EXP_NAME:-${EXPERIMENT}_${PRESET}_${TEMPLATE}${BINS}_seed${SEED}${DIGEST}}

ARGS=(
    --config-path="$REPO_DIR/verl_gdro/config"
    --config-name=gdro_trainer
    --config-dir="$REPO_DIR/hydra_configs"
    +experiment="$EXPERIMENT"
    template="$TEMPLATE"
    gdro.preset="$PRESET"
    seed="$SEED"
    paths.data_dir="$DATA_DIR"
    paths.output_dir="$OUTPUT_DIR"
    paths.model_root="$MODEL_ROOT"
    trainer.nnodes="$NNODES"
    trainer.n_gpus_per_node="$GPUS_PER_NODE"
    trainer.project_name="$PROJECT"
    trainer.experiment_name="$EXP_NAME"
    trainer.logger="$LOGGER"
)

# verl's file logger (VERL_FILE_LOGGER_PATH) truncates the file it opens: a resumed run writes a
# new file in the same folder, and `verl-gdro plot $METRICS_DIR` reads them all, in order.
METRICS_DIR=${METRICS_DIR:-$OUTPUT_DIR/$PROJECT/$EXP_NAME/metrics}
if [[ ${DRY_RUN:-0} != 1 && -z ${VERL_FILE_LOGGER_PATH:-} ]]; then
    mkdir -p "$METRICS_DIR"
    export VERL_FILE_LOGGER_PATH="$METRICS_DIR/$(date -u +%Y%m%dT%H%M%SZ)-$$.jsonl"
fi

if [[ ${DRY_RUN:-0} == 1 ]]; then
    exec "$PYTHON" -m verl_gdro.dryrun "${ARGS[@]}" "$@"
fi
exec "$PYTHON" -m verl.trainer.main_ppo "${ARGS[@]}" "$@"
