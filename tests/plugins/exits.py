"""Test plugin: ends the process on import, as a script's ``if __name__`` guard gone wrong would."""
import sys

sys.exit(0)
