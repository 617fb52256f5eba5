"""Where a process's memory lives (actors/heap.py `rss_parts`, `mallinfo_reader`,
`heap_parts`; issue 41 item 5): the smaps split, glibc's mallinfo2 read through ctypes, and
a C library without it."""

from __future__ import annotations

import ctypes
import platform
import threading

import pytest

from actors.heap import (MALLINFO_PARTS, RSS_PARTS, _Mallinfo2, heap_parts, mallinfo_reader,
                         rss_parts)


def _vma(start: int, end: int, perms: str, path: str = "", rss_kb: int = 0) -> str:
    """One mapping of /proc/PID/smaps as the kernel writes it (the fields not read too)."""
    head = f"{start:x}-{end:x} {perms} 00000000 00:00 0"
    head = f"{head:<73}{path}" if path else head + " "
    return "\n".join([head, f"Size:            {(end - start) // 1024} kB",
                      "KernelPageSize:        4 kB", f"Rss:            {rss_kb} kB",
                      f"Pss:            {rss_kb} kB", "Anonymous:             0 kB",
                      "VmFlags: rd wr mr mw me ac sd"])


MiB = 2**20
ARENA = 0x7F8638000000          # 64 MiB aligned, as glibc places a thread arena's heap
SMAPS = "\n".join([
    _vma(0x55E529800000, 0x55E529802000, "r--p", "/usr/bin/python3.11", 8),
    _vma(0x55E529802000, 0x55E529A00000, "r-xp", "/usr/bin/python3.11", 1500),
    _vma(0x55E529A54000, 0x55E529C5F000, "rw-p", "[heap]", 1996),
    # a thread arena: read-write up to what it uses, PROT_NONE up to the next 64 MiB
    _vma(ARENA, ARENA + 0x8D1000, "rw-p", "", 9028),
    _vma(ARENA + 0x8D1000, ARENA + 64 * MiB, "---p", "", 0),
    # a thread stack: a one-page guard below 8 MiB
    _vma(0x7F86437FF000, 0x7F8643800000, "---p", "", 0),
    _vma(0x7F8643800000, 0x7F8644000000, "rw-p", "", 24),
    # pymalloc's arenas and mmap'd chunks: anonymous read-write, no guard
    _vma(0x7F8649622000, 0x7F8649722000, "rw-p", "", 1004),
    _vma(0x7F8649727000, 0x7F864985A000, "rw-p", "[anon:glibc]", 336),
    # a PROT_NONE mapping nobody touched, a deleted file, the kernel's
    _vma(0x7F864A000000, 0x7F864A100000, "---p", "", 0),
    _vma(0x7F864B000000, 0x7F864B001000, "rw-s", "/dev/shm/x (deleted)", 4),
    _vma(0x7FFC0E3C0000, 0x7FFC0E3E1000, "rw-p", "[stack]", 132),
    _vma(0x7FFC0E3F0000, 0x7FFC0E3F4000, "r--p", "[vvar]", 0),
    _vma(0x7FFC0E3F4000, 0x7FFC0E3F6000, "r-xp", "[vdso]", 8)]) + "\n"


def test_rss_parts_splits_the_mappings_and_adds_up_to_their_rss() -> None:
    got = rss_parts(SMAPS)
    assert got == {"heap": 1996 * 1024, "thread_arenas": 9028 * 1024,
                   "stacks": (24 + 132) * 1024, "anon": (1004 + 336) * 1024,
                   "file": (8 + 1500 + 4) * 1024, "other": 8 * 1024}
    assert set(got) == set(RSS_PARTS)
    assert sum(got.values()) == 1024 * (8 + 1500 + 1996 + 9028 + 24 + 1004 + 336 + 4 + 132 + 8)


def test_a_read_write_mapping_below_a_guard_off_the_arena_alignment_is_plain_anonymous() -> None:
    # PROT_NONE above it ending 4 MiB short of a 64 MiB boundary: not a thread arena; and a
    # PROT_NONE below it of 2 MiB is no thread's guard page
    start = ARENA + 8 * MiB
    text = "\n".join([_vma(start - 2 * MiB, start, "---p", "", 0),
                      _vma(start, start + MiB, "rw-p", "", 700),
                      _vma(start + MiB, ARENA + 60 * MiB, "---p", "", 0)])
    assert rss_parts(text) == {**dict.fromkeys(RSS_PARTS, 0), "anon": 700 * 1024}
    assert rss_parts("") == dict.fromkeys(RSS_PARTS, 0)


