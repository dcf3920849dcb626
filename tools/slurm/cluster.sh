#!/usr/bin/env bash
# A real SLURM cluster on this one machine: munged, slurmctld, and one slurmd per
# simulated node (node1, node2, ...), from Debian's packages slurm-wlm and munge.
#
#   bash tools/slurm/cluster.sh up      # start (idempotent), wait until every node is idle
#   bash tools/slurm/cluster.sh status  # what runs, and sinfo
#   bash tools/slurm/cluster.sh down    # cancel our jobs, stop our daemons, remove our files
#   bash tools/slurm/cluster.sh env     # print `export SLURM_CONF=...` for sbatch/srun/sinfo
#
# (`make cluster-up` / `make cluster-down` call the first and the third.)
#
# Everything lives in one state directory (config, munge key and socket, pid files, logs,
# spool): $TINYSCALE_SLURM_DIR, default build/slurm. The system's /etc/slurm and
# /etc/munge are not touched: the commands find our config through SLURM_CONF. The one
# system file we change is /etc/hosts, and only when a node name does not resolve yet:
# `up` adds one marked line "127.0.0.1 node1 node2 # tinyscale-slurm <state dir>", and the
# `down` of the same state dir removes it.
# Node names must resolve because a batch script uses the first node's name as
# MASTER_ADDR, as on a real cluster.
#
# Settings (environment): TINYSCALE_SLURM_NODES (2), TINYSCALE_SLURM_PORT (16817: the
# controller's; node k listens on PORT+k), TINYSCALE_SLURM_CPUS (CPUs per node: this
# machine's count), TINYSCALE_SLURM_WAIT_S (60: how long `up` waits for idle nodes).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STATE="${TINYSCALE_SLURM_DIR:-$ROOT/build/slurm}"
NODES="${TINYSCALE_SLURM_NODES:-2}"
CTLD_PORT="${TINYSCALE_SLURM_PORT:-16817}"
CPUS="${TINYSCALE_SLURM_CPUS:-$(nproc)}"
WAIT_S="${TINYSCALE_SLURM_WAIT_S:-60}"
TEMPLATE="$ROOT/tools/slurm/slurm.conf.template"
export SLURM_CONF="$STATE/etc/slurm.conf"
MUNGE_SOCKET="$STATE/munge/munge.socket.2"
HOSTS_MARK="# tinyscale-slurm $STATE"

node_names() {
  local k
  for ((k = 1; k <= NODES; k++)); do echo "node$k"; done
}

die() {
  echo "cluster: $*" >&2
  exit 1
}

# ---- what this machine must have -------------------------------------------------------
check_machine() {
  local missing=() cmd
  [ "$(id -u)" = 0 ] || missing+=("root (the daemons run as root)")
  [ -r /etc/debian_version ] || missing+=("Debian")
  for cmd in munged mungekey slurmctld slurmd sbatch srun sinfo scontrol squeue scancel; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    die "missing ${missing[*]}: on Debian, as root, apt-get install slurm-wlm munge (make setup does)"
  fi
  [[ "$NODES" =~ ^[1-9][0-9]*$ ]] || die "TINYSCALE_SLURM_NODES=$NODES: give a whole number of nodes, 1 or more"
}

# ---- pid files: the daemons we started, and only those ---------------------------------
# A pid counts only if that process is alive and is the daemon we expect (pids get reused).
running_pid() { # pidfile name -> prints the pid if that daemon runs
  local pidfile="$1" name="$2" pid
  [ -s "$pidfile" ] || return 1
  pid="$(tr -dc 0-9 <"$pidfile")"
  [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] || return 1
  [ "$(cat "/proc/$pid/comm")" = "$name" ] || return 1
  echo "$pid"
}

