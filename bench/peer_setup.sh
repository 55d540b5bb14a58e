#!/usr/bin/env bash
# The peer's own virtual environment (not a dependency of mot):
#   bash bench/peer_setup.sh [VENV]        # default /tmp/peer
#   /tmp/peer/bin/python bench/peer_transfusion.py
# torch is pinned to 2.13.0, whose CPU build is the one served here: an unpinned `torch`
# would pull a CUDA build. transfusion-pytorch 0.20.0 is the version shared/STACK.md measured.
set -euo pipefail
VENV="${1:-/tmp/peer}"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q "torch==2.13.0" "transfusion-pytorch==0.20.0"
"$VENV/bin/python" -c "import torch, transfusion_pytorch; print('peer ready:', torch.__version__)"
