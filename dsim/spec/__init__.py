"""Speculative decoding: the methods with their acceptance model and confidence head (`methods`),
the verify-budget policies (`budget`) and which methods a model can run (`capability`)."""
