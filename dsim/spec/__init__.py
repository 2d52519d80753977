"""Speculative decoding: the methods (`methods`), their acceptance model (`acceptance`), the
confidence heads (`heads`, fitted and scored by `head_fit`), what an engine replica uses
(`runtime`), the verify-budget policies (`budget`) and which methods a model can run
(`capability`)."""
