"""The `gpu-binder` command line: the composition root.

Sub-commands: `controller`, `webhook` (the product), `explain`, `what-if`, `top` (the
operator's read-only tools, also the kubectl plugin `kubectl gpu …`), `health` (suspected
GPUs; `health clear` lifts one), `demo`, `cluster up`
(a local control plane in the foreground), `bench`. Every flag's help gives its meaning,
unit and default. Each sub-command imports only what it needs, so `--help` stays fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _count(minimum: int):
    """An argparse type: an int >= `minimum` (a clear usage error, exit 2, otherwise)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    parse.__name__ = f"integer >= {minimum}"
    return parse


def _cluster_up(args: argparse.Namespace) -> int:
    from localcluster.controlplane import ControlPlaneError
    from localcluster.up import main_up

    if args.permit and not args.kubevirt:
        print("gpu-binder cluster up: --permit names KubeVirt's permitted host devices: it "
              "needs --kubevirt", file=sys.stderr)
        return 2
    if (args.hgx_nodes is not None or args.l40s_nodes is not None) and not args.dra:
        print("gpu-binder cluster up: --hgx-nodes and --l40s-nodes size the device-mode "
              "fleet: they need --dra", file=sys.stderr)
        return 2
    try:
        return main_up(Path(args.dir), controllers=args.controllers, kubevirt=args.kubevirt,
                       permitted=tuple(r for r in (args.permit or "").split(",") if r),
                       dra=args.dra, hgx=4 if args.hgx_nodes is None else args.hgx_nodes,
                       l40s=1 if args.l40s_nodes is None else args.l40s_nodes)
    except ControlPlaneError as exc:
        print(f"gpu-binder cluster up: {exc}", file=sys.stderr)
        return 2


def _controller(args: argparse.Namespace) -> int:
    """`gpu-binder controller` and `webhook`: the settings (`k8s.config.load`: flags, file,
    GPU_BINDER_* variables), then the kubeconfig's shape when one is given
    (`cli.tools.check_kubeconfig`, as `top` and `explain` judge theirs), each refused in one
    line with exit 2 before anything starts; then the replica runs (`Controller.run`'s exit
    code)."""
    import anyio

    from cli.tools import ToolError, check_kubeconfig
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
    if cfg.kubeconfig:   # None: the in-cluster service account
        try:   # the loader's words for these were "argument of type 'NoneType' is not iterable"
            check_kubeconfig(cfg.kubeconfig)
        except ToolError as exc:
            print(f"gpu-binder {args.command}: {exc}", file=sys.stderr)
            return 2
    return anyio.run(Controller(cfg).run)


def _demo(args: argparse.Namespace) -> int:
    from localcluster.controlplane import ControlPlaneError
    from localcluster.demo import run

    count_only = [flag for flag, value in (("--nodes", args.nodes), ("--vmis", args.vmis),
                                           ("--seed", args.seed), ("--vmi-only", args.vmi_only or None))
                  if value is not None]
    if args.dra and count_only:
        verb = "does" if len(count_only) == 1 else "do"
        print(f"gpu-binder demo: {', '.join(count_only)} {verb} not apply with --dra (its fleet and "
              f"VMIs are fixed: docs/device-mode.md)", file=sys.stderr)
        return 2
    args.nodes = 8 if args.nodes is None else args.nodes
    args.vmis = 30 if args.vmis is None else args.vmis
    args.seed = 7 if args.seed is None else args.seed
    try:
        if args.dra:
            from localcluster.demo_dra import run as run_dra

            return run_dra(log_dir=Path(args.log_dir), keep=args.keep)
        return run(nodes=args.nodes, vmis=args.vmis, seed=args.seed, log_dir=Path(args.log_dir),
                   keep=args.keep, vmi_only=args.vmi_only)
    except (ControlPlaneError, ValueError) as exc:
        print(f"gpu-binder demo: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; everything was stopped", file=sys.stderr)
        return 130


