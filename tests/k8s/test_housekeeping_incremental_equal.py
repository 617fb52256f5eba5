"""A listening Housekeeper (incremental rounds: devices, claims H1/H2/H4 and DR6, the VMs'
GPUSetKept condition, the lost devices) makes exactly the API calls a Housekeeper judging
everything every round makes, round after round, on random changes to a small device-mode
fleet (`bench.housekeeping_cost`'s population at 2 nodes: sets, VMIs, VMs, claims, slices).
Both read the same `ClusterCache`; their writes are recorded, not applied."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone

import anyio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bench.housekeeping_cost import GRACE, _World
from fakes.kube_client import ScriptedClient
from k8s.housekeeping import Housekeeper
from model.claim import CLAIMED_AT
from model.serialize import format_time

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)

op = st.one_of(
    st.tuples(st.just("vmi_gone"), st.integers(0, 7)),
    st.tuples(st.just("vm_gone"), st.integers(0, 7)),
    st.tuples(st.just("vm_back"), st.integers(0, 7)),
    st.tuples(st.just("claim_gone"), st.integers(0, 7)),
    st.tuples(st.just("detach"), st.integers(0, 7)),
    st.tuples(st.just("detach_all"), st.integers(0, 7)),
    st.tuples(st.just("claim_fresh"), st.integers(0, 7)),
    st.tuples(st.just("kept"), st.integers(0, 7)),
    st.tuples(st.just("move"), st.integers(0, 7)),
    st.tuples(st.just("slice_gone"), st.integers(0, 1)),
    st.tuples(st.just("keep"), st.booleans()),
    st.tuples(st.just("time"), st.sampled_from((1, 20, 31, 61, 400))),
)


def _calls(client: ScriptedClient) -> list[str]:
    out = sorted(f"{c.method} {c.args!r}" for c in client.calls)
    client.calls.clear()
    return out


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(op, max_size=3), min_size=1, max_size=8))
# a young claim whose VMI went: deleted once its grace ran out, with no change meanwhile
@example([[("claim_fresh", 0), ("vmi_gone", 0), ("detach_all", 0)], [("time", 20)], [("time", 20)]])
# a kept set's VM condition written, written again (not applied here), then the keep ends
@example([[("kept", 1), ("vmi_gone", 1)], [("time", 1)], [("time", 400)]])
# DR6: a claim deleted, made again; tried again next round when it was not
@example([[("claim_gone", 2)], [("time", 1)]])
def test_incremental_rounds_make_the_calls_full_rounds_make(batches):
    world = _World(2, "device")
    cache = world.cache
    inc_client, full_client = ScriptedClient(), ScriptedClient()
    kw = dict(grace=GRACE, raw_policy="denied", answer_window=timedelta(seconds=10), vms=world.vms)
    inc = Housekeeper(inc_client, cache, **kw)
    full = Housekeeper(full_client, cache, **kw)
    sets = world.sets
    claims = {k: copy.deepcopy(raw) for k, raw in world.raw_claims.items()}

    def put(d):
        d["metadata"]["resourceVersion"] = world._next_rv()
        cache.devices._apply("MODIFIED", d)

    def apply(kind, arg, now):
        vmi, devs, vm = sets[arg % len(sets)]
        if kind == "vmi_gone":
            cache.vmis._apply("DELETED", vmi)
        elif kind == "vm_gone":
            world.vms._apply("DELETED", vm)
        elif kind == "vm_back":
            world.vms._apply("ADDED", {**vm, "metadata": {**vm["metadata"], "resourceVersion": world._next_rv()}})
        elif kind == "claim_gone":
            for key in list(cache.claims.keys()):
                if key[1].startswith(vmi["metadata"]["name"]):
                    cache.claims._apply("DELETED", cache.claims.get(key))
        elif kind == "detach":
            d = copy.deepcopy(devs[0])
            d["status"].pop("attachedTo", None)
            d["metadata"]["resourceVersion"] = world._next_rv()
            cache.devices._apply("MODIFIED", d)
        elif kind == "detach_all":
            for d in devs:
                d = copy.deepcopy(d)
                d["status"].pop("attachedTo", None)
                put(d)
        elif kind == "claim_fresh":  # made or confirmed again just now (H1's clock restarts)
            for key in list(cache.claims.keys()):
                if key[1].startswith(vmi["metadata"]["name"]):
                    raw = copy.deepcopy(claims[key])
                    raw["metadata"]["annotations"][CLAIMED_AT] = format_time(now)
                    raw["metadata"]["resourceVersion"] = world._next_rv()
                    cache.claims._apply("MODIFIED", raw)
        elif kind == "kept":  # H4's keptUntil written (as housekeeping's write lands)
            for d in devs:
                d = copy.deepcopy(d)
                d["status"]["attachedTo"]["keptUntil"] = format_time(now + timedelta(minutes=5))
                put(d)
        elif kind == "move":  # a device Bound and recording its GPU on the other node
            d = copy.deepcopy(devs[-1])
            node = "n0001" if d["status"]["nodeName"] == "n0000" else "n0000"
            d["status"]["nodeName"] = node
            d["status"]["device"]["pool"] = node
            put(d)
        elif kind == "slice_gone":
            for obj in cache.slices.items():
                if obj["metadata"]["name"].startswith(f"n{arg:04d}"):
                    cache.slices._apply("DELETED", {"metadata": dict(obj["metadata"])})
        elif kind == "keep":
            raw = copy.deepcopy(cache.classes.items()[0])
            raw["spec"]["keepSetFor"] = "5m" if arg else None
            raw["metadata"]["resourceVersion"] = world._next_rv()
            cache.classes._apply("MODIFIED", raw)

    async def main():
        now = T0
        with inc.listening():
            await inc.round(now)
            await full.round(now)
            assert _calls(inc_client) == _calls(full_client)
            for batch in batches:
                for kind, arg in batch:
                    if kind == "time":
                        now += timedelta(seconds=arg)
                    else:
                        apply(kind, arg, now)
                await inc.round(now)
                await full.round(now)
                assert _calls(inc_client) == _calls(full_client), batch
                assert (inc.lost.lost_now, inc.kept.kept_now) == (full.lost.lost_now, full.kept.kept_now)
        assert inc.full_rounds <= full.full_rounds == len(batches) + 1

    anyio.run(main)
