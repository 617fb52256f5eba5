"""`bench.proc_cpu`: a level's CPU per admission per process (issue 40), from two snapshots
of /proc, without a cluster. The run itself is `bench e2e`'s (docs/benchmarks.md)."""

from __future__ import annotations

import os

import pytest

from bench import proc_cpu


def test_stat_line_with_spaces_and_parentheses_in_the_name():
    # fields 14 and 15 (utime 250, stime 50 ticks); the name "(a) b)" holds both
    line = "4242 ((a) b)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 99 1 1"
    assert proc_cpu.parse_stat_cpu(line, ticks_per_s=100) == 3.0


def test_this_process_is_read_and_a_gone_one_is_none():
    got = proc_cpu.cpu_seconds(os.getpid())
    assert got is not None and got > 0
    assert proc_cpu.cpu_seconds(2**22 + 1) is None   # above pid_max's default ceiling
    snap = proc_cpu.cpu_snapshot({"me": os.getpid(), "gone": 2**22 + 1})
    assert snap["me"] is not None and snap["gone"] is None


def test_per_admission_per_process_total_and_cores():
    before = {"kube-apiserver": 10.0, "etcd": 2.0, "replica-0": 5.0, "replica-1": 4.0,
              "bench": 1.0, "gone": 3.0, "late": None}
    after = {"kube-apiserver": 13.0, "etcd": 2.6, "replica-0": 6.2, "replica-1": 4.3,
             "bench": 1.9, "gone": None, "late": 7.0}
    got = proc_cpu.cpu_per_admission(before, after, admitted=60, seconds=3.0,
                                     roles={"replica-0": "leader", "replica-1": "follower"})
    assert got["ms_per_admission"] == {"kube-apiserver": 50.0, "etcd": 10.0,
                                       "replica-0 (leader)": 20.0, "replica-1 (follower)": 5.0,
                                       "bench": 15.0, "total": 100.0}
    assert got["cpu_s"]["replica-0 (leader)"] == 1.2
    assert "gone" not in got["cpu_s"] and "late" not in got["cpu_s"]
    assert got["cores"] == 2.0            # 6 CPU seconds over 3 s of wall time
    assert got["roles"] == {"replica-0": "leader", "replica-1": "follower"}


def test_nothing_admitted_gives_no_per_admission_figure():
    got = proc_cpu.cpu_per_admission({"etcd": 1.0}, {"etcd": 1.5}, admitted=0, seconds=0.0)
    assert got["ms_per_admission"] == {"etcd": None, "total": None}
    assert got["cpu_s"] == {"etcd": 0.5} and got["cores"] is None


def test_ours_against_theirs_matches_a_replica_whatever_its_role():
    ours = proc_cpu.cpu_per_admission(
        {"kube-apiserver": 0.0, "replica-0": 0.0, "bench": 0.0},
        {"kube-apiserver": 4.0, "replica-0": 1.0, "bench": 0.5}, 50, 2.0,
        roles={"replica-0": "leader"})
    theirs = proc_cpu.cpu_per_admission(
        {"kube-apiserver": 0.0, "replica-0": 0.0, "kube-scheduler": 0.0},
        {"kube-apiserver": 1.0, "replica-0": 0.1, "kube-scheduler": 0.25}, 50, 1.0,
        roles={"replica-0": "follower"})
    got = proc_cpu.cpu_vs(ours, theirs)
    assert got["kube-apiserver"] == {"ours": 80.0, "theirs": 20.0, "difference": 60.0}
    assert got["replica-0"] == {"ours": 20.0, "theirs": 2.0, "difference": 18.0}
    assert got["bench"] == {"ours": 10.0, "theirs": 0.0, "difference": 10.0}
    assert got["kube-scheduler"] == {"ours": 0.0, "theirs": 5.0, "difference": -5.0}
    assert got["total"] == {"ours": 110.0, "theirs": 27.0, "difference": 83.0}


def test_summary_line_largest_first():
    cpu = {"ms_per_admission": {"etcd": 5.0, "kube-apiserver": 40.0, "total": 45.0},
           "cores": 1.9}
    assert proc_cpu.cpu_line(cpu, "VMI") == ("CPU ms per VMI: kube-apiserver 40.0, etcd 5.0; "
                                             "total 45.0 (1.9 cores busy)")


@pytest.mark.parametrize("text", ["", "no parenthesis here", "1 (x) S 1 2"])
def test_a_line_that_is_not_a_stat_line_is_refused(text):
    with pytest.raises(ValueError):
        proc_cpu.parse_stat_cpu(text)


TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 0100007F:1F90 0100007F:A001 01 00000000:00000000 00:00000000 00000000     0        0 2 1
   2: 0100007F:1F90 0100007F:A002 06 00000000:00000000 00:00000000 00000000     0        0 0 1
   3: 0100007F:A003 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 3 1
   4: garbage
"""


def test_client_ends_of_connections_to_the_port_from_either_end_but_listen():
    # 0x1F90 = 8080: the server's ends of A001 (open) and A002 (TIME_WAIT), the client's own
    # end of A003 (its server end gone); the LISTEN socket is no connection
    assert proc_cpu.peers_of(8080, TCP) == {("0100007F", 0xA001), ("0100007F", 0xA002),
                                            ("0100007F", 0xA003)}
    assert proc_cpu.peers_of(8081, TCP) == set()


def test_new_connections_over_a_level():
    before = {("0100007F", 1), ("0100007F", 2)}
    seen = before | {("0100007F", 3), ("0100007F", 4), ("0100007F", 5)}
    assert proc_cpu.new_connections(before, seen, 60) == {"new": 3, "per_admission": 0.05,
                                                          "open_before": 2}
    assert proc_cpu.new_connections(set(), set(), 0)["per_admission"] is None


def test_cores_per_process_over_a_window_with_the_replicas_by_role():
    """`cpu_cores`: an idle window's background per process (issue 40 item 3), each figure
    CPU seconds ÷ the window's wall time; a process missing from either snapshot is left
    out, as in `cpu_per_admission`."""
    before = {"kube-apiserver": 100.0, "kwok": 50.0, "replica-0": 9.0, "replica-1": 7.0,
              "gone": 1.0}
    after = {"kube-apiserver": 104.5, "kwok": 52.0, "replica-0": 9.25, "replica-1": 7.01,
             "gone": None}
    got = proc_cpu.cpu_cores(before, after, 10.0, {"replica-0": "leader", "replica-1": "follower"})
    assert got["cores"] == {"kube-apiserver": 0.45, "kwok": 0.2, "replica-0 (leader)": 0.025,
                            "replica-1 (follower)": 0.001, "total": 0.676}
    assert got["cpu_s"] == {"kube-apiserver": 4.5, "kwok": 2.0, "replica-0 (leader)": 0.25,
                            "replica-1 (follower)": 0.01}
    assert (got["seconds"], got["roles"]) == (10.0, {"replica-0": "leader",
                                                     "replica-1": "follower"})
    assert proc_cpu.cpu_cores(before, after, 0.0)["cores"] == {
        "kube-apiserver": None, "kwok": None, "replica-0": None, "replica-1": None,
        "total": None}
