#!/bin/bash
# distil on several nodes under SLURM: FSDP2 through accelerate, one launcher per node.
#   sbatch configs/accelerate/slurm_multinode.sh configs/countdown_onpolicy.yaml train.bf16=true
# Adjust --nodes / --gpus-per-node (num_processes = nodes x GPUs per node is computed here and
# overrides the config file), the partition, and the environment activation line.
#SBATCH --job-name=distil
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1          # one accelerate launcher per node; it starts a process per GPU
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --time=24:00:00
#SBATCH --output=%x-%j.out
set -euo pipefail

# source .venv/bin/activate          # the environment with distil installed, on every node

GPUS_PER_NODE=${SLURM_GPUS_ON_NODE:-8}
MAIN_IP=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)   # node 0
MAIN_PORT=${MAIN_PORT:-29500}
CONFIG_DIR=$(dirname "$(readlink -f "$0")")
# inside sbatch the script is a copy; run it from the repository (or set CONFIG_DIR)
[ -f "$CONFIG_DIR/fsdp_multinode.yaml" ] || CONFIG_DIR=configs/accelerate

# NCCL over the fast interconnect; uncomment and name the interface if the default is wrong
# export NCCL_SOCKET_IFNAME=ib0
export OMP_NUM_THREADS=8

# srun starts this once per node; SLURM_NODEID (0..nodes-1) is the machine rank
srun --kill-on-bad-exit=1 bash -c "accelerate launch \
  --config_file $CONFIG_DIR/fsdp_multinode.yaml \
  --num_machines $SLURM_NNODES \
  --num_processes $((SLURM_NNODES * GPUS_PER_NODE)) \
  --machine_rank \$SLURM_NODEID \
  --main_process_ip $MAIN_IP \
  --main_process_port $MAIN_PORT \
  -m distil train $*"