def _bench(args: argparse.Namespace) -> int:
    """`gpu-binder bench WHICH`: the chosen benchmark's run (`bench.registry`): 0 done, 1 a
    soak that found a violation or a lost admission, 2 a bad flag value or `--out` (refused
    before anything starts), 130 interrupted (Ctrl-C: one line, no traceback)."""
    if not hasattr(args, "benchmark"):
        print("gpu-binder bench: the benchmarks run from a source checkout; this "
              "installation has none", file=sys.stderr)
        return 2
    from bench.common import BadArgs, check_out

    try:   # every benchmark has --out (bench.common.add_out): refused before the run starts
        check_out(f"gpu-binder bench {args.which}", args.out)
        return args.benchmark.run(args)
    except BadArgs as exc:
        print(exc, file=sys.stderr)
        return 2
    except KeyboardInterrupt:   # Ctrl-C: the clusters' context managers have stopped them
        print(f"gpu-binder bench {args.which}: interrupted; the processes it started were "
              f"stopped, no report written", file=sys.stderr)
        return 130


def _tools(args: argparse.Namespace) -> int:
    from cli.tools import run

    return run(args)


def _health(args: argparse.Namespace) -> int:
    from cli.health import run

    return run(args)


READS = ("list, cluster-wide, Nodes, Namespaces, ResourceQuotas, PriorityClasses, Pods, "
         "GPUClasses, GPUDevices, VirtualMachineInstances, KubeVirt CRs, ResourceSlices, "
         "ResourceClaims, DeviceClasses and DeviceTaintRules, and in --settings-namespace the "
         "ConfigMaps gpu-settings and gpu-suspects and the GPUNominations (what the "
         "controller's cache lists). Nothing is written; a kind "
         "the cluster does not serve reads as none, one the user may not list (403) stops "
         "the command")
"""What `explain`, `defrag`, `what-if` and `top` read with `--kubeconfig` (`cli.tools.read_cluster`;
tests/cli/test_cli.py checks every informer of the cache is named)."""

HEALTH_RIGHTS = ("list DeviceTaintRules (label gpu.cozystack.io/suspect=true, cluster-wide) and "
                 "get the ConfigMap gpu-suspects in --settings-namespace (a source it may not "
                 "read is skipped, named on stderr); `clear` also deletes that DeviceTaintRule "
                 "(or updates that ConfigMap) and creates an Event GPUSuspicionCleared about "
                 "the Node in namespace default. Nothing else is read or written")
"""What `health` reads and `health clear` writes with `--kubeconfig` (`cli.health`)."""


