"""What a binder's decision says (docs/contract.md §3 B1, B5-B7): its refusal of a set,
`SetRefused` (every listed device with its node, `DeviceAt`, then the reasons; the request
named by `RequestRef`), and the wording of a Succeeded decision (`Placed`, `AlreadyPlaced`,
`KeptCordoned`, `Resumed`), which carries no code (it is not a reason to refuse); `Outcome`
is either. Also the names W1 gives the template devices it judges before they exist
(`new_device_name`, `new_device_class`).

Pure; imports only `model.reasons.codes`.
"""

from __future__ import annotations

from dataclasses import dataclass

from model.reasons.codes import Category, Code, Reason, plural


# --- the binder's refusal of a set (B1) --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestRef:
    """Names a request in messages: "<namespace>/<vmi> request <id>"."""
    namespace: str
    vmi: str
    request_id: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.vmi} request {self.request_id}"


@dataclass(frozen=True, slots=True)
class DeviceAt:
    """A listed device as a refusal names it: Bound on `node`, Pending (`node` None), or
    not found (`found` False)."""
    name: str
    node: str | None = None
    found: bool = True

    def __str__(self) -> str:
        if not self.found:
            return f"{self.name} (not found)"
        return f"{self.name} (Bound on {self.node})" if self.node else f"{self.name} (Pending)"


def new_device_name(class_name: str, n: int) -> str:
    """The name W1 gives the `n`th (from 1) template device of `class_name` it judges before
    the device exists ("new <class> #<n>": no Kubernetes name has a space)."""
    return f"new {class_name} #{n}"


def new_device_class(name: str) -> str | None:
    """The class of a name `new_device_name` made, else None."""
    if not name.startswith("new "):
        return None
    cls, sep, n = name[4:].rpartition(" #")
    return cls if sep and n.isdigit() else None


def _devices_head(devices: tuple[DeviceAt, ...]) -> str:
    """The devices a set refusal lists: held ones by name and where they are; the template
    devices W1 judges (`new_device_name`) as "<n> new <class> device(s)", so a set of 8 new
    GPUs reads as one phrase."""
    if not devices:
        return "no devices"
    named: list[str] = []
    new: dict[str, int] = {}
    for d in devices:
        cls = new_device_class(d.name)
        if cls is not None and d.node is None and d.found:
            new[cls] = new.get(cls, 0) + 1
        else:
            named.append(str(d))
    fresh = [f"{n} new {c} device{'s' if n > 1 else ''}" for c, n in new.items()]
    if not named:
        return ", ".join(fresh)
    return "devices " + ", ".join(named) + (" and " + ", ".join(fresh) if fresh else "")


@dataclass(frozen=True, slots=True)
class SetRefused(Reason):
    """The binder's refusal of a set (B1): every listed device with its node, then the
    `reasons` (at least one). With `request` it is the message written on the members
    ("refused <request>: devices …; …"); without, the bare reason W1 quotes. `code` and
    `category` are the first reason's."""
    devices: tuple[DeviceAt, ...]
    reasons: tuple[Reason, ...]
    request: RequestRef | None = None

    @property
    def code(self) -> Code:  # type: ignore[override]
        return self.reasons[0].code

    @property
    def category(self) -> Category:
        return self.reasons[0].category

    def render(self) -> str:
        body = "; ".join([_devices_head(self.devices), *(r.render() for r in self.reasons)])
        return f"refused {self.request}: {body}" if self.request is not None else body

    @property
    def only_missing(self) -> bool:
        """True when every reason is an object the view does not hold (a device or a
        class not found): what an informer that lags or relists would also say of objects
        that exist. The coordinator waits for its view before it writes such a refusal
        (`actors.coordinator`, `CoordinatorConfig.missing_grace`)."""
        return all(r.code in (Code.DEVICE_NOT_FOUND, Code.CLASS_NOT_FOUND) for r in self.reasons)


# --- what a Succeeded decision says ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Placed:
    """B1: the set gathered on `node`, binding `binds` (Pending members) and moving `moves`
    ((device, from node)); device mode (DR4): `devices` (member, device of the node) the
    exact device each member records (empty in count mode)."""
    request: RequestRef
    node: str
    binds: tuple[str, ...]
    moves: tuple[tuple[str, str], ...]
    devices: tuple[tuple[str, str], ...] = ()

    def render(self) -> str:
        parts = ([f"bind {', '.join(self.binds)}"] if self.binds else []) + (
            [f"move {', '.join(f'{d} from {f}' for d, f in self.moves)}"] if self.moves else []) + (
            [f"devices {', '.join(f'{m}={d}' for m, d in self.devices)}"] if self.devices else [])
        head = f"placed {self.request} on {self.node}"
        return f"{head}: {'; '.join(parts)}" if parts else f"{head}: nothing to change"

    __str__ = render


@dataclass(frozen=True, slots=True)
class AlreadyPlaced:
    """B6: the set is Bound entirely on eligible `node`."""
    request: RequestRef
    node: str

    def render(self) -> str:
        return f"{self.request}: already placed on {self.node}"

    __str__ = render


@dataclass(frozen=True, slots=True)
class KeptCordoned:
    """B5: the set is kept on its cordoned `node` under `rule` ("B5a": `stay` empty; "B5b":
    `stay` the members' classes that are onCordon Stay). Device mode (DR4): `devices`
    (member, device of the node) when its records no longer held there and it was
    re-pointed within the node (empty: the records stay as they are)."""
    request: RequestRef
    node: str
    rule: str
    stay: tuple[str, ...] = ()
    devices: tuple[tuple[str, str], ...] = ()

    def render(self) -> str:
        why = (f"{plural('class', self.stay)} {'is' if len(self.stay) == 1 else 'are'} onCordon Stay"
               if self.stay else "the cordon is its only problem and no other node has room")
        repointed = (f"; devices {', '.join(f'{m}={d}' for m, d in self.devices)}"
                     if self.devices else "")
        return (f"{self.request}: kept on cordoned node {self.node} ({self.rule}: {why}){repointed}; "
                "the VMI waits for the cordon to lift")

    __str__ = render


@dataclass(frozen=True, slots=True)
class Resumed:
    """B7: a decision recorded on a member before a binder restart, finished on `node` (when
    no member carries its Succeeded message)."""
    request: RequestRef
    node: str

    def render(self) -> str:
        return f"placed {self.request} on {self.node}: finishing a decision made before a binder restart"

    __str__ = render


Outcome = SetRefused | Placed | AlreadyPlaced | KeptCordoned
"""What a `model.decide.Decision` says (rendered: its `message`)."""
