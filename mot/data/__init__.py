"""Data: grain sources, task builders, packing (DESIGN §5).

Import submodules directly (`from mot.data import pipeline`); this package imports
nothing itself, so the sampler can use `builder` without loading grain or scikit-learn.
"""
