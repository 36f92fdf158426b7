#!/bin/bash
# One run: 2 floor processes (MODE epoll|uring) sharing one port on 127.0.0.1-3, 2 simulators of
# 3,000 phones each (one connection per phone, a point every 0.1 s: 60,000 points/s), then the
# floors' CPU per point over a 20 s window. Prints one line; logs stay in $FLOOR_RUNS/<name>/.
#   tools/edge-floor/run.sh epoll|uring NAME [PORT]
# Env: FLOOR_GATHER_US (epoll: sleep before each epoll_wait), FLOOR_WAIT_NR / FLOOR_WAIT_US
# (uring: completions to wait for per enter, and for how long), PERF=1 (perf record floor 0).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
MODE=$1; NAME=$2; P=${3:-18830}
T=${CARGO_TARGET_DIR:-$ROOT/target}
F=$T/release/floor; B=$T/release/courier-pipeline
[ -x "$F" ] || (cd "$HERE" && cargo build --release -q)
[ -x "$B" ] || (cd "$ROOT" && cargo build --release -q --bin courier-pipeline)
KEYS=${AUTH_KEY_DIR:-$ROOT/.dev/keys}   # `./dev keys` makes them; the floor checks no token
LOAD0=$(uptime | sed "s/.*load average: //")
D=${FLOOR_RUNS:-/tmp/edge-floor-runs}/$NAME; mkdir -p "$D"; cd "$D"
L=127.0.0.1:$P,127.0.0.2:$P,127.0.0.3:$P
"$F" "$MODE" $L > floor0.log 2>&1 & f0=$!
"$F" "$MODE" $L > floor1.log 2>&1 & f1=$!
sleep 0.5
sims=()
for m in 0 1; do
  # The simulator needs no bus or Redis here: MQTT_URL and REDIS_URL point at nothing.
  AUTH_KEY_DIR=$KEYS MQTT_URL=mqtt://127.0.0.1:1 EDGE_LISTEN=127.0.0.1:$P \
  REDIS_URL=redis://127.0.0.1:1/ METRICS_LISTEN=off \
  "$B" simulate --couriers 3000 --interval 0.1 --seconds 3600 --id-prefix "$NAME$m-" \
     --also-mqtt-url mqtt://127.0.0.2:$P --also-mqtt-url mqtt://127.0.0.3:$P \
     --report sim$m.json > sim$m.log 2>&1 &
  sims+=($!)
done
cleanup() { kill "${sims[@]}" 2>/dev/null || true; sleep 3; kill -9 "${sims[@]}" 2>/dev/null || true; kill $f0 $f1 2>/dev/null || true; wait || true; }
trap cleanup EXIT
conns() { for f in floor0.log floor1.log; do tail -n1 $f | awk '{print $8}'; done | awk '{s+=$1} END{print s+0}'; }
t0=$(date +%s)
while [ "$(conns)" -lt 6000 ] && [ $(( $(date +%s) - t0 )) -lt 120 ]; do sleep 1; done
echo "connected: $(conns) after $(( $(date +%s) - t0 )) s (tick resolution 5 s)"
sleep 3
start_ms=$(date +%s%3N)
if [ -n "${PERF:-}" ]; then perf record -q -e cpu-clock -F 4999 -g -p $f0 -o perf.data -- sleep 10 > perf.log 2>&1; sleep 16; else sleep 26; fi
load=$(uptime | sed 's/.*load average: //')
# The window: from each floor's first tick after start_ms to its 4th tick later (20 s).
for f in floor0.log floor1.log; do
  awk -v s=$start_ms '$1=="tick" && $2>=s {n++; if(n==1){p=$4;c=$6;e=$10;r=$12;t=$2} if(n==5){printf "%d %d %d %d %d\n",$4-p,$6-c,$2-t,$10-e,$12-r; exit}}' $f
done > window.txt
awk -v load="$LOAD0 -> $load" -v mode=$MODE -v name=$NAME '
 {pub+=$1; cpu+=$2; ms=$3; en+=$4; rc+=$5}
 END{printf "%s %s: %.2f us/point, %.0f points/s, %.2f recv/point, %.1f points/wake-up; load %s\n",
   name, mode, cpu/pub, pub*1000/ms, rc/pub, pub/en, load}' window.txt
