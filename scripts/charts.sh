#!/usr/bin/env bash
# Regenerates the charts of the algorithm guide (docs/algorithms.md, docs/charts/*.png).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p tollgate-server
t=target/release/tollgate
mkdir -p docs/charts
$t simulate --pattern boundary --burst 100 --duration 6s \
  --policy 'fixed-window:limit=100,window=1s' \
  --policy 'sliding-log:limit=100,window=1s' \
  --policy 'sliding-window:limit=100,window=1s,buckets=10' \
  --policy 'sliding-window:limit=100,window=1s,mode=weighted' \
  --out docs/charts/windows.png
$t simulate --pattern burst --burst 60 --rate 40 --duration 6s \
  --policy 'gcra:rate=20/s,burst=20' \
  --policy 'token-bucket:rate=20/s,capacity=20' \
  --policy 'leaky-bucket:rate=20/s,capacity=20' \
  --out docs/charts/buckets.png
$t simulate --pattern ramp --rate 60 --duration 8s \
  --policy 'smooth-bursty:rate=20/s' \
  --policy 'smooth-warmup:rate=20/s,warmup=3s' \
  --out docs/charts/guava.png
$t simulate --pattern burst --burst 30 --rate 15 --duration 8s \
  --policy 'limit-req:rate=10/s,burst=20' \
  --policy 'limit-req:rate=10/s,burst=20,nodelay' \
  --policy 'shaper:rate=10/s,queue=20' \
  --out docs/charts/delay.png
$t simulate --pattern poisson --rate 5 --duration 60s --usage 800:0.7 --usage-after 2s \
  --policy 'fixed-window:limit=10000,window=1m' \
  --policy 'token-bucket:rate=10000/m,capacity=10000' \
  --policy 'gcra:rate=10000/m,burst=10000,max-debt=2000' \
  --out docs/charts/usage.png
$t simulate --pattern poisson --rate 40 --duration 6s --hold 100ms \
  --policy 'concurrency:limit=4' \
  --policy 'concurrency:limit=8' \
  --out docs/charts/concurrency.png
$t simulate --pattern closed-loop --duration 15s --capacity 8 --service 20ms \
  --schedule 5s=4,10s=8 --clients 32 \
  --limit none --limit 4 --adaptive gradient --adaptive vegas \
  --out docs/charts/adaptive.png
$t simulate --pattern closed-loop --duration 15s --capacity 8 --service 20ms \
  --clients 32 --timeout 60ms \
  --limit 32 --adaptive gradient --adaptive aimd \
  --out docs/charts/adaptive-timeouts.png
$t simulate --pattern closed-loop --duration 10s --capacity 8 --service 20ms \
  --clients 4:critical:checkout --clients 20:sheddable:batch \
  --limit none --limit 8 --adaptive gradient \
  --out docs/charts/adaptive-priorities.png
$t simulate --pattern closed-loop --duration 15s --capacity 8 --service 20ms --jitter 0.2 \
  --clients 8:critical:checkout --clients 16:sheddable:batch \
  --limit 8 --adaptive gradient \
  --out docs/charts/adaptive-critical-at-capacity.png
