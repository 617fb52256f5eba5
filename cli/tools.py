"""The operator's tools on a real cluster: `gpu-binder explain`, `defrag --plan`, `what-if`,
`top` (also the kubectl plugin `kubectl gpu …`).

Each reads the cluster once with the user's kubeconfig — the same lists the controller's
informers make, parsed the same way into the same `Snapshot` (`ClusterCache.read_once`) —
writes nothing, and prints what `model.explain` (what-if: `model.what_if`) answers, as text
or (`--json`) JSON.
Exit codes: 0 done (whatever the verdict), 1 `explain` found the VMI would be refused,
2 bad input or the cluster could not be read (the message names the flag or the object).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from enum import Enum
from pathlib import Path
from typing import Any, Iterator, Mapping

import anyio
import structlog
import yaml

from cli.devices import device_total_lines, lost_lines, tainted_lines
from model.admission import LauncherDefaults, node_selector_of, unknown_annotations
from model.types import ADMISSION_ANNOTATION
from model.defrag import DefragPlan, plan_round
from model.explain import Explanation, Top, explain, top
from model.line import waits_for_room
from model.line_status import ClassLine, Published, place_in, published_lines
from model.parse import ParseError, parse_tolerations, parse_vmi_request
from model.serialize import format_time
from model.snapshot import Snapshot
from model.vm import vmi_of_vm
from model.what_if import WhatIf, what_if
from model.reasons import Code, Reason, resource_label


class ToolError(Exception):
    """Bad input or an unreadable cluster; the message is printed as is (exit code 2)."""


@dataclass(frozen=True, slots=True)
class Cluster:
    """The cluster as read once: the snapshot, live VMIs (namespace, name), raw VMIs, and
    what the webhook knows of VMIs (`ClusterCache.vmi_state`: uids, admission ids); `vms`
    the VirtualMachines read by name (`read_cluster(vm=...)`); `lines` the waiting line of
    each class as the leader published it in the GPUClass's `status.line` (P5,
    `model.line_status`; classes nobody waits in are absent); `rules_selecting_nothing` the
    DeviceTaintRules whose selector picks no published device
    (`ClusterCache.rules_selecting_nothing`: they taint nothing, `top` names them)."""

    snapshot: Snapshot
    live_vmis: set[tuple[str, str]]
    vmis: dict[tuple[str, str], dict]
    vmi_state: Any = None
    permitted: frozenset[str] | None = None
    launcher: LauncherDefaults = LauncherDefaults()
    vms: dict[tuple[str, str], dict] = field(default_factory=dict)
    lines: dict[str, ClassLine] = field(default_factory=dict)
    rules_selecting_nothing: tuple[str, ...] = ()


def default_kubeconfig() -> str:
    """$KUBECONFIG (its first path), else ~/.kube/config, as kubectl does."""
    env = os.environ.get("KUBECONFIG")
    if env:
        return env.split(os.pathsep)[0]
    return str(Path.home() / ".kube" / "config")


async def read_cluster(kubeconfig: str, *, settings_namespace: str = "cozy-system",
                       timeout: float = 30.0, vm: tuple[str, str] | None = None) -> Cluster:
    """List nodes, GPU classes and devices, namespaces, quotas, VMIs (read-only) through
    `ClusterCache`, so the snapshot is built exactly as the controller builds it; with `vm`
    (namespace, name), also GET that VirtualMachine (absent, or not readable by this user:
    `Cluster.vms` lacks it). Raises ToolError naming --kubeconfig or --timeout, or the list
    that failed."""
    from k8s.cache import ClusterCache
    from k8s.errors import ApiError

    api = await open_api(kubeconfig)
    try:
        cache = ClusterCache(api, settings_namespace=settings_namespace)
        try:
            with anyio.fail_after(timeout):
                await cache.read_once()
        except TimeoutError:
            raise ToolError(f"the cluster was not read within --timeout {timeout:g} s") from None
        except ApiError as exc:
            raise ToolError(f"cannot read the cluster: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - transport errors: name the server
            raise ToolError(f"cannot reach the API server of {kubeconfig}: "
                            f"{_transport_error(exc)}"[:500]) from None
        vmis = {k: v for k, v in ((k, cache.vmis.get(k)) for k in cache.vmi_keys()) if v}
        vms = {vm: got} if vm is not None and (got := await _read_vm(api, vm, timeout)) else {}
        return Cluster(cache.view.snapshot(), set(vmis), vmis, cache.vmi_state(),
                       cache.permitted_resources(), cache.launcher_defaults(), vms,
                       published_lines(cache.classes.items()), cache.rules_selecting_nothing())
    finally:
        await api.close()


def check_kubeconfig(kubeconfig: str) -> None:
    """Raise ToolError (one line naming --kubeconfig) unless `kubeconfig` is a file holding
    a YAML mapping: a missing file, YAML that does not parse (`yaml_problem`: what the
    parser expected and where), or an empty file, plain text or a list; a mapping whose
    `clusters`, `contexts` or `users` is not a list of mappings, or has an entry whose
    `cluster`/`context`/`user` is not a mapping or holds a list or mapping where a name or
    string belongs (a context's cluster, an exec plugin's command), or whose
    `current-context` is not a name (`_misshapen`: kubernetes_asyncio fails on these with a
    Python error naming no part of the file, or an object's repr `<… object at 0x…>`); a
    current context that names a context, cluster or user the file lacks (`_unresolved`).
    What else is in the mapping is kubernetes_asyncio's to judge (`open_api`)."""
    if not Path(kubeconfig).is_file():
        raise ToolError(f"--kubeconfig: no such file {kubeconfig!r} (without the flag: "
                        f"$KUBECONFIG's first path, else ~/.kube/config)")
    try:
        with open(kubeconfig, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        from k8s.config import yaml_problem

        raise ToolError(f"--kubeconfig {kubeconfig}: not valid YAML: {yaml_problem(exc)}") from None
    if not isinstance(doc, dict):
        what = {type(None): "an empty file", str: "plain text", list: "a list"}.get(type(doc), "a single value")
        raise ToolError(f"--kubeconfig {kubeconfig}: not a kubeconfig (a mapping with clusters, "
                        f"users and contexts) but {what}")
    wrong = _misshapen(doc)
    if wrong:
        raise ToolError(f"--kubeconfig {kubeconfig}: not a kubeconfig: {wrong}")
    missing = _unresolved(doc)
    if missing:
        raise ToolError(f"--kubeconfig {kubeconfig}: not a usable kubeconfig: {missing}")


async def open_api(kubeconfig: str):
    """kubernetes_asyncio's ApiClient for `kubeconfig` (the caller closes it), after
    `check_kubeconfig`. Raises ToolError, one line naming --kubeconfig, for a file the loader
    cannot use, whatever it raises: a context naming no cluster, bad base64 or certificate
    data, an exec plugin that fails, or a value of the wrong type that trips it
    (`server: 5` raised a bare AssertionError, printed as a traceback). What the loader logs
    meanwhile is held (`_loader_log_held`): dropped when it fails (it logs the error it
    raises, `exec: process returned 1`, a line before ours), passed on when it succeeds."""
    from kubernetes_asyncio.config import new_client_from_config

    check_kubeconfig(kubeconfig)
    with _loader_log_held() as held:
        try:
            api = await new_client_from_config(config_file=kubeconfig)
        except Exception as exc:  # noqa: BLE001 - the loader's errors are any type; said in one line
            held.clear()
            said = (str(exc).splitlines() or [""])[0].strip()
            said = said or f"{type(exc).__name__} in kubernetes_asyncio's loader (a value of the wrong type?)"
            raise ToolError(f"--kubeconfig {kubeconfig}: not a usable kubeconfig: {said}"[:500]) from None
    return api


@contextmanager
def _loader_log_held() -> Iterator[list[logging.LogRecord]]:
    """Hold the records kubernetes_asyncio logs within (the list yielded) instead of letting
    them reach stderr (with no handler set up, Python's last-resort handler prints them); on
    leaving, the records still in the list are handed to its logger as they would have been.
    Meant for one command-line call at a time: the logger's `propagate` is switched off
    within."""
    logger = logging.getLogger("kubernetes_asyncio")
    held: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = held.append  # type: ignore[method-assign]
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield held
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
        for record in held:
            logger.handle(record)


def _kind_of(value: Any) -> str:
    """What a YAML value is, in words ("a number", "a list", …)."""
    return {str: "a string", int: "a number", float: "a number", bool: "a boolean",
            list: "a list", dict: "a mapping"}.get(type(value), "a single value")


_STRINGS = {"cluster": ("server", "certificate-authority", "certificate-authority-data",
                        "tls-server-name", "proxy-url"),
            "context": ("namespace",),
            "user": ("token", "tokenFile", "username", "password", "client-certificate",
                     "client-certificate-data", "client-key", "client-key-data")}
"""The single values kubernetes_asyncio reads of a cluster, context or user entry; a list or
a mapping there reaches the user as a ConfigNode's repr (`<… object at 0x…>`) or a
TypeError naming that class."""


def _misshapen(doc: Mapping[str, Any]) -> str | None:
    """The first part of kubeconfig `doc` of the wrong shape, said as "contexts[0].context is
    a number, not a mapping" or "contexts[0].context.cluster is a list, not a name"; None when
    the parts it has have the right shape (absent or null ones, and a number or a boolean
    where a string belongs, are the loader's to judge). Judged: clusters, contexts and users
    (lists of mappings), each entry's name and body (a mapping), the single values of each
    body (`_STRINGS`; a context's cluster and user are names), and a user's exec plugin and
    auth-provider (`_exec_misshapen`)."""
    current = doc.get("current-context")
    if current is not None and not isinstance(current, str):
        return f"current-context is {_kind_of(current)}, not a name"
    for part, body in (("clusters", "cluster"), ("contexts", "context"), ("users", "user")):
        entries = doc.get(part)
        if entries is None:
            continue
        if not isinstance(entries, list):
            return f"{part} is {_kind_of(entries)}, not a list"
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                return f"{part}[{i}] is {_kind_of(entry)}, not a mapping"
            if _container(entry.get("name")):
                return f"{part}[{i}].name is {_kind_of(entry['name'])}, not a name"
            value = entry.get(body)
            if value is None:
                continue
            where = f"{part}[{i}].{body}"
            if not isinstance(value, dict):
                return f"{where} is {_kind_of(value)}, not a mapping"
            names = ("cluster", "user") if body == "context" else ()
            for key in names + _STRINGS[body]:
                if _container(value.get(key)):
                    return (f"{where}.{key} is {_kind_of(value[key])}, not "
                            f"{'a name' if key in names else 'a string'}")
            if body == "user":
                wrong = _exec_misshapen(value, where)
                if wrong:
                    return wrong
    return None


def _unresolved(doc: Mapping[str, Any]) -> str | None:
    """What the current context of kubeconfig `doc` (of the right shape: `_misshapen`) needs
    and the file lacks, said as "context c names user u, which users lacks" (kubectl's
    "user not found for context"); also a context naming no user for an https server
    (kubernetes_asyncio then reads the client certificate of no user: "argument of type
    'NoneType' is not iterable"). None when all is there, or with no current context (the
    loader's to say)."""
    current = doc.get("current-context")
    if not current:
        return None
    contexts = {e.get("name"): e.get("context") for e in doc.get("contexts") or ()}
    if current not in contexts:
        return f"current-context {current} names no entry of contexts"
    context = contexts[current] or {}
    clusters = {e.get("name"): e.get("cluster") for e in doc.get("clusters") or ()}
    for key, part, known in (("cluster", "clusters", clusters),
                             ("user", "users", {e.get("name") for e in doc.get("users") or ()})):
        name = context.get(key)
        if name is not None and name not in known:
            return f"context {current} names {key} {name}, which {part} lacks"
    if context.get("cluster") is None:
        return f"context {current} names no cluster"
    server = (clusters[context["cluster"]] or {}).get("server")
    if context.get("user") is None and isinstance(server, str) and server.startswith("https"):
        return f"context {current} names no user (needed for its https server)"
    return None


def _exec_misshapen(user: Mapping[str, Any], where: str) -> str | None:
    """The first part of kubeconfig user `user` (at `where`, "users[0].user") of the wrong
    shape in its `exec` plugin (a mapping: command and apiVersion single values, args a list
    of strings, env a list of mappings of a name and a value, both strings: the loader hands
    args and env to the process as they are, where a number is a TypeError) or its
    `auth-provider` (a mapping); None when they are absent or of the right shape."""
    provider = user.get("auth-provider")
    if provider is not None and not isinstance(provider, dict):
        return f"{where}.auth-provider is {_kind_of(provider)}, not a mapping"
    plugin = user.get("exec")
    if plugin is None:
        return None
    if not isinstance(plugin, dict):
        return f"{where}.exec is {_kind_of(plugin)}, not a mapping"
    for key in ("command", "apiVersion"):
        if _container(plugin.get(key)):
            return f"{where}.exec.{key} is {_kind_of(plugin[key])}, not a string"
    args, env = plugin.get("args"), plugin.get("env")
    for key, values in (("args", args), ("env", env)):
        if values is not None and not isinstance(values, list):
            return f"{where}.exec.{key} is {_kind_of(values)}, not a list"
    for j, arg in enumerate(args or ()):   # handed to the process as they are: strings only
        if not isinstance(arg, str):
            return f"{where}.exec.args[{j}] is {_kind_of(arg)}, not a string"
    for j, pair in enumerate(env or ()):
        if not isinstance(pair, dict):
            return f"{where}.exec.env[{j}] is {_kind_of(pair)}, not a mapping of name and value"
        for key in ("name", "value"):
            if pair.get(key) is None:
                return f"{where}.exec.env[{j}] has no {key}"
            if not isinstance(pair[key], str):
                return f"{where}.exec.env[{j}].{key} is {_kind_of(pair[key])}, not a string"
    return None


def _container(value: Any) -> bool:
    """True for a list or a mapping (where a kubeconfig wants a single value)."""
    return isinstance(value, (list, dict))


def _transport_error(exc: BaseException) -> str:
    """A transport failure in one line (`k8s.errors.transport_message`)."""
    from k8s.errors import transport_message

    return transport_message(exc)


async def _read_vm(api, key: tuple[str, str], timeout: float) -> dict | None:
    """VirtualMachine `key`, or None when it does not exist, KubeVirt is not installed or the
    user may not read it (explain then resolves the name to VMIs only)."""
    from k8s import errors
    from k8s.client import VMS, KubeClient

    try:
        return await KubeClient(api, timeout=timeout).get(VMS, key[0], key[1])
    except errors.ApiError:  # 404/403/transport: no VM to explain from
        return None


def resolved_as(source: str | None, cluster: Cluster) -> str | None:
    """What `NAMESPACE/NAME` names, said for the user when a VirtualMachine is involved:
    the VM explained from its template (no VMI of that name), or the VMI a VM started
    (both exist); None for a plain VMI or a file."""
    if not source or source.count("/") != 1:
        return None
    key = tuple(source.split("/"))
    if key not in cluster.vms:
        return None
    if key in cluster.vmis:
        return (f"VirtualMachine {source} has a VMI of that name: explaining the VMI "
                "(as a re-creation of it would go)")
    return (f"VirtualMachine {source} has no VMI: explaining the VMI virt-controller "
            "creates from its spec.template")


def read_vmi_file(file: str, namespace: str | None) -> dict:
    """The first VirtualMachineInstance document of `file` (YAML or JSON; "-" is stdin), with
    `namespace` (-n) set on it when given: read before the cluster is, so bad input is refused
    first. Raises ToolError naming -f and what is wrong (unreadable, a directory, not
    YAML/JSON, no VMI, no metadata.name, no namespace)."""
    if file != "-" and Path(file).is_dir():
        raise ToolError(f"-f {file}: a directory, not a file")
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text()
        docs = [d for d in yaml.safe_load_all(text) if d]
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        from k8s.config import yaml_problem

        raise ToolError(f"-f {file}: cannot read a YAML/JSON document: {yaml_problem(exc)}") from None
    vmi = next((d for d in docs if isinstance(d, dict)
                and d.get("kind") == "VirtualMachineInstance"), None)
    if vmi is None:
        raise ToolError(f"-f {file}: no VirtualMachineInstance document in it")
    meta = vmi.setdefault("metadata", {})
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        raise ToolError(f"-f {file}: the VMI needs metadata.name")
    if namespace:
        meta["namespace"] = namespace
    if not meta.get("namespace"):
        raise ToolError(f"-f {file}: the VMI has no metadata.namespace; pass -n NAMESPACE")
    return vmi


def vmi_in_cluster(vmi: dict, file: str, namespace: str | None, cluster: Cluster) -> dict:
    """`vmi` (from `read_vmi_file`) when its namespace exists in `cluster` (else budget and
    entitlement would read as none). Raises ToolError naming the namespace and where it came
    from (-n or its metadata.namespace)."""
    ns = vmi["metadata"]["namespace"]
    if ns not in cluster.snapshot.namespaces:
        how = "-n" if namespace else "its metadata.namespace"
        raise ToolError(f"namespace {ns!r} ({how}) not found in the cluster: a VMI there "
                        f"could not be created")
    return vmi


def load_vmi(source: str | None, file: str | None, namespace: str | None,
             cluster: Cluster) -> dict:
    """The VMI to explain: from `file` (YAML or JSON, the first VirtualMachineInstance
    document; "-" is stdin) or `source` "NAMESPACE/NAME" of an existing VMI, else of a
    VirtualMachine in `cluster.vms` (the VMI virt-controller would create from its template,
    `model.vm.vmi_of_vm`; a VMI of that name wins when both exist). Raises ToolError naming
    -f or the argument."""
    if file is not None:
        return vmi_in_cluster(read_vmi_file(file, namespace), file, namespace, cluster)
    if not source or source.count("/") != 1 or not all(source.split("/")):
        raise ToolError("give the VMI as NAMESPACE/NAME, or a manifest with -f FILE")
    ns, name = source.split("/")
    vmi = cluster.vmis.get((ns, name))
    if vmi is None and (ns, name) in cluster.vms:
        return vmi_of_vm(cluster.vms[(ns, name)])
    if vmi is None:
        raise ToolError(f"no VMI or VirtualMachine {ns}/{name} found (use -f FILE for one "
                        "not created yet)")
    return vmi


def explain_vmi(cluster: Cluster, vmi: dict, *, grace: float, now: datetime,
                defrag_max_moves: int | None = None) -> Explanation:
    """`model.explain.explain` for a VMI object. Raises ToolError when its GPU annotations
    do not parse (the admission would deny it the same way) or it asks for no GPU."""
    meta = vmi["metadata"]
    ns, name = meta["namespace"], meta["name"]
    spec = vmi.get("spec") if isinstance(vmi.get("spec"), dict) else {}
    annotations = dict(meta.get("annotations") or {})
    live = cluster.vmis.get((ns, name))
    if live is not None and meta.get("uid") and (live.get("metadata") or {}).get("uid") == meta["uid"]:
        annotations.pop(ADMISSION_ANNOTATION, None)  # the webhook wrote it on this running VMI
    unknown = unknown_annotations(annotations)
    if unknown is not None:  # W1 as the webhook says it: the admission would be denied
        raise ToolError(f"VMI {ns}/{name} would be denied: {unknown.message}")
    try:
        ask = parse_vmi_request(meta.get("annotations") or {})
        tolerations = parse_tolerations(spec.get("tolerations"))
    except ParseError as exc:
        raise ToolError(f"invalid GPU annotations on VMI {ns}/{name}: {exc.field}: "
                        f"{exc.problem}") from None
    if ask is None:
        raise ToolError(f"VMI {ns}/{name} asks for no GPU device (no gpu.cozystack.io/devices "
                        "or gpu.cozystack.io/templates annotation): gpu-binder admits it as is")
    return explain(cluster.snapshot, ns, name, ask,
                   live_vmis=cluster.vmi_state if cluster.vmi_state is not None
                   else cluster.live_vmis, now=now,
                   grace=timedelta(seconds=grace), node_selector=node_selector_of(vmi, cluster.launcher),
                   tolerations=tolerations, permitted=cluster.permitted, vmi_object=vmi,
                   **({} if defrag_max_moves is None else {"defrag_max_moves": defrag_max_moves}))


# --- rendering -------------------------------------------------------------------------------


def to_jsonable(value: Any) -> Any:
    """Dataclasses, enums, tuples and datetimes as plain JSON values (dicts keep field names;
    a dataclass's `message` property is added as "message"; a field marked `omit_empty`
    in its metadata, device mode's parts, is left out when empty). A `model.reasons.Reason` is
    {"code", "category", "message", and its data}."""
    if isinstance(value, Reason):
        data = {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"code": value.code.value, "category": value.category.value,
                "message": value.render(), **data}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)
               if not (f.metadata.get("omit_empty") and not getattr(value, f.name))}
        if isinstance(getattr(type(value), "message", None), property):
            out["message"] = value.message
        return out
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    return value


