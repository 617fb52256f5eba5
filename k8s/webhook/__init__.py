"""The VMI admission webhook (DESIGN.md §4, W1–W6): `transport` is the aiohttp server (size
cap, content type, TLS with reload, always an answer); `admission` runs the steps of one
review against the API server; `waiter` wakes an admission when the binder's results reach
the device informer."""
