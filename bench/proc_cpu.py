"""CPU seconds per process over a benchmark level, and what they cost per admission.

`cpu_seconds` reads a process's utime + stime from /proc (Linux; every thread of it counted,
its children not); `cpu_snapshot` reads a named set of them at once; `cpu_per_admission`
(pure) turns two snapshots, the admissions between them and the level's wall time into CPU
milliseconds per admission per process, their total and the cores the level kept busy;
`cpu_cores` (pure) the cores each process kept busy over a window (an idle one: its
background).
`bench e2e` uses them to say where a VMI's CPU goes against a Pod's (issue 40)."""

from __future__ import annotations

import os

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def parse_stat_cpu(stat: str, ticks_per_s: int = _TICKS, *, children: bool = False) -> float:
    """utime + stime in seconds from the text of /proc/PID/stat (fields 14 and 15, counted
    after the command name, which may hold spaces and parentheses: the last ')' ends it);
    `children` adds its waited-for children's (cutime + cstime, fields 16 and 17). Raises
    ValueError for text that is not such a line."""
    rest = stat[stat.rindex(")") + 2:].split()
    # rest[0] is field 3 (state): utime is field 14, stime 15, cutime 16, cstime 17
    if len(rest) < 15:
        raise ValueError(f"not a /proc/PID/stat line: {stat[:80]!r}")
    return sum(int(x) for x in rest[11:15 if children else 13]) / ticks_per_s


