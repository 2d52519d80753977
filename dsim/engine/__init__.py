"""The engine stage: one replica's step loop (`replica`: vLLM V1 scheduler semantics; its parts in
`replica_state`, `general_step`, `decode_window`, `compiled_run`, with `config`, `records`,
`shared` and `buffers`), the router over a fleet's replicas, the compiled step code
(`compiled_sched`, `compiled_step`: numba, cached on disk) with its background compiles and
first-run notice, the per-request / per-step metrics and the warnings on a result (`diagnostics`,
in every simulation's summary)."""