class _FakeFunction:
    """A C function as ctypes gives it: `argtypes` and `restype` set by the caller, and a
    call returning a struct `mallinfo2` by value."""

    def __init__(self, values: dict[str, int]) -> None:
        self.values = values
        self.argtypes = self.restype = None

    def __call__(self) -> _Mallinfo2:
        assert self.restype is _Mallinfo2 and self.argtypes == []
        return _Mallinfo2(**self.values)


def test_mallinfo2_is_read_field_by_field_into_the_reported_names() -> None:
    fields = [name for name, _ in _Mallinfo2._fields_]
    assert fields == ["arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                      "uordblks", "fordblks", "keepcost"]
    assert ctypes.sizeof(_Mallinfo2) == 10 * ctypes.sizeof(ctypes.c_size_t)
    values = {name: (k + 1) * 1000 + 2**33 for k, name in enumerate(fields)}  # > 32 bits
    libc = type("Libc", (), {})()
    libc.mallinfo2 = _FakeFunction(values)
    read = mallinfo_reader(libc)
    assert read() == {"malloc_arena": values["arena"], "malloc_mmap": values["hblkhd"],
                      "malloc_in_use": values["uordblks"], "malloc_free": values["fordblks"],
                      "malloc_releasable": values["keepcost"]}
    assert set(read()) == set(MALLINFO_PARTS.values())


@pytest.mark.skipif(mallinfo_reader() is None, reason="glibc >= 2.33's mallinfo2")
def test_the_struct_matches_glibcs_mallinfo2_field_for_field() -> None:
    """The layout against the real thing: glibc's older `mallinfo()` gives the same fields
    as ints, so below 2 GiB each equals mallinfo2's (the ones that hold still between the
    two calls: the arena's size, the mmap'd bytes and the count of mmap'd chunks)."""
    libc = ctypes.CDLL(None)

    class Mallinfo(ctypes.Structure):
        _fields_ = [(name, ctypes.c_int) for name, _ in _Mallinfo2._fields_]

    libc.mallinfo.restype, libc.mallinfo2.restype = Mallinfo, _Mallinfo2
    big = bytearray(64 * MiB)                     # over any mmap threshold: an mmap'd chunk
    old, new = libc.mallinfo(), libc.mallinfo2()
    del big
    for field in ("arena", "hblks", "hblkhd"):
        assert getattr(new, field) == getattr(old, field) > 0, field


def test_a_c_library_without_mallinfo2_gives_none_and_heap_parts_leaves_malloc_out(
        tmp_path) -> None:
    class Musl:
        pass                                      # no mallinfo2 attribute: AttributeError

    assert mallinfo_reader(Musl()) is None
    smaps = tmp_path / "smaps"
    smaps.write_text(SMAPS)
    got = heap_parts(str(smaps), mallinfo=None)
    assert not any(k.startswith("malloc_") for k in got)
    assert got["rss_thread_arenas"] == 9028 * 1024 and got["rss_heap"] == 1996 * 1024
    assert got["pymalloc_blocks"] > 0
    # no /proc: the interpreter's count only
    assert set(heap_parts(str(tmp_path / "absent"), mallinfo=None)) == {"pymalloc_blocks"}


@pytest.mark.skipif(platform.system() != "Linux" or mallinfo_reader() is None,
                    reason="glibc's mallinfo2 and /proc/self/smaps")
def test_this_process_parts_add_up_to_its_rss_and_a_worker_thread_gets_an_arena() -> None:
    kept: list = []
    ready, done = threading.Event(), threading.Event()

    def work() -> None:
        kept.append([bytes(4000) for _ in range(2000)])    # ~7.6 MiB from glibc, this thread's
        ready.set()
        done.wait()

    t = threading.Thread(target=work)
    t.start()
    try:
        ready.wait()
        got = heap_parts()
        with open("/proc/self/status") as f:
            rss = int(f.read().split("VmRSS:")[1].split()[0]) * 1024
    finally:
        done.set()
        t.join()
    parts = sum(got[f"rss_{p}"] for p in RSS_PARTS)
    assert abs(parts - rss) < 0.05 * rss
    assert got["rss_thread_arenas"] >= 2000 * 4000
    assert got["malloc_in_use"] >= 2000 * 4000 and got["malloc_arena"] >= got["rss_thread_arenas"]
