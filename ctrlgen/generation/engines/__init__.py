"""Generation engines behind :class:`~ctrlgen.generation.types.GenerationEngine`: ``hf`` (the reference,
transformers' ``generate``) and ``fast`` (continuous batching in pure torch). Build them with
:func:`ctrlgen.generation.factory.build_engine`."""
