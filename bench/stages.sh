# Shared by bench/gpu.sh and bench/gpu_vla.sh (sourced): logging and time-limited stages.
# Needs LOG (the log file) and TAG (the log prefix) set by the caller.
say() { echo "[$TAG $(date +%T)] $*" | tee -a "$LOG"; }
stage() {  # stage NAME SECONDS CMD...: run with a time limit, log, never abort the script
  local name=$1 limit=$2; shift 2
  say "stage $name: $*"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  say "stage $name: exit $rc after $((SECONDS - t0)) s"
  return $rc
}
