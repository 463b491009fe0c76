# Shared by start.sh and stop.sh (sourced, not run). Names, paths and small helpers.

STATE=${RLVLA3_SLURM_STATE:-/var/lib/rlvla3-slurm}
CLUSTER=rlvla3local
NODES=(cpu1 cpu2 gpu1 gpu2)
CTLD_PORT=6817
DBD_PORT=6819
# slurmd ports: cpu1=6831, cpu2=6832, gpu1=6833, gpu2=6834 (every virtual node needs its own).
SLURMD_PORT_BASE=6831
DB_NAME=slurm_acct_db
DB_SOCKET=$STATE/run/mysqld/mysqld.sock   # in a folder the mysql user owns
# Every file this project writes outside $STATE carries this marker, so we only ever
# overwrite our own files and never a real site's Slurm config.
MARKER="# rlvla3-local-slurm: written by slurm/local/start.sh"
SLURM_ETC=/etc/slurm

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }
log() { echo "[slurm-local] $*"; }

# pid_of NAME: print the PID from $STATE/run/NAME.pid if that process is alive and is still
# the program we started (its /proc comm matches), so a recycled PID is never mistaken for ours.
pid_of() {
  local name=$1 comm=${2:-$1} f="$STATE/run/$1.pid" pid
  [ -s "$f" ] || return 1
  pid=$(tr -dc 0-9 <"$f")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = "$comm" ] || return 1
  echo "$pid"
}

# stop_pid NAME [COMM] [TIMEOUT]: SIGTERM the daemon from its pid file, wait, SIGKILL if stuck.
stop_pid() {
  local name=$1 comm=${2:-$1} timeout=${3:-30} pid i
  if pid=$(pid_of "$name" "$comm"); then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < timeout * 10; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "$name (pid $pid) ignored SIGTERM for ${timeout}s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    log "stopped $name (pid $pid)"
  fi
  rm -f "$STATE/run/$name.pid"
}
