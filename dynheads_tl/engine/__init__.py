"""The engine: model loading and the fast twin, hook factories, the decoding loop and the ``Trace``."""
