#!/usr/bin/env bash
# Stop the local Slurm cluster that slurm/local/start.sh started: cancel its jobs, then stop
# each daemon by the PID file in $RLVLA3_SLURM_STATE/run (never by process name), so nothing
# else on the machine is touched. Idempotent. State (accounting DB, job id counter) is kept.
#   slurm/local/stop.sh            stop
#   slurm/local/stop.sh --purge    stop, drop the accounting DB, delete the state folder and
#                                  the /etc/slurm files and /etc/hosts line start.sh wrote
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/common.sh"

PURGE=0
case "${1:-}" in
  --purge) PURGE=1 ;;
  "") ;;
  *) echo "usage: $0 [--purge]" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }
T0=$(now)

if [ -d "$STATE/run" ]; then
  # Jobs first: their slurmstepd processes outlive slurmd, and would keep running otherwise.
  if pid_of slurmctld >/dev/null; then
    cancel_jobs 30 jobs || true   # up to 30 s for them to finish; the daemons stop either way
  fi
  # Reverse start order: compute nodes, controller, accounting, database, munge.
  stop_pids 30 "${SLURMDS[@]}"
  stop_pids 30 slurmctld
  stop_pids 30 slurmdbd
  if [ $PURGE = 1 ] && pid_of mysqld/mariadbd mariadbd >/dev/null; then
    # Drop the database through the server, never by deleting its files under a live server.
    mariadb --no-defaults --socket="$DB_SOCKET" -e "DROP DATABASE IF EXISTS $DB_NAME" &&
      log "dropped database $DB_NAME"
  fi
  stop_pids 60 mysqld/mariadbd:mariadbd   # InnoDB may need a while to flush
  stop_pids 30 munged              # only if we started it (a pre-existing munged stays)
else
  log "no state in $STATE: nothing to stop"
fi

if [ $PURGE = 1 ]; then
  # Delete only what start.sh made: the state folder carries its stamp, /etc files our marker.
  if [ -f "$STATE/.rlvla3-slurm-state" ]; then rm -rf "$STATE"; log "deleted $STATE"; fi
  for f in slurm.conf gres.conf slurmdbd.conf; do
    if [ -f "$SLURM_ETC/$f" ] && head -n1 "$SLURM_ETC/$f" | grep -qF "$MARKER"; then
      rm -f "$SLURM_ETC/$f"
    fi
  done
  rm -rf /tmp/slurm-tmpfs
  if grep -qF "$MARKER" /etc/hosts; then
    # Rewrite in place: in containers /etc/hosts is often a bind mount that cannot be replaced.
    hosts=$(grep -vF "$MARKER" /etc/hosts)
    printf '%s\n' "$hosts" >/etc/hosts
  fi
fi
log "stopped in $(since "$T0")"
