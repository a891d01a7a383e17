#!/usr/bin/env bash
# kafka.sh - a managed single-node Apache Kafka 4.x broker (KRaft, loopback only) for
# sluice's end-to-end tests, CI and the newcomer demo.
#
# The broker is the plain Apache Kafka jars from Maven Central (scripts/kafka/pom.xml), run
# with `java -cp 'lib/*' kafka.Kafka server.properties` as one combined broker+controller
# node (node.id=1) on 127.0.0.1, set up for transactions and exactly-once on one node
# (every internal topic at replication factor 1, min ISR 1).
# Needs: bash, java 17+, mvn (only for `fetch`), coreutils, util-linux (setsid, flock).
#
# Usage: scripts/kafka.sh COMMAND [OPTIONS]
#
#   fetch [--force]   Download the broker and tool jars with Maven into $SLUICE_KAFKA_HOME/lib
#                     (Maven's own cache ~/.m2 is used too). A no-op once done: lib/.fetched
#                     records the Kafka version and a hash of pom.xml, and a changed pom.xml
#                     fetches again.
#   start             Fetch if needed; write server.properties and log4j2.properties into the
#                     run dir; format the data dir the first time only (a restart keeps all
#                     topics, offsets and transactions); start the broker in the background
#                     (own session, pid file, stdout/stderr to kafka.out, broker log to
#                     logs/server.log); then wait until it serves: the log says "Kafka Server
#                     started" AND 127.0.0.1:PORT accepts TCP connections. On timeout
#                     ($SLUICE_KAFKA_START_TIMEOUT, 90 s) or if the JVM dies, print the last
#                     50 log lines, stop what was started and exit 1. If this script's broker
#                     already runs on that run dir, say so and exit 0.
#                     Extra broker settings: --set KEY=VALUE (repeatable; wins over defaults).
#   stop              SIGTERM the broker of the run dir, wait up to 30 s, then SIGKILL.
#                     Removes only the pid file; exits 0 if nothing was running.
#   status            Print "running on 127.0.0.1:PORT" and exit 0 if the broker of the run
#                     dir is up and accepts connections; otherwise exit 1.
#   reset             stop, then delete the run dir (all data and logs).
#   logs [-n N] [-f]  Show the last N (100) lines of the broker log; -f follows it.
#   run-class CLASS [ARGS...]
#                     Run a Kafka main class from the same jars, e.g.
#                       scripts/kafka.sh run-class org.apache.kafka.tools.TopicCommand \
#                         --bootstrap-server 127.0.0.1:9092 --create --topic in --partitions 4
#                     (logs at WARN to stderr).
#   help              This text.
#
# Options of start/stop/status/reset/logs:
#   --port P             PLAINTEXT (client) port, default $SLUICE_KAFKA_PORT or 9092.
#   --controller-port C  KRaft controller port, default $SLUICE_KAFKA_CONTROLLER_PORT or P+1.
#   --dir DIR            Run dir, default $SLUICE_KAFKA_HOME/run-P. Without --port (and
#                        without $SLUICE_KAFKA_PORT) the port recorded in DIR is used.
#
# Environment:
#   SLUICE_KAFKA_HOME           jars and default run dirs (default: <repo>/.kafka)
#   SLUICE_KAFKA_PORT           default client port (9092)
#   SLUICE_KAFKA_CONTROLLER_PORT default controller port (client port + 1)
#   SLUICE_KAFKA_HEAP           broker max heap (512m)
#   SLUICE_KAFKA_JAVA_OPTS      extra JVM options for the broker
#   SLUICE_KAFKA_START_TIMEOUT  seconds start waits for the broker to serve (90)
#   JAVA_HOME / JAVA            the java to use (JAVA wins), MVN the mvn to use
#
# Run dir layout: server.properties, log4j2.properties, data/ (log.dirs, formatted once,
# holds meta.properties), logs/server.log (rolled at 50 MB), kafka.out (JVM stdout/stderr),
# kafka.pid, cluster.id, .sluice-kafka (marks the dir as ours, so reset may delete it).
#
# Main classes (Kafka 4.4.0): kafka.Kafka (broker), kafka.tools.StorageTool format (run once
# per data dir, with a static quorum: controller.quorum.voters=1@127.0.0.1:C), and the tools
# in org.apache.kafka.tools.* for run-class.
#
# Notes for tests: a broker uses TWO ports (P and the controller port, P+1 by default), so
# space parallel brokers' ports by 2 or more. Create topics explicitly (Admin API or
# TopicCommand) rather than rely on auto-creation, which makes the first transactional
# sends retry. The first transactional producer or consumer group on a fresh dir creates
# __transaction_state / __consumer_offsets (10 partitions each), which takes a second or two.
#
# Messages go to stderr, prefixed with "kafka.sh:"; on stdout are only the line of `status`,
# the log of `logs` and whatever a `run-class` tool prints.