def cpu_seconds(pid: int, *, children: bool = False) -> float | None:
    """CPU seconds (user + system) process `pid` has used so far, all its threads (and, with
    `children`, its waited-for children's); None when it is gone or /proc cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return parse_stat_cpu(f.read(), children=children)
    except (OSError, ValueError):
        return None


def cpu_snapshot(pids: dict[str, int]) -> dict[str, float | None]:
    """{name: cpu_seconds(pid)} for each named process of `pids`."""
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


def _used(before: dict[str, float | None], after: dict[str, float | None],
          roles: dict[str, str]) -> dict[str, float]:
    """CPU seconds per process between two snapshots, "NAME (ROLE)" where `roles` names
    one; a process missing (None) from either is left out."""
    used: dict[str, float] = {}
    for name, b in before.items():
        a = after.get(name)
        if a is None or b is None:
            continue
        role = roles.get(name)
        used[f"{name} ({role})" if role else name] = a - b
    return used


def cpu_cores(before: dict[str, float | None], after: dict[str, float | None],
              seconds: float, roles: dict[str, str] | None = None) -> dict:
    """The cores each process kept busy over a window of `seconds` (wall time) between two
    `cpu_snapshot`s: {"seconds" (to 0.1), "cpu_s": {name: CPU seconds, to 0.001},
    "cores": {name: CPU seconds ÷ `seconds`, to 0.001 (1 ms of CPU a second), and
    "total"}, "roles": `roles`}; names and missing processes as `cpu_per_admission`'s. With
    no admission in the window, each process's background at that moment. `cores` figures
    are None when `seconds` is not positive. /proc counts in ticks of 10 ms, so a process's
    figure over a 10 s window is good to about 0.001 cores."""
    roles = roles or {}
    used = _used(before, after, roles)
    cores: dict[str, float | None] = {
        k: (round(v / seconds, 3) if seconds > 0 else None) for k, v in used.items()}
    cores["total"] = round(sum(used.values()) / seconds, 3) if seconds > 0 else None
    return {"seconds": round(seconds, 1), "cpu_s": {k: round(v, 3) for k, v in used.items()},
            "cores": cores, "roles": dict(roles)}


def cpu_per_admission(before: dict[str, float | None], after: dict[str, float | None],
                      admitted: int, seconds: float,
                      roles: dict[str, str] | None = None) -> dict:
    """What a level cost each process, from two `cpu_snapshot`s around it.

    Returns {"cpu_s": {name: CPU seconds over the level}, "ms_per_admission": {name: CPU ms
    per admitted VMI or Pod, and "total"}, "cores": total CPU seconds ÷ `seconds` (the
    level's wall time; 2.0 on this machine is both cores busy), "roles": `roles`}. A process
    missing from either snapshot (None: gone, or not started) is left out of every figure;
    names are renamed "NAME (ROLE)" when `roles` gives one (e.g. a replica's "leader").
    Figures are rounded to 0.1 ms and 0.001 s; with no admission the per-admission figures
    are None. /proc's resolution is one clock tick (10 ms), so a process's figure over a
    level of N admissions is good to about 10 ÷ N ms."""
    roles = roles or {}
    used = _used(before, after, roles)
    total = sum(used.values())
    per = {k: (round(1000 * v / admitted, 1) if admitted else None) for k, v in used.items()}
    per["total"] = round(1000 * total / admitted, 1) if admitted else None
    return {"cpu_s": {k: round(v, 3) for k, v in used.items()},
            "ms_per_admission": per,
            "cores": round(total / seconds, 2) if seconds > 0 else None,
            "roles": dict(roles)}


def cpu_line(cpu: dict, what: str = "admission") -> str:
    """One summary line of a `cpu_per_admission` result: each process's CPU ms per
    `what`, largest first, then the total and the cores."""
    per = cpu["ms_per_admission"]
    parts = [f"{k} {v}" for k, v in sorted(((k, v) for k, v in per.items() if k != "total"),
                                              key=lambda kv: -(kv[1] or 0))]
    return (f"CPU ms per {what}: " + ", ".join(parts)
            + f"; total {per['total']} ({cpu['cores']} cores busy)")


def cpu_vs(ours: dict, theirs: dict) -> dict:
    """Per process, (ours, theirs, ours − theirs) CPU ms per admission from two
    `cpu_per_admission` results, matched on the name before any " (role)" (so a replica is
    the same process whatever its role); a process one side lacks counts 0 there."""
    def base(d: dict) -> dict[str, float]:
        out: dict[str, float] = {}
        for k, v in d["ms_per_admission"].items():
            out[k.split(" (", 1)[0]] = out.get(k.split(" (", 1)[0], 0.0) + (v or 0.0)
        return out
    a, b = base(ours), base(theirs)
    return {k: {"ours": round(a.get(k, 0.0), 1), "theirs": round(b.get(k, 0.0), 1),
                "difference": round(a.get(k, 0.0) - b.get(k, 0.0), 1)}
            for k in [*a, *(k for k in b if k not in a)]}


# -- connections to a port -------------------------------------------------------------------

_LISTEN = "0A"


def peers_of(port: int, table: str) -> set[tuple[str, int]]:
    """The client ends (address as /proc writes it, port) of the TCP connections to `port`,
    from the text of /proc/net/tcp or tcp6, seen from either end (on loopback both ends are
    listed; after a close, only the one that closed first, in TIME_WAIT for 60 s on Linux):
    every state but LISTEN, so a connection opened and closed between two reads still shows
    in the second. Lines that do not parse are skipped."""
    out: set[tuple[str, int]] = set()
    for line in table.splitlines()[1:]:
        f = line.split()
        if len(f) < 4 or f[3] == _LISTEN:
            continue
        try:
            local, remote = f[1].rsplit(":", 1), f[2].rsplit(":", 1)
            if int(local[1], 16) == port:
                out.add((remote[0], int(remote[1], 16)))
            elif int(remote[1], 16) == port:
                out.add((local[0], int(local[1], 16)))
        except (IndexError, ValueError):
            continue
    return out


def read_peers(port: int) -> set[tuple[str, int]]:
    """`peers_of(port, …)` over /proc/net/tcp and /proc/net/tcp6 (empty where unreadable)."""
    out: set[tuple[str, int]] = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                out |= peers_of(port, f.read())
        except OSError:
            continue
    return out


def new_connections(before: set, seen: set, admitted: int) -> dict:
    """{"new": connections seen that were not there before, "per_admission": that ÷
    `admitted` (None for none admitted), "open_before": how many were there before}: how
    often the webhook's client opened a connection (and so a TLS handshake) over a level."""
    new = len(seen - before)
    return {"new": new, "per_admission": round(new / admitted, 3) if admitted else None,
            "open_before": len(before)}
