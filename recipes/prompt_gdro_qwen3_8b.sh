#!/usr/bin/env bash
# Prompt-GDRO on Qwen3-8B-Base: DAPO 14.1k, 1000 steps x 256 prompts, n = 4, paper Appendix A
# (hydra_configs/experiment/prompt_gdro_qwen3_8b.yaml). Runs verl's main_ppo on the package config.
#
#   DATA_DIR=/data/verl_gdro NNODES=2 GPUS_PER_NODE=8 bash recipes/prompt_gdro_qwen3_8b.sh [hydra overrides]
#   PRESET=paper bash recipes/prompt_gdro_qwen3_8b.sh         # the literal reading of the paper (PRESET=release: the authors' launch settings)
#   DRY_RUN=1 bash recipes/prompt_gdro_qwen3_8b.sh            # compose + validate on a CPU machine
# All variables: recipes/_common.sh. Multi-node: scripts/slurm/ray_job.sbatch, docs/multinode.md.
set -euo pipefail
export EXPERIMENT=prompt_gdro_qwen3_8b
export NNODES=${NNODES:-2}
export GPUS_PER_NODE=${GPUS_PER_NODE:-8}
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh" "$@"
