import os
import sys

# Test helpers (oracle, rows, compare) are plain modules beside the tests.
sys.path.insert(0, os.path.dirname(__file__))
