"""This checkout's package and test helpers first on the path: a benchmark measures the code beside
it.

Imported by every script here before anything of feedbench (`import _checkout`; the script's own
folder is on the path when it runs). Without it a script run without PYTHONPATH=workflow would
import the venv's feedbench, which may be another clone's (an editable install of another checkout),
and measure that.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "workflow"), os.path.join(ROOT, "tests")]
