"""The ``elastic-ray`` command line.

``main`` is the entry point and the ``demo`` command; ``session`` holds the
``elastic-ray session ...`` commands (thin shells around the coordinator);
``options`` turns option values into a validated config; ``status_model``
and ``status_view`` build and render what ``session status`` shows, both
pure.
"""

from .main import main

__all__ = ["main"]
