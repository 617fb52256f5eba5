"""The actor runtime and the binder's actors: NodeActor, Coordinator and its StatusPipeline
(docs/contract.md §6).

Actors are anyio tasks with bounded mailboxes; they depend on small Protocols (ports) for
the cluster view and the status writer, never on a Kubernetes client. Imports: `model` only.
"""
