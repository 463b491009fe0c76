# Shared by start.sh and stop.sh (sourced, not run). Names, paths and small helpers.
# shellcheck shell=bash disable=SC2034  # the variables are used by the scripts sourcing this

STATE=${RLVLA3_SLURM_STATE:-/var/lib/rlvla3-slurm}
CLUSTER=rlvla3local
NODES=(cpu1 cpu2 gpu1 gpu2)
CTLD_PORT=6817
DBD_PORT=6819
# slurmd ports: cpu1=6831, cpu2=6832, gpu1=6833, gpu2=6834 (every virtual node needs its own).
SLURMD_PORT_BASE=6831
SLURMDS=()   # pid-file names and process name of the slurmds, for stop_pids
for n in "${NODES[@]}"; do SLURMDS+=("slurmd-$n:slurmd"); done
DB_NAME=slurm_acct_db
DB_SOCKET=$STATE/run/mysqld/mysqld.sock   # in a folder the mysql user owns
# Every file this project writes outside $STATE carries this marker, so we only ever
# overwrite our own files and never a real site's Slurm config.
MARKER="# rlvla3-local-slurm: written by slurm/local/start.sh"
SLURM_ETC=/etc/slurm

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }
log() { echo "[slurm-local] $*"; }

# alive PID: the process exists and is not a zombie. Daemons we started are reparented to
# PID 1 when start.sh exits; where PID 1 is no real init it may reap them late, and kill -0
# succeeds on a zombie.
alive() {
  local st
  st=$(sed -n 's/^.*) \(.\).*$/\1/p' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$st" ] && [ "$st" != Z ]
}

# pid_of NAME: print the PID from $STATE/run/NAME.pid if that process is alive and is still
# the program we started (its /proc comm matches), so a recycled PID is never mistaken for ours.
pid_of() {
  local comm=${2:-$1} f="$STATE/run/$1.pid" pid
  [ -s "$f" ] || return 1
  pid=$(tr -dc 0-9 <"$f")
  [ -n "$pid" ] && alive "$pid" || return 1
  [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = "$comm" ] || return 1
  echo "$pid"
}

# queued_jobs [SQUEUE_ARGS...]: the ids squeue lists with those arguments, space-separated
# (empty when none, or when slurmctld does not answer within 10 s).
queued_jobs() { { timeout 10 squeue -h -o %A "$@" 2>/dev/null || true; } | sort -u | tr '\n' ' '; }

# cancel_jobs WAIT WHAT [SQUEUE_ARGS...]: scancel the jobs squeue lists with SQUEUE_ARGS (logged
# as WHAT), then wait up to WAIT s until it lists none of that kind. Fails if some remain.
cancel_jobs() {
  local wait=$1 what=$2 ids i; shift 2
  ids=$(queued_jobs "$@")
  [ -n "${ids// /}" ] || return 0
  log "cancelling $what: $ids"
  # shellcheck disable=SC2086  # one argument per job id
  scancel $ids || true
  for ((i = 0; i < wait * 10; i++)); do
    [ -z "$(queued_jobs "$@")" ] && return 0
    sleep 0.1
  done
  return 1
}

# stop_pids TIMEOUT NAME[:COMM]...: SIGTERM each daemon from its pid file (all at once, so
# their shutdowns overlap), wait up to TIMEOUT seconds, then SIGKILL whatever is left.
# COMM (the process name pid_of checks) defaults to NAME.
stop_pids() {
  local timeout=$1 spec pid i; shift
  local -A pids=()
  for spec in "$@"; do
    if pid=$(pid_of "${spec%%:*}" "${spec#*:}"); then
      kill -TERM "$pid" 2>/dev/null || true
      pids[$spec]=$pid
    fi
  done
  for ((i = 0; i < timeout * 10; i++)); do
    for spec in "${!pids[@]}"; do
      alive "${pids[$spec]}" || { log "stopped ${spec%%:*} (pid ${pids[$spec]})"; unset "pids[$spec]"; }
    done
    [ ${#pids[@]} -gt 0 ] || break
    sleep 0.1
  done
  for spec in "${!pids[@]}"; do
    log "${spec%%:*} (pid ${pids[$spec]}) ignored SIGTERM for ${timeout}s: SIGKILL"
    kill -KILL "${pids[$spec]}" 2>/dev/null || true
  done
  for spec in "$@"; do rm -f "$STATE/run/${spec%%:*}.pid"; done
}
