#!/bin/bash
# shellcheck disable=SC2016,SC2317  # single-quoted bash -c expands on the node; the trap calls stop_servers
# Conveyor on the training nodes themselves (see deploy/README.md): one `conveyor serve` per
# node, started in the background with `srun --overlap` so it shares the node with the trainer.
#
#   DATASET=/shared/datasets/robot CONFIG=/shared/conveyor/pipeline.yaml \
#   TRAIN_SCRIPT=/shared/me/train.py sbatch deploy/slurm/conveyor_srun_same_nodes.sh
#
# FAILOVER=0 (default): each server listens on 127.0.0.1:7700 and needs no token; each node's
#   ranks read only from their own node (CONVEYOR_SERVERS=127.0.0.1:7700). If that server dies,
#   the ranks on that node have nowhere to go.
# FAILOVER=1: the ranks also list the other nodes' servers at their NodeAddr (CONVEYOR_SERVERS=
#   127.0.0.1:7700,10.1.0.12:7700,...) and fail over to them. Those must be reachable over the
#   network, so every server listens on 0.0.0.0:7700, and a non-loopback listener needs a bearer
#   token over TLS: the token and a self-signed certificate for the name conveyor-job-JOBID are
#   generated per job into SHARED_DIR and every client (the local one too) presents the token and
#   checks the certificate (docs/serving.md "Security").
# Either way the job's ranks share a job secret (CONVEYOR_JOB_SECRET, docs/launch.md), so no
# other client can stream under the job's name into its ledger and metrics.
#
#SBATCH --job-name=conveyor-train
#SBATCH --time=12:00:00
#SBATCH --output=conveyor-train-%j.out
#SBATCH --partition=gpu
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=96
set -euo pipefail

