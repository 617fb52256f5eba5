"""The command line: `gpu-binder` (controller, operator tools, and — from a source checkout —
the local cluster, demo and benchmarks) and `kubectl-gpu`. The composition root: the only
package that imports `bench/` and the `localcluster` harness, and only inside the commands
that need them, so the image (production packages only) runs the controller and the tools."""