def _moves(moves) -> str:
    binds = [m.device[1] for m in moves if m.from_node is None]
    moved = [f"{m.device[1]} from {m.from_node}" for m in moves if m.from_node is not None]
    parts = ([f"bind {', '.join(binds)}"] if binds else []) + (
        [f"move {', '.join(moved)}"] if moved else [])
    return "; ".join(parts) or "nothing to change"


def _units(pairs) -> str:
    """`n × resource` per pair, the resource as messages name it (`resource_label`: a
    device-mode class's quota key reads "<DeviceClass> devices")."""
    return ", ".join(f"{n} × {resource_label(r)}" for r, n in pairs)


def kept_lines(e: Explanation) -> list[str]:
    """H4: for a set kept for its VM (the VMI explained is that VM's next one), where and
    until when (`Explanation.kept`)."""
    return [f"kept: {', '.join(k.devices)} on {k.node} for VirtualMachine {k.namespace}/{k.vm} "
            f"until {format_time(k.until)} (keepSetFor): its next VMI takes them there"
            for k in e.kept]


def set_classes(cluster: Cluster, vmi: dict) -> tuple[str, ...]:
    """The classes of `vmi`'s set, first asked first: its templates' and its held devices'
    (as the cluster has them; a held device not found is left out). Empty when the
    annotations do not parse (explain refuses such a VMI first)."""
    meta = vmi.get("metadata") or {}
    try:
        ask = parse_vmi_request(meta.get("annotations") or {})
    except ParseError:
        return ()
    if ask is None:
        return ()
    ns = meta.get("namespace") or ""
    held = [d.class_name for name in ask.held if (d := cluster.snapshot.device(ns, name)) is not None]
    return tuple(dict.fromkeys([*held, *(c for c, n in ask.templates if n > 0)]))


