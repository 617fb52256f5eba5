"""Builders and helpers shared by test modules: each module is named for what it builds
(`binder`: a running Binder on a MemoryStore and the §7 invariant checks; `world`: model
values; ...). Test modules import from here and from `tests.timing`, never from one another.
No tests here (no `test_` prefix)."""