set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(dirname "$SCRIPT_DIR")
POM="$SCRIPT_DIR/kafka/pom.xml"
KAFKA_HOME_DIR="${SLUICE_KAFKA_HOME:-$REPO_ROOT/.kafka}"
LIB_DIR="$KAFKA_HOME_DIR/lib"
HOST=127.0.0.1
READY_LINE='Kafka Server started'
STOP_TIMEOUT=30
RUN_MARKER=.sluice-kafka

log() { printf 'kafka.sh: %s\n' "$*" >&2; }
die() {
  log "$*"
  exit 1
}

usage() {
  sed -n '2,/^$/{s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" | sed '$d'
}

# ---------------------------------------------------------------------------------------
# Helpers

java_bin() {
  if [[ -n ${JAVA:-} ]]; then
    printf '%s\n' "$JAVA"
  elif [[ -n ${JAVA_HOME:-} && -x $JAVA_HOME/bin/java ]]; then
    printf '%s\n' "$JAVA_HOME/bin/java"
  else
    printf 'java\n'
  fi
}

check_java() {
  local java version major
  java=$(java_bin)
  command -v "$java" >/dev/null 2>&1 || die "java not found (need Java 17+; set JAVA_HOME or JAVA)"
  version=$("$java" -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n 1)
  major=${version%%.*}
  if [[ ! $major =~ ^[0-9]+$ ]] || ((major < 17)); then
    die "Kafka 4 needs Java 17+, but $java is version '${version:-unknown}'"
  fi
}

kafka_version() {
  sed -n 's:.*<kafka\.version>\(.*\)</kafka\.version>.*:\1:p' "$POM" | head -n 1
}

fetch_stamp() {
  local sum
  sum=$(sha256sum "$POM")
  printf 'kafka %s pom-sha256 %s\n' "$(kafka_version)" "${sum%% *}"
}

is_fetched() {
  [[ -f $LIB_DIR/.fetched && -f $LIB_DIR/kafka_2.13-$(kafka_version).jar ]] &&
    [[ $(<"$LIB_DIR/.fetched") == "$(fetch_stamp)" ]]
}

# Accepts a TCP connection on 127.0.0.1:$1?
port_open() {
  # shellcheck disable=SC2016 # $0/$1 expand in the inner bash
  timeout 2 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$HOST" "$1" 2>/dev/null
}

valid_port() {
  [[ $1 =~ ^[0-9]+$ ]] && (($1 >= 1 && $1 <= 65535))
}

# ---------------------------------------------------------------------------------------
# Options

PORT=
CONTROLLER_PORT=
RUN_DIR=
SETS=()
LOG_LINES=100
FOLLOW=false
FORCE=false

