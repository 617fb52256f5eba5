"""The `gpu-binder` command line: the composition root.

Sub-commands: `cluster up` (a local control plane in the foreground). Each sub-command
imports only what it needs, so `gpu-binder --help` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _cluster_up(args: argparse.Namespace) -> int:
    from k8s.controlplane import ControlPlaneError, main_up

    try:
        return main_up(Path(args.dir))
    except ControlPlaneError as exc:
        print(f"gpu-binder cluster up: {exc}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every sub-command."""
    parser = argparse.ArgumentParser(prog="gpu-binder", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    cluster = sub.add_parser("cluster", help="a local control plane (etcd + kube-apiserver)")
    csub = cluster.add_subparsers(dest="action", required=True)
    up = csub.add_parser("up", help="run it in the foreground until Ctrl-C/SIGTERM")
    up.add_argument("--dir", required=True, help="where to write the kubeconfigs")
    up.set_defaults(func=_cluster_up)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `gpu-binder` console script; returns the process exit code."""
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
