"""The offline profile builders (`dsim profile ...`): GPU-op cost tables (`kernel_tables`, priced
from AIConfigurator's silicon tables in `aic_tables` and its DeepEP tables in `deepep_tables`), MoE
architectures (`models`), the composer of a MoE step-cost profile from ops (`compose`, assembling
`topology`, `kernel_ops`, `pricer`, `forward`, `overlap`, `request_attention`, `executor_terms`, `prefill`
and `drafters`; the command in `compose_cli`), analytical roofline profiles (`analytical`) and a profile
for one's own model (`own_model`)."""
