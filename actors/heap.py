"""The garbage-collector policy of a long-running binder process (the controller, bench/).

A binder's heap is mostly long-lived (the synced informer cache, one actor per node) plus a
stream of short-lived values per request (model values replaced on every write, messages).
With CPython's default thresholds (700, 10, 10) the young generation is collected every few
hundred allocations and full collections rescan the whole cache: at 1,000 nodes about a
tenth of the binder's CPU and, at 5,000 nodes, pauses of 100–300 ms that set p99
(bench/core.py measures both). `settle_heap` is called once the long-lived state is loaded.

`trim_heap_every` gives the C heap's free pages back to the kernel now and then (glibc's
`malloc_trim(0)`, issue 41 item 5): what CPython allocates beyond 512 bytes (TLS buffers,
HTTP bodies, large dicts) comes from glibc, which keeps a freed chunk's pages resident
unless they border the top of its heap, so without it RSS is the high-water mark of every
burst of connections and admissions since the start and never comes down.

`limit_tls_read_buffer` shrinks the read buffer asyncio gives every TLS connection (256 KiB
in CPython 3.11) to `TLS_READ_BUFFER`: a replica holds one per connection to kube-apiserver
and per webhook connection from it, so its RSS rose with them as a young follower took its
share of the webhook (issue 41 item 5).

`heap_parts` says where the resident memory lives (glibc's main and thread arenas, the other
anonymous mappings such as pymalloc's, stacks, files; mallinfo2's figures; pymalloc's blocks):
the replica's `gpu_binder_heap_bytes`, which the soak fits part by part.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import tracemalloc
from pathlib import Path
from typing import Awaitable, Callable

import anyio

YOUNG_THRESHOLD = 10_000
"""Allocations (net of frees) between young-generation collections."""


def settle_heap() -> tuple[int, int, int]:
    """Collect, freeze everything alive (full collections no longer scan it), and raise the
    young-generation threshold to `YOUNG_THRESHOLD` (older generations keep theirs).
    Returns the thresholds it replaced, for `restore_heap`."""
    before = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, before[1], before[2])
    return before


def restore_heap(thresholds: tuple[int, int, int]) -> None:
    """Undo `settle_heap` (for a process that loads another state next, as bench/ does)."""
    gc.unfreeze()
    gc.set_threshold(*thresholds)


MALLOC_TRIM_PERIOD = 60.0
"""Default seconds between two `malloc_trim(0)` calls (`--malloc-trim-period`). One call
walks glibc's free chunks: about 0.2 ms for a 50 MiB heap (`bench.cache_turnover`), so once a
minute is well below a thousandth of a core."""


def malloc_trimmer() -> Callable[[], int] | None:
    """glibc's `malloc_trim(0)` as a callable returning what it returns (1: pages went back
    to the kernel, 0: none could), or None where the C library has none (musl, macOS).
    ctypes releases the GIL for the call."""
    try:
        fn = ctypes.CDLL(None).malloc_trim   # the process's own C library
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return lambda: fn(0)


async def trim_heap_every(period: float, trim: Callable[[], int] | None = None, *,
                          sleep: Callable[[float], Awaitable[None]] = anyio.sleep) -> None:
    """Every `period` seconds, one `trim()` (default: `malloc_trimmer()`'s), forever: glibc
    keeps the pages of chunks freed inside its heap resident (only a free top is returned by
    itself), so a replica's RSS held every burst's high-water mark (issue 41 item 5: a young
    follower rose in steps of 3-5 MiB at bursts of admissions and connections and never came
    down; `python -m bench.cache_turnover --conns 20 --bursts 4` reproduces the steps without
    a cluster, and a trim a minute brings RSS back to what is in use after each burst; in
    the device soak of 2026-12-07 the follower still grew 0.94 MiB/min with it, so that
    growth is something else, docs/benchmarks.md). One trim per period, none at the start (the caller has just settled the heap). Returns at
    once when `period` <= 0 (off) or this C library has no `malloc_trim`; otherwise runs
    until cancelled."""
    if trim is None:
        trim = malloc_trimmer()
    if period <= 0 or trim is None:
        return
    while True:
        await sleep(period)
        trim()


def heap_report(directory, n: int) -> dict:
    """What the heap holds now, for telling a leak from allocator growth (`gpu-binder
    controller` calls it on SIGUSR2; docs/troubleshooting.md), after a full collection
    (`gc_collected` objects found unreachable): garbage in reference cycles waits for one,
    and with `settle_heap`'s thresholds over a large heap that can take minutes, so without
    it a report counts garbage as held. Then the objects the garbage
    collector tracks (`gc_objects`, of which `gc_frozen` frozen by `settle_heap`) and, while
    tracemalloc traces (`PYTHONTRACEMALLOC=1` in the process's environment), the bytes Python
    has allocated and not freed (`traced_bytes`) with a snapshot written to
    `directory`/tracemalloc-<pid>-<n>.snap (read it with `tracemalloc.Snapshot.load`; compare
    two with `Snapshot.compare_to`). Returns those as a dict. OSError when the snapshot
    cannot be written."""
    collected = gc.collect()
    out = {"pid": os.getpid(), "gc_collected": collected, "gc_objects": len(gc.get_objects()),
           "gc_frozen": gc.get_freeze_count(),
           "tracing": tracemalloc.is_tracing()}
    if out["tracing"]:
        current, peak = tracemalloc.get_traced_memory()
        path = Path(directory) / f"tracemalloc-{os.getpid()}-{n}.snap"
        tracemalloc.take_snapshot().dump(str(path))
        out.update(traced_bytes=current, traced_peak_bytes=peak, snapshot=str(path))
    return out


# -- the TLS read buffer (issue 41 item 5) --------------------------------------------------

TLS_READ_BUFFER = 64 * 1024
"""Bytes of the read buffer of each TLS connection after `limit_tls_read_buffer`: four TLS
records (16 KiB each at most), so one read still drains several records; asyncio's own 256 KiB
cost a replica 0.29 MiB of glibc heap per kept-alive connection, this 0.11 MiB (measured with
an aiohttp server, docs/benchmarks.md "Soak")."""


def limit_tls_read_buffer(nbytes: int = TLS_READ_BUFFER) -> int | None:
    """Make every TLS connection asyncio opens or accepts from now on read into a buffer of
    `nbytes` bytes (asyncio.sslproto.SSLProtocol.max_size, a class attribute: one buffer is
    allocated per connection when it is made and kept while it lives). Returns the size it
    replaced, or None where this Python's asyncio has no such attribute (the call then does
    nothing: its TLS is not asyncio's 3.11+ protocol). Raises ValueError for `nbytes` under
    16 KiB, which could not hold one TLS record. Process-wide: call it once at start-up,
    before the first connection (k8s/controller.py)."""
    if nbytes < 16 * 1024:
        raise ValueError(f"a TLS read buffer holds at least one 16 KiB record, got {nbytes}")
    from asyncio import sslproto

    protocol = getattr(sslproto, "SSLProtocol", None)
    before = getattr(protocol, "max_size", None)
    if not isinstance(before, int):
        return None
    protocol.max_size = nbytes
    return before


# -- where the resident memory lives (issue 41 item 5) -------------------------------------

THREAD_ARENA_ALIGN = 64 * 2**20
"""glibc's HEAP_MAX_SIZE on 64-bit (2 × the largest mmap threshold, 32 MiB): a thread arena's
heap is a mapping of this size aligned to it, read-write up to what the arena uses and
PROT_NONE above."""

RSS_PARTS = ("heap", "thread_arenas", "anon", "stacks", "file", "other")
"""The parts `rss_parts` splits the resident set into (see there)."""


def rss_parts(smaps: str) -> dict[str, int]:
    """The resident set of a process split by what its mappings are, from the text of its
    /proc/PID/smaps (only the mapping lines and their `Rss:` lines are read). Pure. Returns
    {part: bytes} with every part of RSS_PARTS (0 when none): `heap` glibc's main arena (the
    `[heap]` mapping, grown by brk); `thread_arenas` the read-write part of glibc's thread
    arenas (a worker thread that calls malloc gets an arena of its own: an anonymous
    read-write mapping just below a PROT_NONE one that ends on a THREAD_ARENA_ALIGN
    boundary); `stacks` the main thread's `[stack]` and the thread stacks (an anonymous
    read-write mapping just above a PROT_NONE guard no larger than a thread's); `anon` the
    other anonymous memory (pymalloc's arenas, glibc's mmap'd chunks — mallinfo2's hblkhd —,
    interpreter and extension buffers); `file` file-backed mappings (code, shared libraries,
    their written data pages); `other` the kernel's (`[vdso]`, `[vvar]`, …). Their sum is the
    process's RSS as the smaps were read (VmRSS, up to pages faulted meanwhile). Adjacent
    anonymous mappings with the same permissions are one mapping to the kernel, so a
    pymalloc arena next to a thread arena's or a stack's read-write part is counted with it:
    the split of anonymous memory is a close guess, its total is exact."""
    maps: list[tuple[int, int, str, str, int]] = []   # start, end, perms, path, rss bytes
    cur: list | None = None
    for line in smaps.splitlines():
        if not line:
            continue
        c = line[0]
        if c in "0123456789abcdef":                    # "start-end perms offset dev inode path"
            fields = line.split(None, 5)
            start, _, end = fields[0].partition("-")
            cur = [int(start, 16), int(end, 16), fields[1],
                   fields[5].strip() if len(fields) > 5 else "", 0]
            maps.append(cur)
        elif c == "R" and line.startswith("Rss:") and cur is not None:
            cur[4] = int(line.split()[1]) * 1024       # "Rss:   123 kB"
    out = dict.fromkeys(RSS_PARTS, 0)
    for k, (start, end, perms, path, rss) in enumerate(maps):
        if path == "[heap]":
            part = "heap"
        elif path == "[stack]":
            part = "stacks"
        elif path.startswith("/"):
            part = "file"
        elif path and not path.startswith("[anon"):
            part = "other"
        elif perms.startswith("rw"):
            nxt = maps[k + 1] if k + 1 < len(maps) else None
            prev = maps[k - 1] if k > 0 else None
            if (nxt is not None and nxt[0] == end and nxt[2].startswith("---")
                    and not nxt[3] and nxt[1] % THREAD_ARENA_ALIGN == 0
                    and nxt[1] - start <= THREAD_ARENA_ALIGN):
                part = "thread_arenas"
            elif (prev is not None and prev[1] == start and prev[2].startswith("---")
                  and not prev[3] and prev[1] - prev[0] <= 2**20):
                part = "stacks"
            else:
                part = "anon"
        else:
            part = "anon"
        out[part] += rss
    return out


class _Mallinfo2(ctypes.Structure):
    """glibc's `struct mallinfo2` (glibc >= 2.33): ten size_t fields, in bytes but for the
    counts `ordblks`, `smblks` and `hblks`."""

    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


MALLINFO_PARTS = {"arena": "malloc_arena", "hblkhd": "malloc_mmap",
                  "uordblks": "malloc_in_use", "fordblks": "malloc_free",
                  "keepcost": "malloc_releasable"}
"""mallinfo2's fields `heap_parts` reports, and their names there: `malloc_arena` bytes glibc
took from the kernel for its arenas (main and thread: brk and their heaps; resident or not),
`malloc_mmap` its chunks mmap'd of their own (≥ the mmap threshold), `malloc_in_use` bytes in
chunks in use (arenas and mmap'd), `malloc_free` bytes in free chunks of the arenas (a trim
can give back the whole pages among them), `malloc_releasable` the free top of the main
arena."""


def mallinfo_reader(libc=None) -> Callable[[], dict[str, int]] | None:
    """glibc's `mallinfo2()` as a callable returning {MALLINFO_PARTS' name: bytes}, or None
    where the C library has none (musl, macOS, glibc before 2.33). `libc`: the library to
    look in (default: the process's own, `ctypes.CDLL(None)`). The call walks every arena's
    free lists under its lock: the cost grows with the free chunks (measured in
    docs/metrics.md)."""
    try:
        fn = (libc if libc is not None else ctypes.CDLL(None)).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.argtypes = []
    fn.restype = _Mallinfo2

    def read() -> dict[str, int]:
        got = fn()
        return {name: int(getattr(got, field)) for field, name in MALLINFO_PARTS.items()}
    return read


_MALLINFO = mallinfo_reader()


def heap_parts(smaps_path: str = "/proc/self/smaps",
               mallinfo: Callable[[], dict[str, int]] | None = _MALLINFO) -> dict[str, int]:
    """Where this process's memory lives now, for telling which part grows (issue 41 item
    5; `gpu_binder_heap_bytes` and `gpu_binder_heap_pymalloc_blocks`, k8s/metrics.py):
    `rss_<part>` bytes resident per `rss_parts`'s part of `smaps_path` (left out when it
    cannot be read: no /proc), glibc's figures from `mallinfo` (default: `mallinfo_reader()`'s
    for this process; left out when None: not glibc) under MALLINFO_PARTS' names, and `pymalloc_blocks` the
    blocks Python's allocator has handed out and not freed (`sys.getallocatedblocks()`: a
    count, not bytes). Reads the smaps in one pass: a few milliseconds for a process of a few
    hundred mappings (docs/metrics.md), so call it every few seconds at most, not per
    request. No collection is run. Never raises for a missing /proc or C library."""
    out: dict[str, int] = {"pymalloc_blocks": sys.getallocatedblocks()}
    if mallinfo is not None:
        out.update(mallinfo())
    try:
        with open(smaps_path, encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return out
    out.update({f"rss_{part}": n for part, n in rss_parts(text).items()})
    return out