def waits_in_line(e: Explanation, classes: tuple[str, ...]) -> tuple[str, ...]:
    """P5: the classes whose line a create of this set would wait in now: `classes` when the
    admission would refuse it for room only (`model.line.waits_for_room`), else ()."""
    if e.admitted or e.reason is None or not waits_for_room(e.reason):
        return ()
    return classes


def line_lines(e: Explanation, classes: tuple[str, ...] = (), published: Published | None = None) -> list[str]:
    """explain's P5 lines. The line lives in the leader's coordinator, which publishes each
    class's length and first sets in its GPUClass's `status.line` (`k8s.line_status`):
    `published` is what those say of this set (`model.line_status.place_in`). With the set's
    place (`e.line`: given to `model.explain.explain`, or the published one put there) it
    says the place and the sets ahead, and for a class whose published sets stop before it,
    that it is further back, with the length. Else, for a set refused for room only, which
    lines a create now would wait in and what the published lines say of them (or, none
    published, where the leader says the position: its refusals and metrics)."""
    beyond = published.beyond if published is not None else ()
    if e.line is not None:
        return [f"line: {e.line.render()}"] + [f"line: {b.render()}" for b in beyond
                                               if b.length > b.shown]
    waiting = waits_in_line(e, classes)
    if not waiting:
        return []
    out = [f"line: refused for room only: a create now waits in the line of class "
           f"{', '.join(waiting)} (P5; higher priority first, then first refused first)"]
    if beyond:
        return out + [f"  {b.render()}" if b.length > b.shown else
                      f"  the line of class {b.class_name}: {b.length} waiting (GPUClass status.line), "
                      "this set not among them" for b in beyond]
    return out + ["  the line is the leader's, in its memory: its refusals behind_in_line and "
                  "node_reserved (the create's 503 and the VM's FailedCreate Events) name the set "
                  "ahead and its position; gpu_binder_line_length{class} on its /metrics counts each "
                  "line; nobody waits in it as the leader last published it (GPUClass status.line)"]