export CONVEYOR=${CONVEYOR:-conveyor}   # the binary: on PATH (the Debian package's /usr/bin/conveyor), or a build tree's tools/conveyor
export DATASET=${DATASET:?DATASET: the dataset directory on the shared filesystem, or an http(s):// URL}
export CONFIG=${CONFIG:?CONFIG: the pipeline config, e.g. /usr/share/conveyor/examples/pipeline.yaml (package) or examples/pipeline.yaml}
export PORT=${PORT:-7700}
export THREADS=${THREADS:-4}       # decode threads per stream; leave cores for the trainer
export GRACE=${GRACE:-10}
export STEPS=${STEPS:-100}         # smoke test only (no TRAIN_SCRIPT): batches per consumer
export GPUS_PER_NODE=${GPUS_PER_NODE:-8}
export TRAIN_SCRIPT=${TRAIN_SCRIPT:-}
export FAILOVER=${FAILOVER:-0}
READY_TIMEOUT=${READY_TIMEOUT:-300}
SHARED_DIR=${SHARED_DIR:-$HOME/.conveyor}   # must be on a filesystem every node mounts

export RUN_DIR="$SHARED_DIR/job-$SLURM_JOB_ID"
umask 077
mkdir -p "$RUN_DIR"
# Nodes are reached by their NodeAddr in SLURM (what slurmctld itself uses; it defaults to the
# node's name when the admin set none), never by resolving the node's name: the two differ on
# many clusters. PEERS: "NAME=ADDRESS ..." for every node of the job.
node_addr() {
  local addr
  addr=$(scontrol show node "$1" | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p')
  addr=${addr:-$1}
  [[ $addr != *:* ]] || addr="[$addr]"
  printf '%s\n' "$addr"
}
PEERS=""
MASTER_ADDR=""
while read -r h; do
  a=$(node_addr "$h")
  PEERS+="$h=$a "
  MASTER_ADDR=${MASTER_ADDR:-$a}
done < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
export PEERS MASTER_ADDR
if [[ $FAILOVER == 1 ]]; then
  export LISTEN="0.0.0.0:$PORT" TOKEN_FILE="$RUN_DIR/token"
  openssl rand -hex 32 > "$TOKEN_FILE"
  chmod 600 "$TOKEN_FILE"
  export TLS_CERT="$RUN_DIR/tls.crt" TLS_KEY="$RUN_DIR/tls.key" TLS_NAME="conveyor-job-$SLURM_JOB_ID"
  openssl req -x509 -newkey rsa:3072 -nodes -days 30 -keyout "$TLS_KEY" -out "$TLS_CERT" \
    -subj "/CN=$TLS_NAME" -addext "subjectAltName=DNS:$TLS_NAME" 2>/dev/null
  # For the training script's client: the token, the roots and the name to check.
  export CONVEYOR_AUTH_TOKEN_FILE="$TOKEN_FILE" CONVEYOR_TLS_CA_FILE="$TLS_CERT" CONVEYOR_TLS_SERVER_NAME="$TLS_NAME"
else
  # 127.0.0.1: the server admits this job's user (and root) only, by uid (docs/serving.md
  # "Who may connect").
  export LISTEN="127.0.0.1:$PORT" TOKEN_FILE="" TLS_CERT="" TLS_KEY="" TLS_NAME=""
fi
CONVEYOR_JOB_SECRET=$(openssl rand -hex 16)
export CONVEYOR_JOB_SECRET

SERVERS_PID=""
stop_servers() {
  if [[ -n $SERVERS_PID ]] && kill -0 "$SERVERS_PID" 2>/dev/null; then
    # SIGTERM to the servers' step, so that every server drains (health NOT_SERVING, streams end,
    # clients move on) and exits. Not to srun: srun answers SIGTERM by killing its tasks outright.
    local step
    step=$(squeue -h -s -j "$SLURM_JOB_ID" -o '%i %j' | awk '$2 == "conveyor-servers" {print $1}')
    if [[ -n $step ]]; then
      scancel --signal=TERM "$step" 2>/dev/null || true
    else
      kill -TERM "$SERVERS_PID" 2>/dev/null || true
    fi
    for _ in $(seq $((GRACE + 15))); do
      kill -0 "$SERVERS_PID" 2>/dev/null || break
      sleep 1
    done
    kill -KILL "$SERVERS_PID" 2>/dev/null || true
  fi
  [[ -z $SERVERS_PID ]] || wait "$SERVERS_PID" 2>/dev/null || true
  rm -rf "$RUN_DIR"
}
trap stop_servers EXIT
trap 'exit 143' TERM INT

# One server per node. --overlap lets this step share CPUs, memory and GPUs with the trainer step.
srun --overlap --job-name=conveyor-servers --nodes="$SLURM_NNODES" --ntasks-per-node=1 \
  --kill-on-bad-exit=0 \
  --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" \
  bash -c 'exec "$CONVEYOR" serve "$DATASET" --config "$CONFIG" --listen "$LISTEN" \
    ${TOKEN_FILE:+--auth-token-file "$TOKEN_FILE"} ${TLS_CERT:+--tls-cert "$TLS_CERT" --tls-key "$TLS_KEY"} \
    --threads "$THREADS" --grace-seconds "$GRACE" \
    --ready-file "$RUN_DIR/ready.$SLURM_NODEID"' &
SERVERS_PID=$!

deadline=$((SECONDS + READY_TIMEOUT))
while :; do
  ready=$(find "$RUN_DIR" -maxdepth 1 -name 'ready.*' | wc -l)
  [[ $ready -lt $SLURM_NNODES ]] || break
  kill -0 "$SERVERS_PID" 2>/dev/null || { echo "conveyor: servers exited before ready" >&2; exit 1; }
  [[ $SECONDS -lt $deadline ]] || { echo "conveyor: $ready/$SLURM_NNODES servers ready after ${READY_TIMEOUT}s" >&2; exit 1; }
  sleep 2
done
echo "conveyor: $SLURM_NNODES servers ready (listen $LISTEN)"

# The trainers: on each node, the local server first, then (FAILOVER=1) the other nodes'.
rc=0
srun --nodes="$SLURM_NNODES" --ntasks-per-node=1 --kill-on-bad-exit=1 \
  --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" \
  bash -c 'servers="127.0.0.1:$PORT"
    if [[ $FAILOVER == 1 ]]; then
      for p in $PEERS; do [[ ${p%%=*} == "$SLURMD_NODENAME" ]] || servers+=",${p#*=}:$PORT"; done
    fi
    export CONVEYOR_SERVERS=$servers
    if [[ -n $TRAIN_SCRIPT ]]; then
      exec torchrun --nnodes="$SLURM_STEP_NUM_NODES" --nproc-per-node="$GPUS_PER_NODE" \
        --rdzv-id="$SLURM_JOB_ID" --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:29500" \
        "$TRAIN_SCRIPT"
    fi
    # Consumer SLURM_PROCID of SLURM_STEP_NUM_TASKS: the client reads them (docs/launch.md).
    exec "$CONVEYOR" fetch --job "job-$SLURM_JOB_ID" --steps "$STEPS" --digest \
      ${TOKEN_FILE:+--auth-token-file "$TOKEN_FILE"} ${TLS_CERT:+--tls-ca "$TLS_CERT" --tls-server-name "$TLS_NAME"}' || rc=$?
echo "conveyor: trainers exited with $rc"
exit "$rc"   # the EXIT trap drains the servers and removes the job directory
