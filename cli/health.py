"""`gpu-binder health` (also `kubectl gpu health`): the GPUs the binder suspects broken
(docs/contract.md §3b HL2, docs/device-mode.md), and `health clear DEVICE` to lift one.

`health` reads the binder's DeviceTaintRules (label `gpu.cozystack.io/suspect=true`,
`resource.k8s.io/v1beta2`) and the entries of its ConfigMap `gpu-suspects` (where rules are
not served) with the user's kubeconfig and prints each suspect with its evidence: the VMIs
that failed to start on it, when, and why. `health clear DEVICE` (DEVICE: "node/device",
"pool/device", "driver/pool/device" or the rule's name) deletes that rule (with its uid as
precondition) or removes that entry, then records a Normal Event `GPUSuspicionCleared` on
the node naming the user of the kubeconfig's current context. Count-mode suspicions are
Events only (`GPUSuspected` on the node): nothing to list or clear here.

A kubeconfig without the right to read one source (403: `list` on DeviceTaintRules, `get` on
the ConfigMap) gets one line on stderr naming that right (verb, resource, namespace) and the
suspects of the other source.

Exit codes: 0 done (with what could be read); 1 neither source could be read (403 on both);
2 bad input (a DEVICE that cannot name a device, e.g. "a/b/c/d", is refused before the cluster
is asked), a device that is not suspected, or the cluster could not be read or written (one
line on stderr naming what).
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from typing import Any

import anyio
import yaml

from cli.tools import ToolError, _transport_error, default_kubeconfig, open_api
from model.health_mark import (MARKS_CONFIGMAP, SUSPECT_KEY, Mark, find_mark, is_device_name,
                               parse_marks, parse_rule_mark)
from model.serialize import format_time

__all__ = ["NothingReadable", "default_kubeconfig", "kubeconfig_user", "missing_right", "render_health", "run"]


def kubeconfig_user(kubeconfig: str) -> tuple[str, str]:
    """(user, context) of the kubeconfig's current context: the names the file gives (the
    `user` entry of the context, e.g. "admin"); ("unknown", "") when it says none."""
    try:
        with open(kubeconfig, encoding="utf-8") as f:
            doc = yaml.safe_load(f) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return ("unknown", "")
    if not isinstance(doc, dict):
        return ("unknown", "")
    current = doc.get("current-context") or ""
    for ctx in doc.get("contexts") or ():
        if isinstance(ctx, dict) and ctx.get("name") == current:
            user = (ctx.get("context") or {}).get("user")
            return (str(user) if user else "unknown", str(current))
    return ("unknown", str(current))


def render_health(marks: tuple[Mark, ...]) -> str:
    """The text of `gpu-binder health`: one block per suspect, its evidence indented."""
    if not marks:
        return ("no suspected GPUs (device mode; count-mode suspicions are Warning Events "
                "GPUSuspected on nodes)")
    lines = []
    for m in marks:
        since = format_time(m.suspected_at) if m.suspected_at else "?"
        where = (f"DeviceTaintRule {m.name}" if m.kind == "DeviceTaintRule"
                 else f"ConfigMap {MARKS_CONFIGMAP} entry {m.name}: kube-scheduler cannot see it")
        lines.append(f"{m.device}  node {m.node or '?'}  class {m.class_name or '?'}  "
                     f"suspected {since}  ({where})")
        for f in m.evidence:
            lines.append(f"  {f.namespace}/{f.vmi}  {format_time(f.at)}  {f.why}")
        lines.append(f"  lift: gpu-binder health clear {m.node}/{m.device.device}"
                     if m.node else f"  lift: gpu-binder health clear {m.device}")
    return "\n".join(lines)


def _jsonable(m: Mark) -> dict[str, Any]:
    return {"device": {"driver": m.device.driver, "pool": m.device.pool, "device": m.device.device},
            "node": m.node, "class": m.class_name, "mark": {"kind": m.kind, "name": m.name},
            "suspectedAt": format_time(m.suspected_at) if m.suspected_at else None,
            "evidence": [{"namespace": f.namespace, "vmi": f.vmi, "uid": f.uid,
                          "at": format_time(f.at), "why": f.why} for f in m.evidence]}


class NothingReadable(Exception):
    """Neither source of marks could be read (the kubeconfig's user may read neither): the
    message names each missing right; `health` exits 1."""


def missing_right(verb: str, resource: str, namespace: str | None, name: str | None = None) -> str:
    """The line `health` prints for a source its kubeconfig may not read (403): the verb,
    the resource (plural.group) and where, and what is therefore not shown."""
    where = f"in namespace {namespace}" if namespace else "cluster-wide"
    which = f" ({name})" if name else ""
    shown = ("suspects marked by DeviceTaintRules are not shown" if resource.startswith("devicetaintrules")
             else "suspects marked there (where DeviceTaintRules are not served) are not shown")
    return (f"no right to {verb} {resource} {where}{which} with this kubeconfig: {shown}")


def _warn(line: str) -> None:
    print(f"gpu-binder health: {line}", file=sys.stderr)


async def _marks(api, namespace: str) -> tuple[tuple[Mark, ...], dict[str, dict], dict | None]:
    """(marks, the rules by name, the ConfigMap or None). A DeviceTaintRule API that is not
    served reads as none. A source the kubeconfig may not read (403: `list` on
    `devicetaintrules.resource.k8s.io`, `get` on the ConfigMap `gpu-suspects` in
    `namespace`) prints one line on stderr naming the missing right (`missing_right`) and
    reads as none; both forbidden raises NothingReadable. Any other failure raises its
    `k8s.errors.ApiError`."""
    from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi

    from k8s.errors import Forbidden, NotFound, translate

    denied: list[str] = []
    rules: dict[str, dict] = {}
    try:
        got = await CustomObjectsApi(api).list_cluster_custom_object(
            "resource.k8s.io", "v1beta2", "devicetaintrules", label_selector=f"{SUSPECT_KEY}=true")
        rules = {r["metadata"]["name"]: r for r in got.get("items") or ()}
    except Exception as exc:  # noqa: BLE001 - translated; 404: not served; 403: said, skipped
        err = translate(exc, "list DeviceTaintRules")
        if isinstance(err, Forbidden):
            denied.append(missing_right("list", "devicetaintrules.resource.k8s.io", None))
            _warn(denied[-1])
        elif not isinstance(err, NotFound):
            raise err from None
    cm: dict | None = None
    try:
        cm = api.sanitize_for_serialization(
            await CoreV1Api(api).read_namespaced_config_map(MARKS_CONFIGMAP, namespace))
    except Exception as exc:  # noqa: BLE001 - translated; 404: no marks there; 403: said, skipped
        err = translate(exc, f"read ConfigMap {namespace}/{MARKS_CONFIGMAP}")
        if isinstance(err, Forbidden):
            denied.append(missing_right("get", "configmaps", namespace, MARKS_CONFIGMAP))
            _warn(denied[-1])
        elif not isinstance(err, NotFound):
            raise err from None
    if len(denied) == 2:
        raise NothingReadable("nothing could be read: " + "; ".join(denied))
    found = [m for m in map(parse_rule_mark, rules.values()) if m is not None]
    found += parse_marks(cm)
    return tuple(sorted(found, key=lambda m: (m.name, m.kind))), rules, cm


async def _clear(api, mark: Mark, rules: dict[str, dict], cm: dict | None, namespace: str,
                 user: str, context: str) -> None:
    from kubernetes_asyncio.client import CoreV1Api

    from k8s import events
    from k8s.client import DEVICE_TAINT_RULES, KubeClient

    client = KubeClient(api, timeout=10.0, field_manager="gpu-binder-cli")
    if mark.kind == "DeviceTaintRule":
        uid = (rules[mark.name].get("metadata") or {}).get("uid")
        await client.delete(DEVICE_TAINT_RULES, None, mark.name, uid=uid)
    else:
        assert cm is not None
        body = dict(cm)
        body["data"] = {k: v for k, v in (cm.get("data") or {}).items() if k != mark.name}
        from k8s.errors import translate
        try:
            await CoreV1Api(api).replace_namespaced_config_map(MARKS_CONFIGMAP, namespace, body,
                                                               field_manager="gpu-binder-cli")
        except Exception as exc:  # noqa: BLE001 - translated (a stale read: Conflict)
            raise translate(exc, f"replace ConfigMap {namespace}/{MARKS_CONFIGMAP}") from None
    who = f"{user} (kubeconfig context {context})" if context else user
    body = events.event_body({"apiVersion": "v1", "kind": "Node", "name": mark.node or mark.device.pool,
                              "namespace": "default", "uid": mark.node or mark.device.pool},
                             reason="GPUSuspicionCleared",
                             message=(f"suspicion of GPU {mark.device} lifted by {who} with "
                                      f"`gpu-binder health clear`: {mark.kind} {mark.name} removed; "
                                      f"its {len(mark.evidence)} failed starts no longer count"),
                             warning=False, instance="cli", when=datetime.now(timezone.utc))
    body["involvedObject"]["namespace"] = ""
    await client.create_event("default", body)


async def _run(args) -> int:
    from k8s.errors import ApiError

    api = await open_api(args.kubeconfig)
    try:
        try:
            with anyio.fail_after(args.timeout):
                marks, rules, cm = await _marks(api, args.settings_namespace)
                if args.action != "clear":
                    print(json.dumps([_jsonable(m) for m in marks], indent=2) if args.json
                          else render_health(marks))
                    return 0
                mark = find_mark(marks, args.device)
                if mark is None:
                    known = ", ".join(f"{m.node}/{m.device.device}" for m in marks) or "none"
                    raise ToolError(f"{args.device} is not suspected (suspected: {known})")
                user, context = kubeconfig_user(args.kubeconfig)
                await _clear(api, mark, rules, cm, args.settings_namespace, user, context)
        except TimeoutError:
            raise ToolError(f"the cluster was not read within --timeout {args.timeout:g} s") from None
        except ApiError as exc:
            if exc.status == 0:  # no response: a transport failure, worded as top words it
                raise ToolError(f"cannot reach the API server of {args.kubeconfig}: "
                                f"{exc.message}"[:500]) from None
            raise ToolError(f"cannot {'clear' if args.action else 'read'} the suspects: {exc}") from None
        except (ToolError, NothingReadable):
            raise
        except Exception as exc:  # noqa: BLE001 - transport errors: name the server
            raise ToolError(f"cannot reach the API server of {args.kubeconfig}: "
                            f"{_transport_error(exc)}"[:500]) from None
    finally:
        await api.close()
    shown = f"{mark.node}/{mark.device.device}" if mark.node else str(mark.device)
    if args.json:
        print(json.dumps({"cleared": _jsonable(mark), "by": user}, indent=2))
    else:
        print(f"cleared {shown} ({mark.kind} {mark.name}); recorded as lifted by {user}")
    return 0


def _refuse_bad_input(args) -> None:
    """Raise ToolError for input no cluster could make sense of, before the kubeconfig is
    read: --timeout not > 0, a DEVICE without `clear`, `clear` without a DEVICE, or a DEVICE
    that cannot name a device (`model.health_mark.is_device_name`: "a/b/c/d", spaces,
    capitals, an empty part, too long)."""
    if not args.timeout > 0:  # NaN too
        raise ToolError(f"--timeout must be > 0 seconds, got {args.timeout:g}")
    if args.action is None and args.device is not None:
        raise ToolError(f"unknown action {args.device!r}: give `health` or `health clear DEVICE`")
    if args.action == "clear" and not args.device:
        raise ToolError("health clear: give the DEVICE to lift (node/device, pool/device, "
                        "driver/pool/device or the rule's name; `gpu-binder health` lists them)")
    if args.action == "clear" and not is_device_name(args.device):
        shown = args.device if len(args.device) <= 80 else args.device[:80] + "…"
        raise ToolError(f"health clear: DEVICE {shown!r} cannot name a device: give node/device, "
                        f"pool/device or driver/pool/device (lowercase DNS names: a-z, 0-9, '-', "
                        f"'.'; the device at most 63 characters, e.g. hgx-node-01/gpu-vfio-3) or "
                        f"the rule's name (`gpu-binder health` lists them)")


def run(args) -> int:
    """Entry of `health` (argparse namespace from `cli.main`): exit 0 done (some source of
    marks forbidden to the kubeconfig: one line on stderr each, the rest shown), 1 neither
    source could be read (403 on both), 2 bad input, a device not suspected, or the cluster
    not readable (one line on stderr)."""
    from pathlib import Path

    prog = getattr(args, "prog", "gpu-binder")
    try:
        _refuse_bad_input(args)
        if not Path(args.kubeconfig).is_file():
            raise ToolError(f"--kubeconfig: no such file {args.kubeconfig!r} (without the flag: "
                            f"$KUBECONFIG's first path, else ~/.kube/config)")
        return anyio.run(_run, args)
    except NothingReadable as exc:  # each missing right is already on stderr
        if getattr(args, "json", False):
            print(json.dumps({"error": str(exc)}))
        return 1
    except ToolError as exc:
        if getattr(args, "json", False):
            print(json.dumps({"error": str(exc)}))
        print(f"{prog} health: {exc}", file=sys.stderr)
        return 2
