"""Production adapters to Kubernetes: informers and the cluster cache, the status writer,
the Lease loop, housekeeping, the admission webhook (`k8s.webhook`), metrics, configuration
and the controller process wiring. Client exceptions are translated here (`k8s.errors`) and
never leak inward. Imports `supervisor`, `actors`, `model`; never the harness, fakes or bench.
"""
