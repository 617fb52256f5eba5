"""bench.soak's pure parts: the seeded schedule and the RSS slope."""

from __future__ import annotations

from bench.soak import SoakSpec, rss_slopes, schedule, schedule_digest


def test_same_seed_same_schedule_and_another_seed_another():
    spec = SoakSpec(nodes=30, minutes=2, seed=5, live=40, create_rate=2)
    a, b = schedule(spec), schedule(spec)
    assert a == b and schedule_digest(a) == schedule_digest(b)
    assert schedule_digest(schedule(SoakSpec(nodes=30, minutes=2, seed=6, live=40,
                                             create_rate=2))) != schedule_digest(a)
    assert [o.at for o in a] == sorted(o.at for o in a)
    kinds = [o.kind for o in a]
    assert kinds.count("kill-leader") == 0 and kinds.count("restart-apiserver") == 1
    # deletes start once the steady number of VMIs has been created
    first_delete = kinds.index("delete")
    assert kinds[:first_delete].count("create") == 40


def test_rss_slope_fits_after_the_warm_up():
    samples = [(t, 0, 11, 100 + (50 if t < 60 else 0) + t / 60) for t in range(0, 400, 10)]
    samples += [(t, 1, 12, 80.0) for t in range(0, 100, 10)]
    got = {x["replica"]: x for x in rss_slopes(samples)}
    assert abs(got[0]["slope_mib_per_min"] - 1.0) < 1e-6
    assert got[1]["slope_mib_per_min"] is None      # too short to fit