def render_explain(e: Explanation, *, max_nodes: int = 50, classes: tuple[str, ...] = (),
                   published: Published | None = None) -> str:
    """The text of `gpu-binder explain`: verdict, set-level problems, one line per node
    serving the set's classes or holding a member (at most `max_nodes`, chosen, eligible
    and holding nodes first; the others counted), the smallest changes."""
    out = [f"VMI {e.namespace}/{e.vmi}: {len(e.devices)} device"
           f"{'s' if len(e.devices) != 1 else ''} ({', '.join(e.devices)})"]
    if e.admitted:
        out.append(f"verdict: admitted on {e.node} ({e.rule}): {_moves(e.moves)}")
    else:
        out.append(f"verdict: refused: {e.message}")
    for p in e.set_problems:
        out.append(f"  whatever the node: {p}")
    for line in kept_lines(e):  # H4
        out.append(line)
    out += lost_lines(e)  # HL3
    out += tainted_lines(e)  # HL1
    out += line_lines(e, classes, published)  # P5
    out.append("nodes:")
    unserving = [v for v in e.nodes if not v.holds
                 and any(r.code is Code.CLASSES_NOT_SERVED for r in v.reasons)]
    skip = {v.node for v in unserving}
    ranked = sorted((v for v in e.nodes if v.node not in skip),
                    key=lambda v: (not v.chosen, not v.fits, -v.holds, v.node))
    width = max((len(v.node) for v in ranked), default=4)
    for v in ranked[:max_nodes]:
        held = f" (holds {v.holds})" if v.holds else ""
        if v.fits:
            what = "fits, chosen" if v.chosen else "fits"
        else:
            what = "no: " + "; ".join(r.render() for r in v.reasons)
        out.append(f"  {v.node:<{width}}  {what}{held}")
        out += _device_lines(e, v, width)
    if len(ranked) > max_nodes:
        out.append(f"  … and {len(ranked) - max_nodes} more nodes (--json lists all)")
    if unserving:
        many = len(unserving) != 1
        out.append(f"  ({len(unserving)} other node{'s' if many else ''} "
                   f"{'do' if many else 'does'} not serve the set's classes; --json lists all)")
    if e.budget_short:
        out.append(f"budget: short by {_units(e.budget_short)} (raise the tenant's quota "
                   "or release Bound devices)")
    if e.shortfalls:
        out.append("smallest change that would make it fit:")
        for s in e.shortfalls[:5]:
            steps = []
            if s.uncordon:
                steps.append("uncordon it")
            if s.idle:
                movable = [f"{ns}/{name} to {to}" for (ns, name), to in s.idle if to]
                stuck = [f"{ns}/{name}" for (ns, name), to in s.idle if not to]
                if movable:
                    steps.append("move idle " + ", ".join(movable))
                if stuck:
                    steps.append("release idle " + ", ".join(stuck) + " (no room elsewhere)")
            if s.short:
                steps.append(f"add or free {_units(s.short)}")
            missing = f" ({_units(s.missing)} missing)" if s.missing else ""
            out.append(f"  {s.node}{missing}: {'; then '.join(steps)}")
            for (ns, vmi), n, freed in s.awaiting:
                out.append(f"    ({n} device{'s' if n != 1 else ''} there attached to VMI "
                           f"{ns}/{vmi}, not seen yet: an admission in progress or a failed "
                           f"create; housekeeping frees {'them' if n != 1 else 'it'} at "
                           f"{format_time(freed)} unless it appears)")
    if e.after_defrag is not None:
        moves = e.after_defrag.plan.moves
        out.append(f"after a defragmentation ({len(moves)} move{'s' if len(moves) != 1 else ''}"
                   f") it would fit on {e.after_defrag.node}:")
        out += [f"  {_defrag_step(m, 'idle ')}" for m in moves]
        out.append("  (the binder makes such rounds with --defrag-interval; "
                   "`gpu-binder defrag --plan` shows the round)")
    return "\n".join(out)


