#!/usr/bin/env bash
# Start a real Slurm cluster on this one machine (root, Debian 12, no systemd needed):
# munged, MariaDB + slurmdbd (accounting), slurmctld, and one slurmd per virtual node
# (cpu1 cpu2 in partition cpu, gpu1 gpu2 with 4 fake GPUs each in partition gpu).
#
# Idempotent: daemons already running from our PID files are left alone; a second run only
# checks health. Smoke jobs run when something was started, or always with --smoke.
#   slurm/local/start.sh [--smoke | --no-smoke]
# State (PID files, logs, spool, database) lives in $RLVLA3_SLURM_STATE (/var/lib/rlvla3-slurm);
# configs go to /etc/slurm, where the Slurm commands look. Stop with slurm/local/stop.sh.
set -Eeuo pipefail   # -E: the ERR trap below also fires inside functions
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/common.sh"

SMOKE=auto
case "${1:-}" in
  --smoke) SMOKE=yes ;;
  --no-smoke) SMOKE=no ;;
  "") ;;
  *) echo "usage: $0 [--smoke | --no-smoke]" >&2; exit 2 ;;
esac
TIMEOUT=${RLVLA3_SLURM_TIMEOUT:-60}   # seconds for each wait below
PYTHON=${RLVLA3_SLURM_PYTHON:-python3}
T0=$(now)
STARTED=()   # daemons this run started

