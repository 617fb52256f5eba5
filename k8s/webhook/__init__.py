"""The VMI admission webhook (docs/contract.md §4, W1–W6), split by job as controller-runtime's
`pkg/webhook/admission`: `transport` is the aiohttp server (size cap, content type, TLS with
reload, always an answer, response constructors that set the uid); `review` the pure decoder
of an AdmissionReview into a typed review or a typed denial, and the one table from a
denial's category to the status a tenant sees; `steps` one function per step on the API
(W1's live read, W3 (1)–(4), W4's take-over, W5's clean-up); `admission` the orchestration
of one review; `waiter` wakes an admission when the binder's results reach the informer."""