def _device_lines(e: Explanation, v, width: int) -> list[str]:
    """Device mode (DR2-DR4) under a node's line of `explain`: per device-mode class of the
    set its free devices and groups, and, on the chosen node, the devices the set takes;
    nothing in count mode."""
    view = next((x for x in e.device_nodes if x.node == v.node), None)
    if view is None:
        return []
    pad = " " * (width + 4)
    lines = [f"{c.class_name}: {c.render()}" for c in view.classes]
    if v.chosen:
        lines += [f"{c} takes {what}" for c, what in view.takes]
    return [pad + line for line in lines]


def _takes(o) -> str:
    """Device mode: "; h100x takes gpu-vfio-4, … (modules 5-8)" for a what-if outcome."""
    return "".join(f"; {c} {'keeps' if o.action == 'stay' else 'takes'} {what}"
                   for c, what in o.takes)


def _where(node: str, ref) -> str:
    """A move's end: the node, and in device mode the device recorded there."""
    return node if ref is None else f"{node}/{ref.device}"


def _arrow(m) -> str:
    """"n1 -> n2", device mode "n1/gpu-vfio-0 -> n2/gpu-vfio-5"; a re-point (DR4) "n1:
    gpu-vfio-0 -> gpu-vfio-6 (re-point)"."""
    if m.repoint:
        return f"{m.from_node}: {m.from_device.device} -> {m.to_device.device} (re-point)"
    return f"{_where(m.from_node, m.from_device)} -> {_where(m.to_node, m.to_device)}"


