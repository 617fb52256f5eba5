"""Test doubles beside the real ports: `memory_store.MemoryStore` (an in-memory cluster: view,
change feed and status writer with seeded faults) and `clock.ManualClock`. Used by the actor
tests and the core benchmark; never imported by production code and not part of the image."""
