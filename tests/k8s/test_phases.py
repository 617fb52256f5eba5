"""Per-admission phase timing (k8s/webhook/phases.py, issue 40): a recorder per review, fed
by `phase(name)` blocks (plain or async), nothing recorded outside `recording()`, one review's
phases never another's (context variables), observed only once the review is admitted with a
patch (its mode set); `k8s.metrics.Metrics` turns them into
`gpu_binder_admission_phase_seconds{phase,mode}`. Time is a scripted clock: no sleeps."""

from __future__ import annotations

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from k8s.metrics import Metrics, Observed
from k8s.webhook.phases import PHASES, Recorded, phase, recording, set_mode
from tests.k8s.test_metrics_fleet import _idle_admission
from tests.k8s.test_webhook_priority import admission, name_free, review, world
from tests.timing import FAKE_TIME
from fakes.kube_client import ScriptedClient


class Ticks:
    """A clock that reads the seconds it was told to."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_phases_sum_per_name_and_total_runs_from_the_start():
    clock = Ticks()
    with recording(clock) as rec:
        with phase("live-read"):
            clock.now += 0.25
        clock.now += 1.0                      # between phases: the webhook's own time
        for step in (0.5, 0.125):             # a phase met twice sums
            with phase("attach"):
                clock.now += step
        set_mode("count")
    got = rec.finish()
    assert got == Recorded("count", (("live-read", 0.25), ("attach", 0.625)), 1.875)


def test_nothing_is_recorded_outside_a_review_and_no_mode_means_nothing_to_observe():
    with phase("attach"):                     # no recorder: no effect, no error
        pass
    set_mode("device")
    clock = Ticks()
    with recording(clock) as rec:
        with phase("precheck"):
            clock.now += 0.0625
    assert rec.seconds == {"precheck": 0.0625}
    assert rec.finish() is None               # a denial or a dry run: never observed
    with pytest.raises(ValueError, match="mode is one of"):
        set_mode("gpu")


def test_a_phase_that_raises_is_still_timed():
    clock = Ticks()
    with recording(clock) as rec:
        with pytest.raises(RuntimeError):
            with phase("wait-result"):
                clock.now += 2.0
                raise RuntimeError("denied")
    assert rec.seconds == {"wait-result": 2.0}


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [FAKE_TIME])
async def test_concurrent_reviews_record_their_own_phases(anyio_backend):
    seen: dict[str, dict[str, float]] = {}

    async def review_(name: str, seconds: float) -> None:
        with recording(anyio.current_time) as rec:  # the loop's fake time
            async with phase("turn"):
                await anyio.sleep(seconds)    # the other review runs meanwhile
            seen[name] = dict(rec.seconds)

    async with anyio.create_task_group() as tg:
        tg.start_soon(review_, "a", 0.5)
        tg.start_soon(review_, "b", 0.25)
    assert seen == {"a": {"turn": pytest.approx(0.5)}, "b": {"turn": pytest.approx(0.25)}}


def test_metrics_observe_each_phase_and_the_total_by_mode():
    adm = _idle_admission()
    metrics = Metrics(lambda: Observed(), adm)
    assert adm.phase_observer is metrics
    metrics.admission_phases(Recorded("device", (("attach", 0.02), ("claim", 0.004)), 0.1))
    metrics.admission_phases(Recorded("device", (("attach", 0.03),), 0.2))
    body, _ = metrics.render()
    got = {(s.name, s.labels.get("phase"), s.labels.get("mode")): s.value
           for f in text_string_to_metric_families(body.decode()) for s in f.samples
           if s.name.startswith("gpu_binder_admission_phase_seconds_")}
    prefix = "gpu_binder_admission_phase_seconds"
    assert got[(f"{prefix}_count", "attach", "device")] == 2
    assert got[(f"{prefix}_sum", "attach", "device")] == pytest.approx(0.05)
    assert got[(f"{prefix}_count", "claim", "device")] == 1
    assert got[(f"{prefix}_sum", "total", "device")] == pytest.approx(0.3)
    assert not any(mode == "count" for _, _, mode in got)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [FAKE_TIME])
async def test_an_admitted_review_hands_its_phases_to_the_observer(monkeypatch, anyio_backend):
    store, client, observed = world(), ScriptedClient(), []
    name_free(client)
    adm = admission(store, client, monkeypatch, [])
    adm.phase_observer = type("Seen", (), {"admission_phases": lambda self, r: observed.append(r)})()
    assert (await adm.handle(review()))["allowed"] is True
    (rec,) = observed
    assert rec.mode == "count"
    names = [name for name, _ in rec.seconds]
    assert names == ["precheck", "live-read", "judge", "template-create", "attach",
                     "wait-result", "record-wait", "patch-build"]
    assert set(names) <= set(PHASES)
    assert rec.total >= sum(s for _, s in rec.seconds) >= 0


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [FAKE_TIME])
async def test_a_denied_or_dry_run_review_is_not_observed(monkeypatch, anyio_backend):
    observed: list = []
    for rv in (review(pc="no-such-class"), review(dry_run=True)):
        store, client = world(), ScriptedClient()
        name_free(client)
        adm = admission(store, client, monkeypatch, [])
        adm.phase_observer = type("Seen", (), {"admission_phases":
                                               lambda self, r: observed.append(r)})()
        await adm.handle(rv)
    assert observed == []


def test_marks_are_the_reviews_wall_instants_and_phase_seconds_for_its_log_line():
    from k8s.webhook.phases import mark, marked

    mark("attached_at", 1.0)                  # no recorder: no effect, no error
    assert marked("wait-result") == {}
    clock = Ticks()
    with recording(clock):
        with phase("wait-result"):
            mark("attached_at", 1_800_000_000.25)
            clock.now += 0.5
            mark("result_at", 1_800_000_000.75)
        assert marked("wait-result", "claim") == {
            "attached_at": 1_800_000_000.25, "result_at": 1_800_000_000.75,
            "wait_result_s": 0.5}             # "claim" not met: not said


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [FAKE_TIME])
async def test_the_admitted_line_says_when_the_wait_for_the_binder_began_and_ended(
        monkeypatch, anyio_backend):
    """`bench floor` joins the "VMI admitted" line's wall instants (the attach patches
    returned, the result seen) with the leader's by request id."""
    from tests.support.logs import captured_logs

    store, client = world(), ScriptedClient()
    name_free(client)
    adm = admission(store, client, monkeypatch, [])
    with captured_logs() as logs:
        assert (await adm.handle(review()))["allowed"] is True
    (line,) = [e for e in logs if e["event"] == "VMI admitted"]
    assert isinstance(line["attached_at"], float) and isinstance(line["result_at"], float)
    assert line["attached_at"] <= line["result_at"]
    assert line["wait_result_s"] >= 0
    assert abs(line["attached_at"] - adm.now().timestamp()) < 3600  # the webhook's wall clock