def _defrag_step(m, idle: str = "") -> str:
    """explain's line for one step of the round: "move idle t/g from n1 to n2" (device mode
    with the devices), "re-point idle t/g on n1 from gpu-vfio-0 to gpu-vfio-6"."""
    ns, name = m.device
    if m.repoint:
        return (f"re-point {idle}{ns}/{name} on {m.from_node} from {m.from_device.device} "
                f"to {m.to_device.device}")
    return (f"move {idle}{ns}/{name} from {_where(m.from_node, m.from_device)} "
            f"to {_where(m.to_node, m.to_device)}")


def render_defrag(plan: DefragPlan, max_moves: int) -> str:
    """The text of `gpu-binder defrag --plan`: the moves, then per class the largest
    placeable set (devices, and nodes with room for it) before and after."""
    n = len(plan.moves)
    out = [f"defragmentation round (at most {max_moves} move{'s' if max_moves != 1 else ''}): "
           + (f"{n} move{'s' if n != 1 else ''}" if n else
              "nothing to move (no move of idle held devices grows a class's largest set "
              "without shrinking another's)")]
    out += [f"  {m.device[0]}/{m.device[1]} ({m.class_name}): {_arrow(m)}"
            f"  ({'on' if m.repoint else 'frees'} {m.cleared}: largest {m.for_class} set "
            f"{m.before} -> {m.after})"
            for m in plan.moves]
    rows = [("CLASS", "RESOURCE", "LARGEST BEFORE", "AFTER")]
    for b, a in zip(plan.before, plan.after):
        rows.append((b.class_name, b.resource, f"{b.size} on {b.nodes} node{'s' * (b.nodes != 1)}",
                     f"{a.size} on {a.nodes} node{'s' * (a.nodes != 1)}"))
    out.append("")
    out += _table(rows) if len(rows) > 1 else ["no GPU class"]
    return "\n".join(out)


