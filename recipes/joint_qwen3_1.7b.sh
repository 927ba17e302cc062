#!/usr/bin/env bash
# Prompt-GDRO + Rollout-GDRO (joint, not in the paper's table) on Qwen3-1.7B-Base: DAPO 14.1k, 1000 steps x 256 prompts, n = 4, paper Appendix A
# (hydra_configs/experiment/joint_qwen3_1.7b.yaml). Runs verl's main_ppo on the package config.
#
#   DATA_DIR=/data/verl_gdro NNODES=1 GPUS_PER_NODE=8 bash recipes/joint_qwen3_1.7b.sh [hydra overrides]
#   PRESET=paper bash recipes/joint_qwen3_1.7b.sh         # the literal reading of the paper (PRESET=release: the authors' launch settings)
#   DRY_RUN=1 bash recipes/joint_qwen3_1.7b.sh            # compose + validate on a CPU machine
# All variables: recipes/_common.sh. Multi-node: scripts/slurm/ray_job.sbatch, docs/multinode.md.
set -euo pipefail
export EXPERIMENT=joint_qwen3_1.7b
export NNODES=${NNODES:-1}
export GPUS_PER_NODE=${GPUS_PER_NODE:-8}
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh" "$@"
