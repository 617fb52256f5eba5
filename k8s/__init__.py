"""Adapters to Kubernetes: the local control plane, informers, the status writer, the Lease
loop, housekeeping, the admission webhook and the process wiring (the `gpu-binder` CLI).
Client exceptions are translated here and never leak inward. Imports everything inward.
"""
