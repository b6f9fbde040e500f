#!/bin/bash
# Convert a large image tree on a Slurm array: 64 tasks each write one part, then one job merges.
#
#   jid=$(sbatch --parsable examples/slurm-convert-array.sh)
#   sbatch --dependency=afterok:$jid --wrap 'prep merge /shared/scans-shards /shared/parts/*'
#
# Every task plans the whole job and keeps its own range of it, so the parts agree without
# talking to each other; a task that is re-run resumes (convert starts its part again, synth
# keeps finished shards). /shared must be a file system every node sees.
#SBATCH --job-name=prep-convert
#SBATCH --array=0-63
#SBATCH --cpus-per-task=16
#SBATCH --mem=8G
#SBATCH --time=04:00:00
set -euo pipefail
# --channels and --size spare every task from reading every file's header to decide them.
prep convert /shared/scans --size 224x224 --channels 3 \
    --out "/shared/parts/$SLURM_ARRAY_TASK_ID" \
    --part "$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT" --jobs "$SLURM_CPUS_PER_TASK" --quiet