tail_logs() {
  local f
  for f in "$@"; do
    [ -s "$f" ] || continue
    echo "----- last lines of $f"
    tail -n 20 "$f"
  done
}
# die MESSAGE [LOG...]: explain, show the daemon logs that matter (all of ours by default).
die() {
  local msg=$1; shift
  trap - ERR
  echo "[slurm-local] ERROR: $msg" >&2
  if [ $# -eq 0 ]; then set -- "$STATE"/log/*.{log,out} /var/log/munge/munged.log; fi
  tail_logs "$@" >&2
  exit 1
}
trap 'die "command failed (line $LINENO): $BASH_COMMAND"' ERR

# wait_for SECONDS CMD...: retry CMD (quietly) until it succeeds; non-zero on timeout.
# WATCH=<pid> wait_for ...: also give up at once if that process has died.
wait_for() {
  local end=$(($(date +%s) + $1)); shift
  until "$@" >/dev/null 2>&1; do
    if [ -n "${WATCH:-}" ] && ! alive "$WATCH"; then return 1; fi
    [ "$(date +%s)" -lt "$end" ] || return 1
    sleep 0.2
  done
}
# spawn NAME CMD...: run a daemon in the foreground (-D) of its own session, in the background
# of this script, so its PID is known at once and a crash ends the wait for it early. Its
# stderr (errors from before it opens its log file, then a copy of that log) goes to
# log/NAME.out, emptied at each start. Sets SPAWNED to its PID.
spawn() {
  local name=$1; shift
  setsid "$@" </dev/null >"$STATE/log/$name.out" 2>&1 &
  SPAWNED=$!
}

[ "$(id -u)" = 0 ] || die "run as root (it installs packages and starts system daemons)" /dev/null

# --- 1. Packages (dpkg first, so a second run does not touch apt) -------------------------
PKGS=(slurmctld slurmd slurm-client munge openmpi-bin libopenmpi-dev libpmix2 libpmix-dev
      slurmdbd mariadb-server)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  t=$(now)
  log "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -qq "${missing[@]}" >/dev/null
  log "packages installed in $(since "$t")"
fi

# --- 2. Configs: only ever replace files that carry our marker -------------------------------
if [ -f "$SLURM_ETC/slurm.conf" ] && head -n1 "$SLURM_ETC/slurm.conf" | grep -qF "$MARKER"; then
  other=$(head -n1 "$SLURM_ETC/slurm.conf" | sed -n 's/.*(state: \(.*\))$/\1/p')
  if [ -n "$other" ] && [ "$other" != "$STATE" ] && [ -s "$other/run/slurmctld.pid" ] &&
     alive "$(tr -dc 0-9 <"$other/run/slurmctld.pid")"; then
    die "a local cluster with state $other is running; stop it first: RLVLA3_SLURM_STATE=$other $HERE/stop.sh" /dev/null
  fi
fi
for f in slurm.conf gres.conf slurmdbd.conf; do
  if [ -e "$SLURM_ETC/$f" ] && ! head -n1 "$SLURM_ETC/$f" | grep -qF "$MARKER"; then
    die "$SLURM_ETC/$f exists and was not written by this script (no '$MARKER' header).
  Refusing to overwrite a real Slurm configuration; move it away to use the local cluster." /dev/null
  fi
done

install -d -m 0755 "$STATE" "$STATE"/{etc,run,log,spool,dev} "$SLURM_ETC"
touch "$STATE/.rlvla3-slurm-state"   # lets stop.sh --purge check what it deletes
install -d -m 0700 "$STATE/spool/ctld"
for n in "${NODES[@]}"; do install -d -m 0755 "$STATE/spool/$n"; install -d -m 1777 "/tmp/slurm-tmpfs/$n"; done
for i in 0 1 2 3; do ln -sfn /dev/null "$STATE/dev/nvidia$i"; done   # the fake GPUs

# Each slurmd runs in its own UTS namespace named after its node: OpenMPI's shared-memory
# transport otherwise treats the virtual nodes as one host and crashes. Without unshare,
# fall back to TCP-only OpenMPI.
if unshare --uts true 2>/dev/null; then UTS=1; else UTS=0; fi

render() {   # render TEMPLATE: fill the @PLACEHOLDERS@ of slurm/local/TEMPLATE.in
  local args=(-e "s|@MARKER@|$MARKER|" -e "s|@STATE@|$STATE|g" -e "s|@CTLD_PORT@|$CTLD_PORT|g"
              -e "s|@DBD_PORT@|$DBD_PORT|g" -e "s|@DB_NAME@|$DB_NAME|g") i
  for i in "${!NODES[@]}"; do args+=(-e "s|@PORT_${NODES[$i]}@|$((SLURMD_PORT_BASE + i))|g"); done
  sed "${args[@]}" "$HERE/$1.in"
}
CHANGED=()
put() {   # put NAME MODE: install $STATE/etc/NAME as /etc/slurm/NAME if its content changed
  if ! cmp -s "$STATE/etc/$1" "$SLURM_ETC/$1"; then
    install -m "$2" "$STATE/etc/$1" "$SLURM_ETC/$1"
    CHANGED+=("$1")
  fi
}
render slurm.conf >"$STATE/etc/slurm.conf"
render gres.conf >"$STATE/etc/gres.conf"
render slurmdbd.conf >"$STATE/etc/slurmdbd.conf"
put slurm.conf 0644
put gres.conf 0644
put slurmdbd.conf 0600   # slurmdbd refuses a config others can read (it may hold a DB password)
{
  cat "$HERE/task_prolog.sh"
  [ "$UTS" = 1 ] || echo 'echo "export OMPI_MCA_btl=self,tcp"   # no UTS namespaces: no shared memory'
} >"$STATE/etc/task_prolog.sh.new"
chmod 0755 "$STATE/etc/task_prolog.sh.new"
mv -f "$STATE/etc/task_prolog.sh.new" "$STATE/etc/task_prolog.sh"
if [ ${#CHANGED[@]} -gt 0 ]; then log "wrote ${CHANGED[*]} in $SLURM_ETC"; fi

# The node names must resolve (PMIx and srun look them up); point them at loopback.
for n in "${NODES[@]}"; do
  if ! getent hosts "$n" >/dev/null; then
    echo "127.0.0.1 ${NODES[*]}  $MARKER" >>/etc/hosts
    break
  fi
done

# A changed config needs the daemons that read it restarted.
restart_slurm=0; restart_dbd=0
for f in "${CHANGED[@]}"; do
  case $f in slurm.conf | gres.conf) restart_slurm=1 ;; slurmdbd.conf) restart_dbd=1 ;; esac
done
if [ $restart_slurm = 1 ] && pid_of slurmctld >/dev/null; then
  log "config changed: restarting slurmctld and slurmd"
  stop_pids 30 "${SLURMDS[@]}" slurmctld
fi
if [ $restart_dbd = 1 ] && pid_of slurmdbd >/dev/null; then
  log "config changed: restarting slurmdbd"
  stop_pids 30 slurmdbd
fi

# --- 3. munge: Slurm's authentication ----------------------------------------------------
munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
if ! pid_of munged >/dev/null; then
  if munge_ok; then
    log "munged is already running and was not started by us: using it"
  else
    t=$(now)
    [ -s /etc/munge/munge.key ] || runuser -u munge -- mungekey --create
    install -d -o munge -g munge -m 0755 /run/munge
    runuser -u munge -- munged
    wait_for "$TIMEOUT" munge_ok || die "munged did not come up" /var/log/munge/munged.log
    # munged (running as user munge) writes its PID to /run/munge; keep a copy with ours.
    cp /run/munge/munged.pid "$STATE/run/munged.pid"
    STARTED+=(munged); log "munged up in $(since "$t")"
  fi
fi

# --- 4. MariaDB (socket only) + slurmdbd: job accounting -----------------------------------
DB_LOG=$STATE/log/mariadb.log
db_ok() { mariadb-admin --no-defaults --socket="$DB_SOCKET" ping; }
if ! pid_of mysqld/mariadbd mariadbd >/dev/null; then
  t=$(now)
  install -d -o mysql -g mysql -m 0755 "$STATE/run/mysqld"
  touch "$DB_LOG" && chown mysql:mysql "$DB_LOG"   # mariadbd runs as mysql and appends here
  if [ ! -d "$STATE/mysql/mysql" ]; then
    install -d -o mysql -g mysql -m 0750 "$STATE/mysql"
    mariadb-install-db --no-defaults --user=mysql --datadir="$STATE/mysql" \
      --auth-root-authentication-method=socket --skip-test-db >>"$STATE/log/mariadb-install.log" 2>&1 ||
      die "mariadb-install-db failed" "$STATE/log/mariadb-install.log"
  fi
  # --no-defaults: ignore /etc/mysql (a site's own MariaDB setup); --skip-networking: no TCP.
  # Slurm asks for a long lock wait timeout.
  spawn mariadb mariadbd --no-defaults --user=mysql --datadir="$STATE/mysql" --socket="$DB_SOCKET" \
    --pid-file="$STATE/run/mysqld/mariadbd.pid" --log-error="$DB_LOG" --skip-networking \
    --innodb-lock-wait-timeout=900
  WATCH=$SPAWNED wait_for "$TIMEOUT" db_ok || die "MariaDB did not come up" "$DB_LOG" "$STATE/log/mariadb.out"
  STARTED+=(mariadb); log "MariaDB up in $(since "$t")"
fi

dbd_ok() { timeout 10 sacctmgr -n -P show cluster format=cluster; }
if ! pid_of slurmdbd >/dev/null; then
  t=$(now)
  # libmariadb reads the socket path from MYSQL_UNIX_PORT (slurmdbd.conf has no such option).
  MYSQL_UNIX_PORT=$DB_SOCKET spawn slurmdbd slurmdbd -D
  WATCH=$SPAWNED wait_for "$TIMEOUT" dbd_ok ||
    die "slurmdbd did not answer sacctmgr" "$STATE"/log/slurmdbd.{log,out} "$DB_LOG"
  STARTED+=(slurmdbd); log "slurmdbd up in $(since "$t")"
fi
# Register the cluster, an account and root in it (idempotent), so jobs are accounted.
if ! dbd_ok | grep -qx "$CLUSTER"; then
  sacctmgr -i add cluster "$CLUSTER" >/dev/null
fi
if ! sacctmgr -n -P show account format=account | grep -qx rlvla3; then
  sacctmgr -i add account rlvla3 Cluster="$CLUSTER" Description="rlvla3 local tests" Organization=rlvla3 >/dev/null
fi
if ! sacctmgr -n -P show assoc where user=root account=rlvla3 format=user | grep -qx root; then
  sacctmgr -i add user root Account=rlvla3 >/dev/null
fi

# --- 5. slurmctld and one slurmd per virtual node -----------------------------------------
ctld_ok() { timeout 10 scontrol ping | grep -q "is UP"; }
if ! pid_of slurmctld >/dev/null; then
  t=$(now)
  spawn slurmctld slurmctld -D
  WATCH=$SPAWNED wait_for "$TIMEOUT" ctld_ok || die "slurmctld did not come up" "$STATE"/log/slurmctld.{log,out}
  STARTED+=(slurmctld); log "slurmctld up in $(since "$t")"
fi
for n in "${NODES[@]}"; do
  pid_of "slurmd-$n" slurmd >/dev/null && continue
  if [ "$UTS" = 1 ]; then
    spawn "slurmd-$n" unshare --uts sh -c "hostname $n && exec slurmd -D -N $n"
  else
    spawn "slurmd-$n" slurmd -D -N "$n"
  fi
  STARTED+=("slurmd-$n")
done

# --- 6. Healthy = all 4 nodes up and usable, and the cluster known to accounting ----------
nodes_ok() {   # every node listed, responding (no '*') and idle, mixed, allocated or completing
  local out
  out=$(timeout 10 sinfo -h -N -o '%N %t') || return 1
  for n in "${NODES[@]}"; do grep -qE "^$n (idle|mix|alloc|comp)$" <<<"$out" || return 1; done
}
t=$(now)
wait_for "$TIMEOUT" nodes_ok || {
  sinfo -N -l >&2 || true
  sinfo -R >&2 || true
  die "nodes not all up after ${TIMEOUT}s" "$STATE/log/slurmctld.log" "$STATE"/log/slurmd-*
}
dbd_ok | grep -qx "$CLUSTER" || die "sacctmgr does not list cluster $CLUSTER" "$STATE/log/slurmdbd.log"
if [ ${#STARTED[@]} -gt 0 ]; then log "started: ${STARTED[*]}"; fi
# A controller restarted from its state folder recovers the jobs it last saved as running. With
# no slurmstepd alive on this machine nothing runs them (the machine restarted, or a CI image
# kept the folder): they would hold their nodes forever and every later job would pend behind them.
# Pending jobs are kept (and not waited for): they have not started, so nothing was lost.
if [[ " ${STARTED[*]} " == *" slurmctld "* ]] && ! pgrep -x slurmstepd >/dev/null; then
  cancel_jobs "$TIMEOUT" "jobs left by the previous controller (no slurmstepd runs them)" -t R,CG,S ||
    die "jobs left by the previous controller still running after ${TIMEOUT}s: $(queued_jobs -t R,CG,S)" \
      "$STATE/log/slurmctld.log"
fi
log "cluster $CLUSTER healthy (nodes up in $(since "$t")); total $(since "$T0")"
sinfo

# --- 7. Smoke jobs: a plain step, an MPI het job across both partitions, sbatch + sacct -----
if [ "$SMOKE" = no ] || { [ "$SMOKE" = auto ] && [ ${#STARTED[@]} -eq 0 ]; }; then exit 0; fi
trap - ERR
smoke_fail() { die "smoke check failed: $1" "$STATE/log/slurmctld.log" "$STATE"/log/slurmd-*; }
J=$((TIMEOUT + 30))

t=$(now)
out=$(timeout "$J" srun -Q -p cpu -N1 -n1 hostname 2>&1) || smoke_fail "srun hostname: $out"
log "srun -p cpu hostname -> $out ($(since "$t"))"

# srun of a het step under mpi/pmix can wait forever after every task has exited: Slurm 22.05's
# pmix plugin races between the components' threads in srun (its stack: pmixp_abort_agent_stop
# under slurm_step_launch_wait_finish; upstream fixed "races with het jobs" in 24.11). It hung 4
# of 21 such steps here, and once a whole CI run (plain `timeout` sent a SIGTERM srun ignored).
# So each rank writes its line to a file (the hung component's stdout can be lost); srun gets
# 10 s after the last file, or $J s in all, then it is killed and its job cancelled.
t=$(now)
het_dir=$(mktemp -d)
code='from mpi4py import MPI; import os, sys; c = MPI.COMM_WORLD
gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
line = " ".join(map(str, (c.Get_rank(), c.Get_size(), gpus, MPI.Get_processor_name())))
open(sys.argv[1] + "/rank%d" % c.Get_rank(), "w").write(line + "\n")'
srun -Q -J rlvla3-smoke-het --mpi=pmix -p cpu -n2 : -p gpu -n2 --gpus-per-task=1 \
  "$PYTHON" -c "$code" "$het_dir" >"$het_dir/srun.out" 2>&1 &
het_pid=$!
het_end=$(($(date +%s) + J)); all_ranks=""; het_note=""
while alive "$het_pid"; do
  if [ -z "$all_ranks" ] && [ "$(find "$het_dir" -name 'rank*' -size +0 | wc -l)" = 4 ]; then
    all_ranks=$(date +%s)
  fi
  if [ -n "$all_ranks" ] && [ $(($(date +%s) - all_ranks)) -gt 10 ]; then
    het_note="srun still waiting 10 s after all 4 ranks finished (the pmix het-step hang): ended it"
  elif [ "$(date +%s)" -gt "$het_end" ]; then
    het_note="srun not done after ${J}s: ended it"
  fi
  if [ -n "$het_note" ]; then
    kill -KILL "$het_pid" 2>/dev/null || true
    scancel -n rlvla3-smoke-het || true
    log "$het_note"
    break
  fi
  sleep 0.2
done
het_rc=0; wait "$het_pid" || het_rc=$?
out=$(cat "$het_dir"/rank* 2>/dev/null || true)
echo "$out" | sed 's/^/    /'
if [ "$(awk '$2 == 4' <<<"$out" | wc -l)" != 4 ]; then
  smoke_fail "MPI het job (srun exit $het_rc) did not report a world of size 4 from every rank: $(cat "$het_dir/srun.out")"
fi
rm -rf "$het_dir"
log "MPI het job (2 cpu + 2 gpu ranks, one world of 4) ok ($(since "$t"))"

t=$(now)
jid=$(sbatch --parsable -p cpu -J rlvla3-smoke -o /dev/null --wrap "hostname") || smoke_fail "sbatch"
acct_done() { [ "$(sacct -n -X -P -j "$jid" -o State)" = COMPLETED ]; }
wait_for "$J" acct_done ||
  smoke_fail "sbatch job $jid not COMPLETED in sacct: $(sacct -j "$jid" 2>&1)"
log "sbatch --wrap job $jid COMPLETED in sacct ($(since "$t"))"
log "all smoke checks passed; total $(since "$T0")"
