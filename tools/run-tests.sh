#!/usr/bin/env bash
# make test's pytest runs. With no arguments, two streams side by side, so that both cores
# work (one stream alone keeps about one core busy: the end-to-end tests spend much of their
# time waiting on kube-apiserver, KubeVirt and the replicas):
#   1. the in-memory suites (`-m "not e2e"`), then the end-to-end tests that run KubeVirt
#      (`-m "e2e and kubevirt"`), on a control plane of their own;
#   2. the other end-to-end tests (`-m "e2e and not kubevirt"`), on another control plane.
# Stream 2 prints as it goes; stream 1's logs are printed after it; the exit status is
# non-zero when any run failed. With arguments (make test PYTEST_ARGS=...): one pytest run
# with them.
set -u
PY=${PY:-.venv/bin/python}
if [ $# -gt 0 ]; then
  exec "$PY" -m pytest "$@"
fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/gpu-binder-tests.XXXXXX")
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait; rm -rf "$dir"' EXIT
(
  "$PY" -m pytest -m "not e2e" >"$dir/1-in-memory.log" 2>&1; a=$?
  "$PY" -m pytest -m "e2e and kubevirt" >"$dir/2-e2e-kubevirt.log" 2>&1; b=$?
  echo "$a $b" >"$dir/stream1.rc"
) &
pids+=($!)
echo "==== end-to-end without KubeVirt (the in-memory suites and KubeVirt's follow when done)"
"$PY" -m pytest -m "e2e and not kubevirt"
c=$?
wait "${pids[0]}"
read -r a b <"$dir/stream1.rc" || { a=1; b=1; }
for f in "$dir"/*.log; do
  echo
  echo "==== $(basename "$f" .log)"
  cat "$f"
done
echo
echo "==== exit: in-memory $a, end-to-end with KubeVirt $b, other end-to-end $c"
[ "$a" -eq 0 ] && [ "$b" -eq 0 ] && [ "$c" -eq 0 ]