parse_opts() {
  local cmd=$1 port_opt='' dir_opt='' cport_opt=''
  shift
  while (($#)); do
    case $1 in
    --port | --controller-port | --dir | --set | -n)
      (($# >= 2)) || die "$1 needs a value"
      case $1 in
      --port) port_opt=$2 ;;
      --controller-port) cport_opt=$2 ;;
      --dir) dir_opt=$2 ;;
      --set) SETS+=("$2") ;;
      -n) LOG_LINES=$2 ;;
      esac
      shift 2
      ;;
    --port=*) port_opt=${1#*=} && shift ;;
    --controller-port=*) cport_opt=${1#*=} && shift ;;
    --dir=*) dir_opt=${1#*=} && shift ;;
    --set=*) SETS+=("${1#*=}") && shift ;;
    -f | --follow) FOLLOW=true && shift ;;
    --force) FORCE=true && shift ;;
    -h | --help) usage && exit 0 ;;
    *) die "unknown option for $cmd: $1 (see: scripts/kafka.sh help)" ;;
    esac
  done

  if [[ -z $port_opt && -z ${SLUICE_KAFKA_PORT:-} && -n $dir_opt && -f $dir_opt/server.properties ]]; then
    port_opt=$(sed -n "s|^advertised\.listeners=PLAINTEXT://$HOST:\([0-9]*\)$|\1|p" "$dir_opt/server.properties")
  fi
  PORT=${port_opt:-${SLUICE_KAFKA_PORT:-9092}}
  valid_port "$PORT" || die "invalid port: $PORT"
  CONTROLLER_PORT=${cport_opt:-${SLUICE_KAFKA_CONTROLLER_PORT:-$((PORT + 1))}}
  valid_port "$CONTROLLER_PORT" || die "invalid controller port: $CONTROLLER_PORT"
  [[ $CONTROLLER_PORT != "$PORT" ]] || die "client and controller port are both $PORT"
  [[ $LOG_LINES =~ ^[0-9]+$ ]] || die "-n needs a number, got: $LOG_LINES"

  RUN_DIR=${dir_opt:-$KAFKA_HOME_DIR/run-$PORT}
  if [[ -d $RUN_DIR ]]; then
    RUN_DIR=$(cd "$RUN_DIR" && pwd -P)
  elif [[ $RUN_DIR != /* ]]; then
    RUN_DIR=$PWD/$RUN_DIR
  fi
  PID_FILE=$RUN_DIR/kafka.pid
  DATA_DIR=$RUN_DIR/data
  LOGS_DIR=$RUN_DIR/logs
  SERVER_LOG=$LOGS_DIR/server.log
  OUT_FILE=$RUN_DIR/kafka.out
  PROPS=$RUN_DIR/server.properties
}

# ---------------------------------------------------------------------------------------
# Process bookkeeping

# Is $1 a live kafka.Kafka started with this run dir's server.properties?
is_our_broker() {
  local pid=$1 cmdline
  [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/cmdline ]] || return 1
  cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
  [[ $cmdline == *" kafka.Kafka $PROPS"* ]]
}

# Prints the pid of this run dir's broker, or fails.
running_pid() {
  local pid
  [[ -f $PID_FILE ]] || return 1
  pid=$(<"$PID_FILE")
  is_our_broker "$pid" || return 1
  printf '%s\n' "$pid"
}

lock_run_dir() {
  mkdir -p "$RUN_DIR"
  exec 8>"$RUN_DIR/.lock"
  flock 8
}

show_log_tail() {
  local n=${1:-50}
  if [[ -s $SERVER_LOG ]]; then
    log "last $n lines of $SERVER_LOG:"
    tail -n "$n" "$SERVER_LOG" >&2
  fi
  if [[ -s $OUT_FILE ]]; then
    log "last $n lines of $OUT_FILE:"
    tail -n "$n" "$OUT_FILE" >&2
  fi
}

# ---------------------------------------------------------------------------------------
# Commands

cmd_fetch() {
  local quiet=${1:-false} version tmp start
  [[ -f $POM ]] || die "missing $POM"
  version=$(kafka_version)
  [[ -n $version ]] || die "no <kafka.version> in $POM"
  if ! $FORCE && is_fetched; then
    $quiet || log "Kafka $version jars already in $LIB_DIR"
    return 0
  fi
  mkdir -p "$KAFKA_HOME_DIR"
  exec 9>"$KAFKA_HOME_DIR/.fetch.lock"
  flock 9
  if ! $FORCE && is_fetched; then # another fetch finished while we waited
    exec 9>&-
    return 0
  fi
  local mvn=${MVN:-mvn}
  command -v "$mvn" >/dev/null 2>&1 || die "mvn not found (apt-get install maven), needed once to fetch the Kafka jars"
  log "fetching Kafka $version jars with Maven into $LIB_DIR ..."
  start=$SECONDS
  tmp=$(mktemp -d "$KAFKA_HOME_DIR/lib.tmp.XXXXXX")
  # -q prints nothing but errors (and stray ANSI resets): show the output only on failure.
  if ! "$mvn" -B -q -Dstyle.color=never -f "$POM" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$tmp" >"$tmp.mvn.log" 2>&1; then
    cat "$tmp.mvn.log" >&2
    rm -rf "$tmp" "$tmp.mvn.log"
    die "mvn failed to fetch the Kafka jars (pom: $POM)"
  fi
  rm -f "$tmp.mvn.log"
  [[ -f $tmp/kafka_2.13-$version.jar ]] || {
    rm -rf "$tmp"
    die "mvn did not produce kafka_2.13-$version.jar"
  }
  fetch_stamp >"$tmp/.fetched"
  rm -rf "$LIB_DIR.old"
  [[ ! -d $LIB_DIR ]] || mv "$LIB_DIR" "$LIB_DIR.old"
  mv "$tmp" "$LIB_DIR"
  rm -rf "$LIB_DIR.old"
  exec 9>&-
  log "fetched Kafka $version in $((SECONDS - start)) s: $(find "$LIB_DIR" -name '*.jar' | wc -l) jars, $(du -sh "$LIB_DIR" | cut -f1)"
}

write_server_properties() {
  local kv
  {
    printf '# Written by scripts/kafka.sh on every start; edit the script (or use --set), not this.\n'
    printf 'process.roles=broker,controller\n'
    printf 'node.id=1\n'
    printf 'controller.quorum.voters=1@%s:%s\n' "$HOST" "$CONTROLLER_PORT"
    printf 'listeners=PLAINTEXT://%s:%s,CONTROLLER://%s:%s\n' "$HOST" "$PORT" "$HOST" "$CONTROLLER_PORT"
    printf 'advertised.listeners=PLAINTEXT://%s:%s\n' "$HOST" "$PORT"
    printf 'controller.listener.names=CONTROLLER\n'
    printf 'inter.broker.listener.name=PLAINTEXT\n'
    printf 'listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT\n'
    printf 'log.dirs=%s\n' "$DATA_DIR"
    printf 'num.partitions=1\n'
    printf 'default.replication.factor=1\n'
    printf 'min.insync.replicas=1\n'
    # Internal topics on one node: replication factor 1, and fewer partitions than the
    # default 50 so the first consumer group / transactional producer is ready sooner.
    printf 'offsets.topic.replication.factor=1\n'
    printf 'offsets.topic.num.partitions=10\n'
    printf 'transaction.state.log.replication.factor=1\n'
    printf 'transaction.state.log.min.isr=1\n'
    printf 'transaction.state.log.num.partitions=10\n'
    printf 'share.coordinator.state.topic.replication.factor=1\n'
    printf 'share.coordinator.state.topic.min.isr=1\n'
    printf 'group.initial.rebalance.delay.ms=0\n'
    # Groups of KIP-848's protocol (the members of a job in a sluice cluster): a member
    # that stops answering loses its partitions after 6 s rather than the default 45 s.
    printf 'group.consumer.session.timeout.ms=6000\n'
    printf 'group.consumer.min.session.timeout.ms=6000\n'
    printf 'group.consumer.heartbeat.interval.ms=1000\n'
    printf 'group.consumer.min.heartbeat.interval.ms=1000\n'
    printf 'auto.create.topics.enable=true\n'
    for kv in "${SETS[@]}"; do
      [[ $kv == ?*=* ]] || die "--set needs KEY=VALUE, got: $kv"
      printf '%s\n' "$kv"
    done
  } >"$PROPS.tmp"
  mv "$PROPS.tmp" "$PROPS"
}

write_log4j2_properties() {
  cat >"$RUN_DIR/log4j2.properties.tmp" <<EOF
# Written by scripts/kafka.sh: the broker's log4j2 config (one rolling file).
status = warn
name = sluice-kafka
# Keep logging through the broker's own shutdown (its last lines would otherwise go to
# kafka.out via log4j's fallback logger); the file appender flushes every line anyway.
shutdownHook = disable
appender.file.type = RollingFile
appender.file.name = FILE
appender.file.fileName = $SERVER_LOG
appender.file.filePattern = $SERVER_LOG.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 50MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 4
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.zk.name = org.apache.zookeeper
logger.zk.level = WARN
EOF
  mv "$RUN_DIR/log4j2.properties.tmp" "$RUN_DIR/log4j2.properties"
}

# The java command line shared by the broker and the storage tool.
broker_java() {
  local heap=${SLUICE_KAFKA_HEAP:-512m}
  local -a extra=()
  # Word splitting is intended: SLUICE_KAFKA_JAVA_OPTS is a list of JVM options.
  # shellcheck disable=SC2206
  [[ -z ${SLUICE_KAFKA_JAVA_OPTS:-} ]] || extra=(${SLUICE_KAFKA_JAVA_OPTS})
  JAVA_CMD=("$(java_bin)" "-Xms${heap}" "-Xmx${heap}" -XX:+UseG1GC -XX:MaxGCPauseMillis=20
    -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true
    "-Dlog4j2.configurationFile=$RUN_DIR/log4j2.properties" "-Dkafka.logs.dir=$LOGS_DIR"
    "${extra[@]}" -cp "$LIB_DIR/*")
}

format_if_needed() {
  [[ ! -f $DATA_DIR/meta.properties ]] || return 0
  local cluster_id
  if [[ -s $RUN_DIR/cluster.id ]]; then
    cluster_id=$(<"$RUN_DIR/cluster.id")
  else
    # What `kafka.tools.StorageTool random-uuid` prints (16 random bytes, base64url, no
    # padding, not starting with '-'), without paying for a JVM start.
    cluster_id=-
    while [[ $cluster_id == -* ]]; do
      cluster_id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
    done
    printf '%s\n' "$cluster_id" >"$RUN_DIR/cluster.id"
  fi
  log "formatting $DATA_DIR (cluster id $cluster_id)"
  mkdir -p "$DATA_DIR"
  if ! "${JAVA_CMD[@]}" kafka.tools.StorageTool format -t "$cluster_id" -c "$PROPS" \
    --ignore-formatted >>"$OUT_FILE" 2>&1; then
    show_log_tail 20
    die "formatting $DATA_DIR failed"
  fi
}

cmd_start() {
  local pid log_offset size start deadline seen=false created=false running_port
  [[ -d $RUN_DIR ]] || created=true
  lock_run_dir
  if pid=$(running_pid); then
    running_port=$(sed -n "s|^advertised\.listeners=PLAINTEXT://$HOST:\([0-9]*\)$|\1|p" "$PROPS")
    if [[ $running_port != "$PORT" ]]; then
      die "a broker (pid $pid) already runs on dir $RUN_DIR with port ${running_port:-?}, not $PORT; stop it first"
    fi
    log "broker already running on $HOST:$PORT (pid $pid, dir $RUN_DIR)"
    deadline=$((SECONDS + ${SLUICE_KAFKA_START_TIMEOUT:-90}))
    until port_open "$PORT"; do
      is_our_broker "$pid" || die "broker pid $pid exited"
      ((SECONDS < deadline)) || die "broker pid $pid runs but $HOST:$PORT does not accept connections"
      sleep 0.5
    done
    return 0
  fi
  rm -f "$PID_FILE"
  check_java
  cmd_fetch true
  local p
  for p in "$PORT" "$CONTROLLER_PORT"; do
    if port_open "$p"; then
      ! $created || rm -rf "$RUN_DIR"
      die "$HOST:$p is already in use by another process"
    fi
  done

  mkdir -p "$DATA_DIR" "$LOGS_DIR"
  : >"$RUN_DIR/$RUN_MARKER"
  write_server_properties
  write_log4j2_properties
  broker_java
  format_if_needed

  # Only log lines written after this point count as "started".
  log_offset=0
  [[ ! -f $SERVER_LOG ]] || log_offset=$(stat -c %s "$SERVER_LOG")
  printf '\n===== %s kafka.sh start (port %s) =====\n' "$(date '+%F %T')" "$PORT" >>"$OUT_FILE"

  start=$SECONDS
  (
    cd "$RUN_DIR"
    exec 8>&- 9>&-
    # A new session, so the caller's Ctrl-C or hang-up does not reach the broker; the
    # inner bash writes its own pid and then becomes java (exec keeps the pid).
    # shellcheck disable=SC2016 # expanded by the inner bash
    setsid bash -c 'printf "%s\n" "$$" >"$1.tmp" && mv "$1.tmp" "$1" && shift && exec "$@"' \
      kafka-launch "$PID_FILE" "${JAVA_CMD[@]}" kafka.Kafka "$PROPS" \
      </dev/null >>"$OUT_FILE" 2>&1 &
  )
  deadline=$((SECONDS + 5))
  until [[ -s $PID_FILE ]]; do
    ((SECONDS < deadline)) || {
      show_log_tail 50
      die "the broker process did not start"
    }
    sleep 0.1
  done
  pid=$(<"$PID_FILE")
  log "started broker pid $pid on $HOST:$PORT (controller $CONTROLLER_PORT), dir $RUN_DIR; waiting until it serves"

  deadline=$((start + ${SLUICE_KAFKA_START_TIMEOUT:-90}))
  while :; do
    if ! is_our_broker "$pid"; then
      show_log_tail 50
      rm -f "$PID_FILE"
      die "the broker exited during startup"
    fi
    if ! $seen && [[ -f $SERVER_LOG ]]; then
      size=$(stat -c %s "$SERVER_LOG")
      ((size >= log_offset)) || log_offset=0 # the log rolled over
      # Not `tail | grep -q`: grep -q exits at the first match, tail then dies of
      # SIGPIPE and, under pipefail, the pipeline "fails" on a long log.
      if grep -q "$READY_LINE" < <(tail -c +"$((log_offset + 1))" "$SERVER_LOG"); then
        seen=true
      fi
    fi
    if $seen && port_open "$PORT"; then
      log "broker serving on $HOST:$PORT after $((SECONDS - start)) s"
      return 0
    fi
    if ((SECONDS >= deadline)); then
      show_log_tail 50
      log "the broker did not serve within ${SLUICE_KAFKA_START_TIMEOUT:-90} s; stopping it"
      stop_pid "$pid"
      exit 1
    fi
    sleep 0.25
  done
}

# SIGTERM, wait up to STOP_TIMEOUT seconds, then SIGKILL.
stop_pid() {
  local pid=$1 deadline
  kill -TERM "$pid" 2>/dev/null || true
  deadline=$((SECONDS + STOP_TIMEOUT))
  while is_our_broker "$pid"; do
    if ((SECONDS >= deadline)); then
      log "broker pid $pid did not stop within $STOP_TIMEOUT s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      deadline=$((SECONDS + 10))
      while is_our_broker "$pid" && ((SECONDS < deadline)); do sleep 0.2; done
      break
    fi
    sleep 0.2
  done
  is_our_broker "$pid" && die "broker pid $pid is still alive"
  rm -f "$PID_FILE"
}

cmd_stop() {
  local pid start
  if [[ ! -d $RUN_DIR ]]; then
    log "no run dir $RUN_DIR; nothing to stop"
    return 0
  fi
  if [[ ! -f $RUN_DIR/$RUN_MARKER ]]; then
    log "$RUN_DIR is not a run dir of this script (no $RUN_MARKER); nothing to stop"
    return 0
  fi
  lock_run_dir
  if ! pid=$(running_pid); then
    rm -f "$PID_FILE"
    log "no broker running for $RUN_DIR"
    return 0
  fi
  start=$SECONDS
  log "stopping broker pid $pid ($HOST:$PORT)"
  stop_pid "$pid"
  log "stopped after $((SECONDS - start)) s"
}

cmd_status() {
  local pid
  if pid=$(running_pid); then
    if port_open "$PORT"; then
      printf 'running on %s:%s\n' "$HOST" "$PORT"
      return 0
    fi
    log "broker pid $pid is up but $HOST:$PORT does not accept connections (yet)"
    return 1
  fi
  log "not running (dir $RUN_DIR)"
  return 1
}

cmd_reset() {
  cmd_stop
  [[ -d $RUN_DIR ]] || return 0
  if [[ ! -f $RUN_DIR/$RUN_MARKER ]]; then
    die "$RUN_DIR has no $RUN_MARKER file, so it is not a run dir of this script; not deleting it"
  fi
  rm -rf "$RUN_DIR"
  log "deleted $RUN_DIR"
}

cmd_logs() {
  [[ -f $SERVER_LOG ]] || die "no log yet: $SERVER_LOG"
  if $FOLLOW; then
    exec tail -n "$LOG_LINES" -F "$SERVER_LOG"
  fi
  tail -n "$LOG_LINES" "$SERVER_LOG"
}

cmd_run_class() {
  (($# >= 1)) || die "run-class needs a main class"
  check_java
  cmd_fetch true
  local conf=$KAFKA_HOME_DIR/tools-log4j2.properties
  if [[ ! -f $conf ]] || ! grep -q '^shutdownHook' "$conf"; then
    cat >"$conf.tmp.$$" <<'EOF'
# Written by scripts/kafka.sh: log4j2 config of the command-line tools (warnings to stderr).
status = warn
shutdownHook = disable
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = STDERR
EOF
    mv "$conf.tmp.$$" "$conf"
  fi
  exec "$(java_bin)" -Xmx512m "-Dlog4j2.configurationFile=$conf" -cp "$LIB_DIR/*" "$@"
}

main() {
  local cmd=${1:-help}
  (($# == 0)) || shift
  case $cmd in
  fetch)
    parse_opts "$cmd" "$@"
    cmd_fetch
    ;;
  start | stop | status | reset | logs)
    parse_opts "$cmd" "$@"
    "cmd_$cmd"
    ;;
  run-class) cmd_run_class "$@" ;;
  help | -h | --help) usage ;;
  *)
    usage >&2
    die "unknown command: $cmd"
    ;;
  esac
}

main "$@"
