#!/usr/bin/env bash
# make test's pytest run. With no arguments: the in-memory suites (`-m "not e2e"`: pure
# logic, the actor core on fake time, the webhook and CLI on fakes; CPU-bound, about 3 min)
# run beside the end-to-end ones (`-m e2e`: real kube-apiserver, etcd, KubeVirt, kube-scheduler;
# about half their time is spent waiting on those processes), so the first costs little
# wall time. The in-memory run's output is printed after the end-to-end run's; the exit
# status is non-zero when either failed. With arguments (make test PYTEST_ARGS=...): one
# pytest run with them, as before.
set -u
PY=${PY:-.venv/bin/python}
if [ $# -gt 0 ]; then
  exec "$PY" -m pytest "$@"
fi
log=$(mktemp "${TMPDIR:-/tmp}/gpu-binder-fast.XXXXXX")
"$PY" -m pytest -m "not e2e" >"$log" 2>&1 &
fast=$!
trap 'kill "$fast" 2>/dev/null; rm -f "$log"' EXIT
"$PY" -m pytest -m e2e
e2e=$?
wait "$fast"
inmem=$?
echo
echo "== the in-memory suites (pytest -m 'not e2e', run beside the end-to-end ones): exit $inmem"
cat "$log"
echo "== end-to-end exit $e2e, in-memory exit $inmem"
[ "$e2e" -eq 0 ] && [ "$inmem" -eq 0 ]