stop_daemons() { # pidfile:name ...: TERM to all at once, wait up to 15 s, then KILL
  local item pid pids=() k alive
  for item in "$@"; do
    pid="$(running_pid "${item%%:*}" "${item##*:}")" && pids+=("$pid")
    rm -f "${item%%:*}"
  done
  [ ${#pids[@]} -eq 0 ] && return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for ((k = 0; k < 150; k++)); do
    alive=0
    for pid in "${pids[@]}"; do [ -d "/proc/$pid" ] && alive=1; done
    [ "$alive" = 0 ] && return 0
    sleep 0.1
  done
  echo "cluster: pids ${pids[*]} ignored SIGTERM for 15 s: killing them" >&2
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

# ---- /etc/hosts: node names must resolve (MASTER_ADDR is a node name) ------------------
ensure_hosts() {
  local unresolved=() node
  while read -r node; do
    getent hosts "$node" >/dev/null || unresolved+=("$node")
  done < <(node_names)
  [ ${#unresolved[@]} -eq 0 ] && return 0
  echo "cluster: adding '127.0.0.1 ${unresolved[*]} $HOSTS_MARK' to /etc/hosts"
  echo "127.0.0.1 ${unresolved[*]} $HOSTS_MARK" >>/etc/hosts
}

ours() { # the lines of /etc/hosts that end with our mark (or, with -v, all the others)
  awk -v mark="$HOSTS_MARK" -v keep="${1:-}" \
    '(substr($0, length($0) - length(mark) + 1) == mark) != (keep == "-v")' /etc/hosts
}

remove_hosts() {
  [ -n "$(ours)" ] || return 0
  local kept
  kept="$(ours -v)"
  # rewrite in place: /etc/hosts is often a bind mount, which a rename (sed -i) would break
  printf '%s\n' "$kept" >/etc/hosts
}

# ---- the configuration, from the template ----------------------------------------------
write_config() {
  local lines="" k host
  host="$(hostname -s)"
  for ((k = 1; k <= NODES; k++)); do
    lines+="NodeName=node$k NodeHostname=$host NodeAddr=127.0.0.1 Port=$((CTLD_PORT + k))"$'\n'
  done
  mkdir -p "$STATE"/{etc,ctld,spool,pid,log}
  # every path under the state dir is cut into the config: no spaces, no sed specials
  [[ "$STATE" =~ ^[A-Za-z0-9_./-]+$ ]] || die "state dir '$STATE' has odd characters: set TINYSCALE_SLURM_DIR to a plain path"
  sed -e "s|@STATE@|$STATE|g" -e "s|@HOST@|$host|g" -e "s|@CTLD_PORT@|$CTLD_PORT|g" \
    -e "s|@CPUS@|$CPUS|g" -e "s|@MEMORY_MB@|1000|g" -e "s|@NODES@|$NODES|g" \
    -e "/@NODE_LINES@/{r /dev/stdin" -e "d}" "$TEMPLATE" \
    <<<"${lines%$'\n'}" >"$SLURM_CONF.tmp"
  mv "$SLURM_CONF.tmp" "$SLURM_CONF"
}

# ---- munge: our own key and socket -----------------------------------------------------
start_munge() {
  running_pid "$STATE/pid/munged.pid" munged >/dev/null && return 0
  mkdir -p "$STATE/munge"
  chmod 755 "$STATE/munge" # the socket is for every user; the key stays 0600
  [ -s "$STATE/munge/munge.key" ] || mungekey --create --keyfile="$STATE/munge/munge.key" 2>/dev/null
  chmod 600 "$STATE/munge/munge.key"
  munged --force --key-file="$STATE/munge/munge.key" --socket="$MUNGE_SOCKET" \
    --pid-file="$STATE/pid/munged.pid" --log-file="$STATE/log/munged.log" \
    --seed-file="$STATE/munge/munged.seed" </dev/null >>"$STATE/log/munged.log" 2>&1 \
    || die "munged did not start: see $STATE/log/munged.log, then run \`$0 down\`"
}

# ---- up / down / status ----------------------------------------------------------------
all_idle() { # every node of ours is idle
  local states
  states="$(sinfo --noheader --Node --format='%N %t' 2>/dev/null)" || return 1
  [ "$(grep -c ' idle$' <<<"$states")" -eq "$NODES" ]
}

# A new controller numbers its jobs from 1 again, and the course's batch files name their
# outputs by job id: job 3 of this cluster would find the checkpoints of an earlier
# cluster's job 3 in runs/slurm-3 and resume from them. On a real cluster ids never repeat.
forget_old_jobs() {
  local old=("$ROOT"/runs/slurm-[0-9]* "$ROOT"/logs/slurm-[0-9]*.out)
  ((${#old[@]})) || return 0
  rm -rf "${old[@]}"
  echo "cluster: job ids start at 1 again: removed ${#old[@]} outputs of an earlier cluster's jobs (runs/slurm-<id>, logs/slurm-<id>.out)"
}

up() {
  check_machine
  local t0=$SECONDS node
  shopt -s nullglob
  if ! running_pid "$STATE/pid/slurmctld.pid" slurmctld >/dev/null; then
    write_config  # only while the controller is down: a running cluster keeps its config
    forget_old_jobs
  fi
  [ -s "$SLURM_CONF" ] || die "no $SLURM_CONF: run \`$0 down\`, then \`$0 up\` again"
  ensure_hosts
  mkdir -p "$ROOT/logs" # the course's batch files write logs/slurm-<job id>.out
  start_munge
  if ! running_pid "$STATE/pid/slurmctld.pid" slurmctld >/dev/null; then
    slurmctld -i </dev/null >>"$STATE/log/slurmctld.log" 2>&1 \
      || die "slurmctld did not start: see $STATE/log/slurmctld.log, then run \`$0 down\`"
  fi
  while read -r node; do
    running_pid "$STATE/pid/slurmd-$node.pid" slurmd >/dev/null && continue
    slurmd -N "$node" </dev/null >>"$STATE/log/slurmd-$node.log" 2>&1 \
      || die "slurmd for $node did not start: see $STATE/log/slurmd-$node.log, then run \`$0 down\`"
  done < <(node_names)
  until all_idle; do
    local name pidfile
    for pidfile in "$STATE/pid/slurmctld.pid" "$STATE"/pid/slurmd-*.pid; do
      name="$(basename "$pidfile" .pid)"
      if ((SECONDS - t0 >= 3)) && ! running_pid "$pidfile" "${name%%-*}" >/dev/null; then
        die "$name stopped: $(tail -n 1 "$STATE/log/$name.log"); then run \`$0 down\`"
      fi
    done
    if ((SECONDS - t0 >= WAIT_S)); then
      sinfo --Node >&2 || true
      die "nodes not idle after ${WAIT_S} s: see the logs in $STATE/log, then run \`$0 down\`"
    fi
    sleep 0.5
  done
  echo "cluster: $NODES nodes idle after $((SECONDS - t0)) s; for sbatch/srun/sinfo run: export SLURM_CONF=$SLURM_CONF"
}

down() {
  local pidfile jobs k
  if running_pid "$STATE/pid/slurmctld.pid" slurmctld >/dev/null; then
    jobs="$(squeue --noheader --format=%i 2>/dev/null || true)"
    if [ -n "$jobs" ]; then # our cluster's jobs only: this SLURM_CONF's controller
      # shellcheck disable=SC2086 # one job id per word
      scancel $jobs || true
      for ((k = 0; k < 50; k++)); do # up to 10 s for their processes to end
        [ -z "$(squeue --noheader --format=%i 2>/dev/null)" ] && break
        sleep 0.2
      done
    fi
  fi
  shopt -s nullglob
  local daemons=("$STATE/pid/slurmctld.pid:slurmctld")
  for pidfile in "$STATE"/pid/slurmd-*.pid; do daemons+=("$pidfile:slurmd"); done
  stop_daemons "${daemons[@]}"
  stop_daemons "$STATE/pid/munged.pid:munged" # last: the others authenticate through it
  remove_hosts
  # only what `up` made, so a mistyped TINYSCALE_SLURM_DIR never costs more than that
  rm -rf "${STATE:?}"/{etc,ctld,spool,pid,log,munge}
  rmdir "$STATE" 2>/dev/null || true
  echo "cluster: stopped, $STATE removed"
}

status() {
  local pidfile name pid
  shopt -s nullglob
  for pidfile in "$STATE"/pid/*.pid; do
    name="$(basename "$pidfile" .pid)"
    if pid="$(running_pid "$pidfile" "${name%%-*}")"; then echo "$name: running, pid $pid"
    else echo "$name: not running (stale $pidfile)"; fi
  done
  [ -s "$SLURM_CONF" ] && sinfo --Node 2>/dev/null || echo "cluster: not up ($SLURM_CONF missing or controller down)"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  env) echo "export SLURM_CONF=$SLURM_CONF" ;;
  *) die "usage: $0 up|down|status|env" ;;
esac
