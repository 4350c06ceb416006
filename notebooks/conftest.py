"""The test suite runs every notebook (nbmake) with the fast switch: small data, few epochs.

Kernels inherit this process' environment. Run ``CUSTOM_FIT_FAST=0 pytest notebooks`` for the
full setting whose results the README quotes.
"""

import os

os.environ.setdefault("CUSTOM_FIT_FAST", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
