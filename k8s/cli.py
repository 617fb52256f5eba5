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
        return main_up(Path(args.dir), controllers=args.controllers)
    except ControlPlaneError as exc:
        print(f"gpu-binder cluster up: {exc}", file=sys.stderr)
        return 2


def _controller(args: argparse.Namespace) -> int:
    import anyio

    from k8s import config as config_mod
    from k8s.controller import Controller

    flags = {k: v for k, v in vars(args).items() if k in config_mod.Config.__dataclass_fields__}
    if args.command == "webhook":
        flags["leader_election"] = False
    try:
        cfg = config_mod.load(args.config, flags=flags)
    except (ValueError, OSError) as exc:
        print(f"gpu-binder {args.command}: bad configuration: {exc}", file=sys.stderr)
        return 2
    return anyio.run(Controller(cfg).run)


def _demo(args: argparse.Namespace) -> int:
    from k8s.controlplane import ControlPlaneError
    from k8s.demo import run

    if args.nodes < 2 or args.vmis < 1:
        print("gpu-binder demo: --nodes must be at least 2 (one per GPU model) and --vmis at "
              "least 1", file=sys.stderr)
        return 2
    try:
        return run(nodes=args.nodes, vmis=args.vmis, seed=args.seed, log_dir=Path(args.log_dir),
                   keep=args.keep)
    except ControlPlaneError as exc:
        print(f"gpu-binder demo: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; everything was stopped", file=sys.stderr)
        return 130


def _bench(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.which == "e2e":
        from bench.e2e import run
    else:
        from bench.core import run
    run(out, quick=args.quick, seed=args.seed)
    print(f"report: {out}/{args.which}.json, plot: {out}/{args.which}.png")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every sub-command."""
    parser = argparse.ArgumentParser(prog="gpu-binder", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    cluster = sub.add_parser("cluster", help="a local control plane (etcd + kube-apiserver)")
    csub = cluster.add_subparsers(dest="action", required=True)
    up = csub.add_parser("up", help="run it in the foreground until Ctrl-C/SIGTERM")
    up.add_argument("--dir", required=True, help="where to write the kubeconfigs")
    up.add_argument("--controllers", type=int, default=0,
                    help="controller replicas to run, with the webhook registered (default 0)")
    up.set_defaults(func=_cluster_up)

    demo = sub.add_parser("demo", help="the whole system on a local control plane (make demo)")
    demo.add_argument("--nodes", type=int, default=8, help="GPU nodes (default 8)")
    demo.add_argument("--vmis", type=int, default=30, help="VMIs created at once (default 30)")
    demo.add_argument("--seed", type=int, default=7, help="seed of the VMI mix (default 7)")
    demo.add_argument("--log-dir", default="logs", help="per-node logs (default ./logs)")
    demo.add_argument("--keep", action="store_true", help="keep running until Ctrl-C")
    demo.set_defaults(func=_demo)

    bench = sub.add_parser("bench", help="benchmarks: core (actors vs bare model) or e2e")
    bench.add_argument("which", choices=["core", "e2e"])
    bench.add_argument("--out", default="bench-out", help="folder for JSON and PNG")
    bench.add_argument("--quick", action="store_true", help="fewer levels and requests")
    bench.add_argument("--seed", type=int, default=1)
    bench.set_defaults(func=_bench)

    from k8s.config import Config

    for command, text in (("controller", "run one controller replica (webhook in every "
                           "replica; binder and housekeeping in the elected leader)"),
                          ("webhook", "run the admission webhook alone (no leader election, "
                           "no binder)")):
        ctl = sub.add_parser(command, help=text)
        ctl.add_argument("--config", help="YAML/JSON file of settings (e.g. a mounted ConfigMap)")
        for name, f in Config.__dataclass_fields__.items():
            if command == "webhook" and name == "leader_election":
                continue
            ctl.add_argument("--" + name.replace("_", "-"), dest=name, default=None,
                             help=f"(default: {'see docs' if name == 'identity' else f.default})")
        ctl.set_defaults(func=_controller)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `gpu-binder` console script; returns the process exit code."""
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
