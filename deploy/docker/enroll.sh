#!/bin/sh
# One-shot: a fresh bootstrap token for every simulated agent slot (0 .. SIM_AGENTS-1) that holds no node
# credential yet, written where that slot's agent reads it (deploy/docker/sim_agent.py). A slot that registered
# once keeps its credential and node name across restarts and recreations; a token left unused expires.
set -eu

state="${SIM_AGENT_STATE_DIR:-/var/lib/gpupool-agents}"
count="${SIM_AGENTS:-2}"
mkdir -p "$state/tokens"
umask 077
slot=0
while [ "$slot" -lt "$count" ]; do
    name=$(printf 'slot-%02d' "$slot")
    if [ ! -s "$state/$name/agent.json" ]; then
        gpupool agent_bootstrap_token --ttl 86400 --description "compose simulated agent $name" \
            > "$state/tokens/$name.token.tmp" 2>/dev/null
        mv "$state/tokens/$name.token.tmp" "$state/tokens/$name.token"
        echo "enroll: token for $name"
    fi
    slot=$((slot + 1))
done
echo "enroll: $count simulated agent slot(s) ready"
