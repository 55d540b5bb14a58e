"""Data: grain sources, task builders, packing (docs/design.md §5).

Import submodules directly (`from mot.data import input_pipeline`); this package imports
nothing itself, so the sampler can use `builder` without loading grain or scikit-learn.
"""
