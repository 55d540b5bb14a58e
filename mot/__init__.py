"""mot: a Mixture-of-Transformers model with an AR head (text) and a DM head (media).

`import mot` is cheap: `mot.Pipeline` (sampling from a checkpoint) is imported on first use.
"""

__all__ = ["Pipeline"]


def __getattr__(name):
  if name == "Pipeline":
    from mot.pipeline import Pipeline  # lazy: keeps `import mot` free of JAX and Flax
    return Pipeline
  raise AttributeError(f"module 'mot' has no attribute {name!r}")
