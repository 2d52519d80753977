"""The engine stage: one replica's step loop (`replica`: vLLM V1 scheduler semantics; its parts in
`replica_state`, `general_step`, `decode_window`, `compiled_run`, with `config`, `records`,
`shared` and `buffers`), the router over a fleet's replicas, the compiled step code
(numba, cached on disk: `compiled_bundles` the boundary's layouts and bundles; `compiled_draws`,
`compiled_budget`, `compiled_decode`, `compiled_window` the decode slots' draws, budgets, plan
and commit, and windows; `compiled_sched` the scheduler's step; `compiled_general_steps` runs of
general steps) with its background compiles and
first-run notice, the per-request / per-step metrics and the warnings on a result (`diagnostics`,
in every simulation's summary)."""
