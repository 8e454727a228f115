#!/usr/bin/env bash
# The whole peers run (docs/PEERS.md) in one command: the drains, then the live loads,
# in turns of at most 5 minutes under /tmp/heavy.lock (the machine is shared), all
# merged into out/bench/peers-BROKER.json by bench/peers.py, then the tables, the CSV
# and the plot (--report); the burst (bench/peers_burst.py) runs before the report, in
# a file of its own. Rounds are interleaved within each turn, not across turns;
# every turn runs on the same commit and broker kind (bench/peers.py starts the
# results afresh on another commit of the measured code). Rerun after an interrupted
# run: the rows already merged are left out (--skip-done).
#
#     bash bench/peers/run_all.sh [kafka|embedded] [requests per drain]
set -euo pipefail
cd "$(dirname "$0")/../.."
broker="${1:-kafka}"
requests="${2:-6000}"
[ -x .venv-peers/bin/python ] || bash bench/peers/setup.sh
turn() {
  flock /tmp/heavy.lock timeout 300 env PYTHONPATH="$PWD" .venv/bin/python bench/peers.py \
    --broker "$broker" --requests "$requests" --skip-done "$@" || echo "turn $* ended with $?"
}
turn --part drain --only tidebatch-static,tidebatch-adaptive
turn --part drain --only loop-poll,loop-64,loop-512
turn --part drain --only quix-message,quix-window,faust-take
turn --part drain --only bytewax
# Live loads: two rows a turn, six loads each (fractions of the drains merged above).
for pair in tidebatch-adaptive,loop-64 tidebatch-static,loop-512 loop-poll,bytewax faust-take,quix-message quix-window; do
  turn --part live --seconds 6 --only "$pair"
done
# bench/policies.py's burst for the main rows, at one load basis for all (bench/peers_burst.py).
flock /tmp/heavy.lock timeout 600 env PYTHONPATH="$PWD" .venv/bin/python bench/peers_burst.py --broker "$broker" \
  || echo "burst turn ended with $?"
PYTHONPATH="$PWD" .venv/bin/python bench/peers.py --broker "$broker" --report
