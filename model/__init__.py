"""Pure placement, budget and capacity logic for gpu-binder (docs/contract.md §2, §3).

Frozen value types, parsers from Kubernetes objects, the `Snapshot` of the cluster as the
binder sees it, `Snapshot.check_order` (W1) and `decide` (B1–B6), and the typed reasons
they refuse with (`model.reasons`: a code, its category and data; the wording rendered
once). No I/O, no anyio, no Kubernetes client and no wall clock: time comes in as an argument.
"""
