"""Pallas splash attention (TPU) with the mask rule of `mot.masks` given block by block."""
from __future__ import annotations
