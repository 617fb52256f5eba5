"""The supervision tree: child specs, one-for-one restarts with intensity limits, and the
routing of node changes and complete bind requests to the binder's actors (DESIGN.md §6).
No placement logic lives here. Imports: `actors`, `model`.
"""
