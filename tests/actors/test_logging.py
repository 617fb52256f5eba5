"""Logs of one run: every prepare/commit/abort concerning node X is one JSON line carrying
node=X, on the stream and in `<log_dir>/X.jsonl` (docs/contract.md §6 NodeActor)."""

from __future__ import annotations

import io
from collections import defaultdict

import orjson
import pytest

from actors.logging import close_logging, configure_logging
from fakes.memory_store import MemoryStore
from model.types import Result
from tests.support.binder import running_binder, settle

pytestmark = pytest.mark.anyio

H100 = "nvidia.com/H100"
DECISIONS = {"prepare", "commit", "abort", "claim", "release", "expire", "rebuild", "adopt"}


async def test_every_node_decision_line_carries_its_node(tmp_path) -> None:
    buf = io.BytesIO()
    configure_logging(stream=buf, log_dir=tmp_path / "logs")
    s = MemoryStore(seed=7)
    s.add_class("h100", H100)
    for i in range(6):
        s.add_node(f"node-{i}", {H100: 1 + i % 3})
    for t in range(4):
        s.add_namespace(f"t{t}")
    ids = []
    try:
        async with running_binder(s) as binder:
            for n in range(24):  # more demand than capacity, so prepares are refused too
                ns = f"t{n % 4}"
                names = [f"d{n}-{j}" for j in range(1 + n % 2)]
                for name in names:
                    s.add_device(ns, name, "h100")
                ids.append((ns, s.request(ns, f"vm{n}", names)))
            await settle(s, binder)
    finally:
        close_logging()
    lines = [orjson.loads(line) for line in buf.getvalue().splitlines()]
    node_lines = [x for x in lines if x["event"] in DECISIONS and x.get("actor") == "node"]
    assert {x["event"] for x in node_lines} >= {"prepare", "commit", "rebuild"}
    # 1. node actors never log without their node
    assert all(isinstance(x.get("node"), str) for x in node_lines)
    # 2. each per-node file holds exactly that node's lines, in order
    by_node = defaultdict(list)
    for x in lines:
        if "node" in x:
            by_node[x["node"]].append(x)
    for node, expected in by_node.items():
        in_file = [orjson.loads(x) for x in (tmp_path / "logs" / f"{node}.jsonl").read_bytes().splitlines()]
        assert in_file == expected
        assert {x["node"] for x in in_file} == {node}
    # 3. the node on a commit line is the node the request was placed on
    final = {}
    for ns, rid in ids:
        members = s.request_members(ns, rid)
        final[rid] = members[0].status.bind_request
    commits = [x for x in node_lines if x["event"] == "commit" and x.get("outcome") == "committed"]
    assert commits
    for x in commits:
        br = final[x["request_id"]]
        assert br.result is Result.SUCCEEDED and br.node == x["node"], x
    # 4. every prepare names a node the coordinator's decision listed as a candidate
    candidates = {x["request_id"]: set(x["candidates"]) for x in lines if x["event"] == "decision"}
    for x in node_lines:
        if x["event"] == "prepare":
            assert x["node"] in candidates[x["request_id"]], x
    # 5. every line is one JSON object with a timestamp and a level
    assert all("timestamp" in x and "level" in x for x in lines)