def render_what_if(w: WhatIf) -> str:
    """The text of `gpu-binder what-if`: one line per held set, then the stranded VMIs."""
    out = [f"what if {w.mode} {' '.join(w.nodes)}: {len(w.outcomes)} held "
           f"set{'s' if len(w.outcomes) != 1 else ''} on {'them' if len(w.nodes) > 1 else 'it'}"]
    for o in w.outcomes:
        s = o.set
        who = (f"{s.namespace}/{s.vmi} ({'running' if s.running else 'stopped'})" if s.vmi
               else f"{s.namespace} idle devices")
        devs = " + ".join([", ".join(s.held)] * bool(s.held)
                          + [f"{n} new {c}" for c, n in s.templates])
        if o.action == "stay":
            what = (f"stays on {o.node} ({o.rule}){_takes(o)}; the VMI waits for the cordon "
                    "to lift")
        elif o.action == "move":
            what = f"moves to {o.node} ({o.rule}): {_moves(o.moves)}{_takes(o)}"
        else:
            what = "refused: " + o.message
        if w.mode == "cordon" and s.running:
            what = "keeps running; on its next admission " + what
        out.append(f"  {who} on {s.node} [{devs}]: {what}{'  STRANDED' if o.stranded else ''}")
    if w.mode == "drain":
        out.append("evicted: " + (", ".join(f"{ns}/{n}" for ns, n in w.evicted) or "none"))
    out.append("stranded: " + (", ".join(f"{ns}/{n}" for ns, n in w.stranded) or "none"))
    return "\n".join(out)


def render_top(t: Top, lines: Mapping[str, ClassLine] | None = None,
               rules_selecting_nothing: tuple[str, ...] = ()) -> str:
    """The text of `gpu-binder top`: a table per class and node, class totals with the
    largest placeable set, the DeviceTaintRules that select no published device
    (`rules_selecting_nothing`, names), the waiting line of each class (`lines`, as the
    leader published them, P5), then tenant budgets."""
    kept = bool(t.kept) or any(c.kept for c in t.classes)  # H4: a KEPT column only then
    rows = [("CLASS", "NODE", "ALLOC", "BOUND", "ATTACHED", "AWAITING", *(("KEPT",) * kept),
             "IDLE", "FREE", "LARGEST")]
    for c in t.classes:
        for n in c.nodes:
            rows.append((c.class_name, n.node + (" (cordoned)" if n.cordoned else ""),
                         str(n.allocatable), str(n.bound), str(n.attached), str(n.awaiting),
                         *((str(n.kept),) * kept), str(n.idle), str(n.free), str(n.largest)))
        total = f"= all ({resource_label(c.resource)})" if c.resource else "= all (no resource)"
        rows.append((c.class_name, total, "", str(c.bound), str(c.attached),
                     str(c.awaiting), *((str(c.kept),) * kept), str(c.idle), str(c.free),
                     str(c.largest)))
    out = _table(rows)
    out += [f"NOT READY: class {c.class_name} cannot serve: {c.problem} (its VMIs are refused "
            f"with this)" for c in t.classes if c.problem]
    if t.kept:
        out.append("")
        out += _table([("KEPT FOR VM", "NODE", "DEVICES", "UNTIL")] + [
            (f"{k.namespace}/{k.vm}", k.node, ", ".join(k.devices), format_time(k.until))
            for k in t.kept])
        out.append("KEPT: Bound for a stopped VirtualMachine (GPUClass keepSetFor); its next "
                   "VMI starts there; deleting the VM releases them")
    if any(c.awaiting for c in t.classes):
        out.append("AWAITING: attached to a VMI not seen yet (an admission in progress, or a "
                   "create that failed; housekeeping frees it after --attachment-grace)")
    out += _block_lines(t)
    out += device_total_lines(t)  # HL3
    out += [f"RULE SELECTS NOTHING: DeviceTaintRule {name} selects no device a ResourceSlice "
            f"publishes: it taints nothing and changes no placement (check its deviceSelector's "
            f"driver, pool and device; docs/troubleshooting.md)" for name in rules_selecting_nothing]
    out += line_table(lines or {})
    out.append("")
    trows = [("TENANT", "RESOURCE", "USED", "BUDGET")]
    for x in t.tenants:
        trows.append((x.namespace, x.resource, str(x.used), "none" if x.hard is None else str(x.hard)))
    out += _table(trows) if len(trows) > 1 else ["no tenant holds a device or has a budget"]
    return "\n".join(out)


def line_table(lines: Mapping[str, ClassLine]) -> list[str]:
    """`top`'s waiting lines (P5), one table row per set shown, by class then position, and
    per class its length and the longest wait (GPUClass `status.line`, as the leader last
    published it); nothing when nobody waits."""
    if not lines:
        return []
    rows = [("LINE", "POS", "SET", "KIND", "PRIORITY", "GPUS", "WAITING SINCE", "RESERVED")]
    notes = []
    for c in sorted(lines):
        cl = lines[c]
        for w in cl.shown:
            rows.append((c, str(w.position), f"{w.namespace}/{w.name}",
                         "VM" if w.kind == "VirtualMachine" else "VMI",
                         f"{w.priority}" + (f" {w.priority_class}" if w.priority_class else ""),
                         str(w.gpus), format_time(w.since), w.reserved or ""))
        more = f", the first {len(cl.shown)} shown" if cl.length > len(cl.shown) else ""
        notes.append(f"LINE {c}: {cl.length} waiting, the longest since {format_time(cl.oldest)}{more}")
    return ["", *_table(rows), *notes]