def _add_tools(sub, prog: str) -> None:
    """The operator tools `explain`, `defrag --plan`, `what-if`, `top` (read-only) and
    `health` (whose `clear` deletes one mark) (shared with kubectl-gpu)."""
    from cli.tools import default_kubeconfig
    from k8s.config import default

    def common(p: argparse.ArgumentParser, rights: str = READS,
               namespace: str = "the ConfigMaps gpu-settings and gpu-suspects and the "
                                "GPUNominations") -> None:
        p.add_argument("--kubeconfig", default=default_kubeconfig(),
                       help=f"kubeconfig whose user may {rights} (default: $KUBECONFIG, else "
                            f"~/.kube/config; now %(default)s)")
        p.add_argument("--settings-namespace", default=default("settings_namespace"),
                       help=f"namespace of {namespace}, the controller's, as its "
                            f"--settings-namespace (default: %(default)s)")
        p.add_argument("--timeout", type=float, default=30.0,
                       help="seconds to wait for the cluster to be read (default: %(default)g)")
        p.add_argument("--json", action="store_true",
                       help="print the answer as JSON for scripts (default: text)")
        p.set_defaults(func=_tools, prog=prog)

    ex = sub.add_parser(
        "explain", help="would this VMI be admitted now, and why not: per node (read-only)",
        description="Reads the cluster once (no writes) and tells whether an admission of the "
                    "VMI now would place its GPU set: per node whether the set fits and why "
                    "not, the node the binder would choose and its moves, and when it fits "
                    "nowhere the smallest change that would make it fit. Exit code 0: it "
                    "would be admitted; 1: it would be refused; 2: bad input or the cluster "
                    "could not be read.")
    ex.add_argument("vmi", nargs="?", metavar="NAMESPACE/NAME",
                    help="an existing VMI, else a VirtualMachine (explained from its "
                         "spec.template; a VMI of the name wins) (default: none; give this "
                         "or -f)")
    ex.add_argument("-f", "--filename", metavar="FILE",
                    help="a VMI manifest (YAML or JSON; - for stdin), not created yet "
                         "(default: none; give this or NAMESPACE/NAME)")
    ex.add_argument("-n", "--namespace",
                    help="namespace of the VMI of -f when its manifest has none "
                         "(default: the manifest's metadata.namespace)")
    ex.add_argument("--attachment-grace", type=float, default=default("attachment_grace"),
                    help="seconds an attachment to a VMI that does not exist still counts as "
                         "live, as the controller's --attachment-grace (default: %(default)g)")
    ex.add_argument("--defrag-max-moves", type=int, default=default("defrag_max_moves"),
                    help="moves of the defragmentation round explain tries when the set is "
                         "refused, as the controller's --defrag-max-moves (default: "
                         "%(default)s)")
    common(ex, READS + "; given NAMESPACE/NAME it also gets that VirtualMachine")

    df = sub.add_parser(
        "defrag", help="the moves a defragmentation round would make now (read-only)",
        description="Reads the cluster once (no writes) and plans one defragmentation round "
                    "as the binder would (docs/contract.md §3a): which idle held devices of Move "
                    "classes it would move where, and the largest placeable set of each class "
                    "before and after. The binder carries rounds out itself when run with "
                    "--defrag-interval.")
    df.add_argument("--plan", action="store_true", required=True,
                    help="required: show the plan only (the one mode: this command never "
                         "moves anything)")
    df.add_argument("--max-moves", type=int, default=default("defrag_max_moves"),
                    help="most moves of the round, as the controller's --defrag-max-moves "
                         "(default: %(default)s)")
    common(df)

    wi = sub.add_parser(
        "what-if", help="what a cordon or drain of nodes does to the sets held there",
        description="Reads the cluster once (no writes), cordons or drains the NODEs in the "
                    "model, and for every held set on them says what the binder would do on "
                    "its next admission: stay (B5), move where (B1), or be refused; and which "
                    "admitted VMIs would be stranded. drain also stops the VMIs running there.")
    wi.add_argument("mode", choices=["cordon", "drain"],
                    help="cordon: mark the nodes unschedulable; drain: cordon and stop their "
                         "VMIs")
    wi.add_argument("nodes", nargs="+", metavar="NODE", help="node names (one or more)")
    common(wi)

    tp = sub.add_parser(
        "top", help="GPU use per class, node and tenant, and the largest placeable set",
        description="Reads the cluster once (no writes): per class and node, devices Bound, "
                    "attached to a VMI that exists, held idle, and free units; the largest "
                    "set of each class placeable now (fragmentation); per tenant, budget used "
                    "of budget.")
    common(tp)

    hl = sub.add_parser(
        "health", help="GPUs suspected broken (failed VM starts) and their evidence; "
                       "`health clear DEVICE` lifts one",
        description="Lists the GPUs the binder suspects broken (docs/device-mode.md, HL2): "
                    "on each, health.failedStarts different VMIs failed to start within "
                    "health.window; for each the VMIs, when and why, and its mark (a "
                    "DeviceTaintRule gpu.cozystack.io/suspect, NoSchedule, or where rules are "
                    "not served an entry of the ConfigMap gpu-suspects, which kube-scheduler "
                    "cannot see). `health clear DEVICE` deletes that mark (the only write of "
                    "these tools) and records who lifted it (an Event on the node naming the "
                    "kubeconfig context's user). A source of marks the kubeconfig may not read "
                    "(403) is skipped with one line on stderr naming the missing right. Exit "
                    "code 0: done (with what could be read); 1: neither source could be read; "
                    "2: bad input, DEVICE not suspected, or the cluster could not be read or "
                    "written.")
    hl.add_argument("action", nargs="?", choices=["clear"],
                    help="clear: lift the suspicion of DEVICE (default: list the suspects)")
    hl.add_argument("device", nargs="?", metavar="DEVICE",
                    help="with clear: the suspected GPU as node/device (e.g. "
                         "hgx-node-01/gpu-vfio-3), pool/device, driver/pool/device or the "
                         "rule's name (default: none)")
    common(hl, HEALTH_RIGHTS, namespace="the ConfigMap gpu-suspects")
    hl.set_defaults(func=_health)


def version() -> str:
    """The installed distribution's version (pyproject.toml's `project.version`, the one
    version: the image label and the chart's `version`/`appVersion` equal it), e.g. "0.1.0".
    Raises importlib.metadata.PackageNotFoundError when gpu-binder is not installed."""
    from importlib.metadata import version as dist_version

    return dist_version("gpu-binder")


def _add_bench_parsers(which) -> None:
    """One sub-command per benchmark of `bench.registry.BENCHMARKS` under `gpu-binder bench`,
    each with only the flags it reads (`gpu-binder bench packing --help`); a flag of another
    benchmark is refused by argparse (exit 2) instead of being ignored. The image ships no
    benchmarks: there the command says so."""
    try:
        from bench.registry import BENCHMARKS
    except ImportError:  # not a source checkout
        which.required = False
        return
    for benchmark in BENCHMARKS:
        p = which.add_parser(benchmark.name, help=benchmark.help, description=benchmark.help)
        benchmark.add_arguments(p)
        p.set_defaults(benchmark=benchmark)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every sub-command."""
    parser = argparse.ArgumentParser(
        prog="gpu-binder",
        description="Hands out GPUs to KubeVirt virtual machines as whole sets: a VMI that asks "
                    "for GPUs gets all of them on one node, pinned there, or is refused with the "
                    "reason per node and nothing moved; tenants stay within their "
                    "ResourceQuotas and GPU classes.",
        epilog="In a cluster the Deployment runs `gpu-binder controller`; `explain`, "
               "`defrag --plan`, `what-if` and `top` are read-only tools for operators (also "
               "`kubectl gpu ...`); `demo` and `cluster up` try it on a local control plane. "
               "`COMMAND --help` lists a command's flags; docs/install.md installs it.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}",
                        help="print the installed package's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    cluster = sub.add_parser("cluster", help="a local control plane (etcd + kube-apiserver)")
    csub = cluster.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = csub.add_parser("up", help="run it in the foreground until Ctrl-C/SIGTERM")
    up.add_argument("--dir", required=True,
                    help="directory to write the admin and tenant kubeconfigs to (required)")
    up.add_argument("--controllers", type=_count(0), default=0,
                    help="controller replicas to run, with the webhook registered; 0: the "
                         "control plane only (default: %(default)s)")
    up.add_argument("--kubevirt", action="store_true",
                    help="also run KubeVirt's virt-api and virt-controller, kube-scheduler and KWOK "
                         "(nodes annotated kwok.x-k8s.io/node=fake are kept Ready; default: off)")
    up.add_argument("--permit", default="",
                    help="with --kubevirt: resource names the KubeVirt CR permits as host devices "
                         "(comma-separated; edit the CR kubevirt/kubevirt later to change them; "
                         "default: none)")
    up.add_argument("--dra", action="store_true",
                    help="device mode's world (docs/contract.md §3b, docs/device-mode.md): "
                         "kube-controller-manager's resourceclaim-controller, NVIDIA's "
                         "DeviceClass vfio.gpu.nvidia.com, KWOK nodes publishing ResourceSlices "
                         "as NVIDIA's DRA driver would, the device-mode GPUClasses hgx-h100 and "
                         "l40s; with --kubevirt, KubeVirt runs with GPUsWithDRA (default: off)")
    up.add_argument("--hgx-nodes", type=_count(0), default=None,
                    help="with --dra: KWOK nodes of the hgx-h100-8 profile (8 GPUs in Fabric "
                         "Manager partitions) (default: 4)")
    up.add_argument("--l40s-nodes", type=_count(0), default=None,
                    help="with --dra: KWOK nodes of the l40s-4 profile (4 PCIe cards, two PCIe "
                         "roots) (default: 1)")
    up.set_defaults(func=_cluster_up)

    demo = sub.add_parser("demo", help="the whole system on a local control plane (make demo)")
    demo.add_argument("--nodes", type=_count(2), default=None,
                      help="GPU nodes to create, at least 2: one per GPU model (default: 8)")
    demo.add_argument("--vmis", type=_count(1), default=None,
                      help="VirtualMachines (or, with --vmi-only, VMIs) created at once, at "
                           "least 1 (default: 30)")
    demo.add_argument("--vmi-only", action="store_true",
                      help="create VMIs directly instead of VirtualMachines (default: "
                           "VirtualMachines, as Cozystack does)")
    demo.add_argument("--seed", type=int, default=None,
                      help="seed of the random VMI mix (default: 7)")
    demo.add_argument("--log-dir", default="logs",
                      help="directory of the per-node decision logs (default: ./%(default)s)")
    demo.add_argument("--keep", action="store_true",
                      help="keep everything running until Ctrl-C (default: stop at the end)")
    demo.add_argument("--dra", action="store_true",
                      help="device mode instead (docs/device-mode.md): an HGX fleet publishing "
                           "ResourceSlices, VMIs of 1, 2, 4 and 8 GPUs; prints each one's node, "
                           "exact GPUs (module ids) and the partition they form, and the "
                           "refusals; --nodes, --vmis, --seed and --vmi-only do not apply and "
                           "are refused with it (default: off)")
    demo.set_defaults(func=_demo)

    bench = sub.add_parser("bench", help="benchmarks: core (actors vs bare model), e2e, "
                                         "floor (the API's floor beside our admission), "
                                         "packing (placement quality on a churn trace), "
                                         "contention (who goes first: priority, preemption, "
                                         "the line) or "
                                         "fairness (a tenant's creates under another's flood), "
                                         "scale or soak (churn with leader kills, docs/contract.md §7 checked), "
                                         "health (taints, broken and lost GPUs injected); "
                                         "`gpu-binder bench WHICH --help` lists WHICH's flags")
    bench.set_defaults(func=_bench)
    which = bench.add_subparsers(dest="which", required=True, metavar="WHICH",
                                 help="the benchmark to run; each takes its own flags "
                                      "(`gpu-binder bench WHICH --help`)")
    _add_bench_parsers(which)

    _add_tools(sub, "gpu-binder")

    from k8s.config import Config, field_help

    for command, text in (("controller", "run one controller replica (webhook in every "
                           "replica; binder and housekeeping in the elected leader)"),
                          ("webhook", "run the admission webhook alone (no leader election, "
                           "no binder)")):
        ctl = sub.add_parser(command, help=text)
        ctl.add_argument("--config", help="YAML/JSON file of settings, keys named as the "
                         "flags without their leading dashes (e.g. a mounted ConfigMap); "
                         "flags and GPU_BINDER_* variables override it (default: none)")
        for name in Config.__dataclass_fields__:
            if command == "webhook" and name == "leader_election":
                continue
            ctl.add_argument("--" + name.replace("_", "-"), dest=name, default=None,
                             help=field_help(name))
        ctl.set_defaults(func=_controller)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `gpu-binder` console script; returns the process exit code."""
    return _run(_parse(build_parser(), argv))


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """`parse_args`, but an argument no parser takes is reported by the sub-command it was
    given to (`gpu-binder bench core: error: unrecognized arguments: --hgx`, with that
    command's usage), not by the top-level parser, and before a missing command
    (`gpu-binder --bogus`: unrecognized arguments, not "COMMAND is required"). Exits 2 on a
    usage error, as argparse."""
    required = [a for a in _subparser_actions(parser) if a.required]
    for action in required:      # checked below, after the unknown arguments
        action.required = False
    try:
        args, extra = parser.parse_known_args(argv)
    finally:
        for action in required:
            action.required = True
    inner = parser
    while True:
        subs = [a for a in inner._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = getattr(args, subs[0].dest, None) if subs else None
        if chosen is None or chosen not in subs[0].choices:
            break
        inner = subs[0].choices[chosen]
    if extra:
        inner.error(f"unrecognized arguments: {' '.join(extra)}")
    if subs and chosen is None and subs[0].required:
        inner.error(f"the following arguments are required: {subs[0].metavar or subs[0].dest}")
    return args


def _subparser_actions(parser: argparse.ArgumentParser) -> list[argparse._SubParsersAction]:
    """Every sub-command action of `parser` and of its sub-parsers, depth first."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            out.append(action)
            for child in action.choices.values():
                out.extend(_subparser_actions(child))
    return out


def _run(args: argparse.Namespace) -> int:
    """Run the chosen sub-command; a reader that went away (`gpu-binder top | head`) ends it
    quietly with exit code 141 (128 + SIGPIPE, as a shell reports it), not a traceback."""
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)  # the interpreter flushes stdout at exit
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def build_kubectl_parser() -> argparse.ArgumentParser:
    """The parser of the kubectl plugin: `explain`, `what-if`, `top` only."""
    parser = argparse.ArgumentParser(
        prog="kubectl gpu", description="gpu-binder's read-only tools as a kubectl plugin "
        "(the same code as `gpu-binder explain|what-if|top`)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_tools(sub, "kubectl gpu")
    return parser


def kubectl_main(argv: list[str] | None = None) -> int:
    """Entry point of the `kubectl-gpu` console script (`kubectl gpu explain …`)."""
    return _run(_parse(build_kubectl_parser(), argv))


if __name__ == "__main__":
    sys.exit(main())