def _block_lines(t: Top) -> list[str]:
    """Device mode (DR3) after `top`'s table: per device-mode class and node its groups
    (whole free partitions per size as free/all, or free/all devices per group); nothing in
    count mode."""
    if not t.blocks:
        return []
    width = max(len(f"{b.class_name} {b.node}") for b in t.blocks)
    out = ["", "DEVICE GROUPS (free/all; LARGEST above: the largest set one free group takes)"]
    for b in t.blocks:
        text = b.render() or "no topology constraint"
        out.append(f"{b.class_name + ' ' + b.node:<{width}}  {text}")
    return out


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


# --- the commands ----------------------------------------------------------------------------


def run(args) -> int:
    """Entry of `explain`, `defrag`, `what-if`, `top` (argparse namespace from `cli.main`). Log lines
    (a malformed object skipped) go to the stderr of the moment, so stdout stays the
    answer; the logging configuration is restored afterwards."""
    prog = getattr(args, "prog", "gpu-binder")
    saved = structlog.get_config()
    structlog.configure(logger_factory=lambda *_: structlog.PrintLogger(sys.stderr),
                        cache_logger_on_first_use=False)
    try:
        return anyio.run(_run, args)
    except ToolError as exc:
        if getattr(args, "json", False):  # a script reading stdout gets JSON either way
            print(json.dumps({"error": str(exc)}))
        print(f"{prog} {args.command}: {exc}", file=sys.stderr)
        return 2
    finally:
        structlog.configure(**saved)


async def _run(args) -> int:
    if not args.timeout > 0:  # NaN too
        raise ToolError(f"--timeout must be > 0 seconds, got {args.timeout:g}")
    if args.command == "explain":  # bad input is refused before the cluster is read
        if not args.attachment_grace > 0:
            raise ToolError(f"--attachment-grace must be > 0 seconds, got {args.attachment_grace:g}")
        if (args.vmi is None) == (args.filename is None):
            raise ToolError("give either NAMESPACE/NAME or -f FILE")
        if args.defrag_max_moves < 1:
            raise ToolError(f"--defrag-max-moves must be at least 1, got {args.defrag_max_moves}")
        if args.vmi is not None and (args.vmi.count("/") != 1 or not all(args.vmi.split("/"))):
            raise ToolError("give the VMI as NAMESPACE/NAME, or a manifest with -f FILE")
        if args.filename not in (None, "-") and not Path(args.filename).exists():
            raise ToolError(f"-f {args.filename}: no such file")
    if args.command == "defrag" and args.max_moves < 1:
        raise ToolError(f"--max-moves must be at least 1, got {args.max_moves}")
    manifest = (read_vmi_file(args.filename, args.namespace)
                if args.command == "explain" and args.filename is not None else None)
    vm = (tuple(args.vmi.split("/")) if args.command == "explain" and args.vmi
          and args.vmi.count("/") == 1 else None)
    cluster = await read_cluster(args.kubeconfig, settings_namespace=args.settings_namespace,
                                 timeout=args.timeout, vm=vm)
    now = datetime.now(timezone.utc)
    if args.command == "explain":
        vmi = (vmi_in_cluster(manifest, args.filename, args.namespace, cluster)
               if manifest is not None else load_vmi(args.vmi, None, args.namespace, cluster))
        e = explain_vmi(cluster, vmi, grace=args.attachment_grace, now=now,
                        defrag_max_moves=args.defrag_max_moves)
        note = resolved_as(args.vmi, cluster)
        classes = set_classes(cluster, vmi)
        published = place_in(cluster.lines, e.namespace, e.vmi, classes)  # P5: status.line
        if e.line is None and published.place is not None:
            e = dataclasses.replace(e, line=published.place)
        if args.json:
            out = to_jsonable(e)
            if note:
                out["resolved"] = note
            if waits_in_line(e, classes):
                out["waits_in_line"] = list(waits_in_line(e, classes))  # P5: the leader's line
            if any(b.length > b.shown for b in published.beyond):
                out["line_beyond"] = [to_jsonable(b) for b in published.beyond if b.length > b.shown]
            print(json.dumps(out, indent=2))
        else:
            print((note + "\n" if note else "") + render_explain(e, classes=classes, published=published))
        return 0 if e.admitted else 1
    if args.command == "what-if":
        try:
            w = what_if(cluster.snapshot, args.mode, args.nodes, live_vmis=cluster.live_vmis,
                        now=now)
        except ValueError as exc:
            raise ToolError(f"NODE: {exc}") from None
        print(json.dumps(to_jsonable(w), indent=2) if args.json else render_what_if(w))
        return 0
    if args.command == "defrag":
        plan = plan_round(cluster.snapshot, max_moves=args.max_moves)
        print(json.dumps(to_jsonable(plan), indent=2) if args.json
              else render_defrag(plan, args.max_moves))
        return 0
    t = top(cluster.snapshot, cluster.live_vmis)
    if args.json:
        print(json.dumps({**to_jsonable(t), "lines": [to_jsonable(cluster.lines[c])
                                                     for c in sorted(cluster.lines)],
                          "rules_selecting_nothing": list(cluster.rules_selecting_nothing)},
                         indent=2))
    else:
        print(render_top(t, cluster.lines, cluster.rules_selecting_nothing))
    return 0
